package expr

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"cel.dev/cel-go/common/cost"
	"cel.dev/cel-go/common/functions"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/common/types/traits"
	"cel.dev/cel-go/interpreter"
)

// CEL charges the cost of a function call after the call has returned. For
// most functions that is fine: their work is linear in the size of their
// arguments, which guard bounds. A few functions do work out of proportion
// to their arguments (indexOf compares every position with every other, a
// replace can multiply a string's length by another's), so a single call
// could run for minutes or exhaust memory before being charged. For those,
// prechecked calls compute the charge from the arguments first and stop
// the evaluation if it would exceed the cost limit or build a string over
// the size limit.

// maxStringBytes is the longest string an expression may build.
const maxStringBytes = maxValueSize

// prechecked lists the functions whose calls are checked before they run.
// The value, when not nil, checks the arguments further: errResultTooLarge
// stops the evaluation, another error is the call's result.
var prechecked = map[string]func(args []ref.Val) error{
	// Quadratic in their arguments; CEL's cost models price them from the
	// arguments alone, so the charge can be computed before the call.
	"indexOf":         nil,
	"lastIndexOf":     nil,
	"matches":         regexSize,
	"distinct":        nil,
	"hasAll":          nil,
	"hasAny":          nil,
	"hasOnly":         nil,
	"hasExactly":      nil,
	"sets.contains":   nil,
	"sets.equivalent": nil,
	"sets.intersects": nil,
	// The result can be far longer than the arguments.
	"replace": func(args []ref.Val) error { return checkLen(replacedLen(args)) },
	"join":    func(args []ref.Val) error { return checkLen(joinedLen(args)) },
}

var errResultTooLarge = errors.New("result too large")

func checkLen(n int, ok bool) error {
	if ok && n > maxStringBytes {
		return errResultTooLarge
	}
	return nil
}

// regexSize applies the regex program size limit to patterns computed at
// run time (the guard hides calls from cel-go's own check).
func regexSize(args []ref.Val) error {
	if len(args) < 2 {
		return nil
	}
	pattern, ok := args[1].(types.String)
	if !ok {
		return nil
	}
	sz, err := types.RegexProgramSize(string(pattern))
	if err != nil {
		return err
	}
	if sz > maxRegexProgram {
		return fmt.Errorf("regex program size %d exceeds limit of %d", sz, maxRegexProgram)
	}
	return nil
}

// precheckedCall replaces the plan of a call to a prechecked function: it
// evaluates the arguments, checks the call's cost and result size, then
// calls the function and charges its cost as evalVarArgs would.
type precheckedCall struct {
	id       int64
	function string
	overload string
	args     []interpreter.InterpretableV2
	impl     *functions.Overload
	check    func(args []ref.Val) error
}

var _ interpreter.InterpretableCall = (*precheckedCall)(nil)

func (c *precheckedCall) ID() int64                           { return c.id }
func (c *precheckedCall) Function() string                    { return c.function }
func (c *precheckedCall) OverloadID() string                  { return c.overload }
func (c *precheckedCall) Args() []interpreter.InterpretableV2 { return c.args }

func (c *precheckedCall) Eval(a interpreter.Activation) ref.Val {
	return interpreter.EvalActivation(a, c.Exec)
}

func (c *precheckedCall) Exec(frame *interpreter.ExecutionFrame) ref.Val {
	args := make([]ref.Val, len(c.args))
	for i, a := range c.args {
		v := a.Exec(frame)
		if types.IsUnknownOrError(v) {
			return v
		}
		args[i] = v
	}
	if c.check != nil {
		if err := c.check(args); errors.Is(err, errResultTooLarge) {
			panic(errValueTooLarge)
		} else if err != nil {
			return types.WrapErr(err)
		}
	}
	tracker := frame.CostTracker()
	if tracker != nil && tracker.Limit != nil {
		pre := tracker.CostCall(c, args, types.NullValue)
		if cost.SafeAdd(tracker.ActualCost(), pre) > *tracker.Limit {
			panic(interpreter.EvalCancelledError{
				Cause:   interpreter.CostLimitExceeded,
				Message: fmt.Sprintf("operation cancelled: %s would exceed the cost limit", c.function),
			})
		}
	}
	res := c.invoke(args)
	if tracker != nil {
		tracker.EvalVarArgs(frame, c.id, c, args, res)
	}
	return res
}

func (c *precheckedCall) invoke(args []ref.Val) ref.Val {
	switch {
	case len(args) == 1 && c.impl.Unary != nil:
		return c.impl.Unary(args[0])
	case len(args) == 2 && c.impl.Binary != nil:
		return c.impl.Binary(args[0], args[1])
	case c.impl.Function != nil:
		return c.impl.Function(args...)
	}
	return types.NewErr("no such overload: %s", c.function)
}

// replacedLen projects the length of s.replace(old, new[, n]).
func replacedLen(args []ref.Val) (int, bool) {
	if len(args) < 3 {
		return 0, false
	}
	s, ok1 := args[0].(types.String)
	old, ok2 := args[1].(types.String)
	repl, ok3 := args[2].(types.String)
	if !ok1 || !ok2 || !ok3 {
		return 0, false
	}
	var count int
	if old == "" {
		count = utf8.RuneCountInString(string(s)) + 1
	} else {
		count = strings.Count(string(s), string(old))
	}
	if len(args) > 3 {
		if n, ok := args[3].(types.Int); ok && n >= 0 && int64(n) < int64(count) {
			count = int(n)
		}
	}
	grow := len(repl) - len(old)
	if grow <= 0 {
		return len(s), true
	}
	if count > (maxStringBytes-len(s))/grow {
		return maxStringBytes + 1, true
	}
	return len(s) + count*grow, true
}

// joinedLen projects the length of list.join([sep]).
func joinedLen(args []ref.Val) (int, bool) {
	l, ok := args[0].(traits.Lister)
	if !ok {
		return 0, false
	}
	n, ok := l.Size().(types.Int)
	if !ok {
		return 0, false
	}
	total := 0
	if len(args) > 1 {
		sep, ok := args[1].(types.String)
		if !ok {
			return 0, false
		}
		if n > 1 && len(sep) > 0 {
			if int64(n-1) > int64(maxStringBytes/len(sep)) {
				return maxStringBytes + 1, true
			}
			total = int(n-1) * len(sep)
		}
	}
	for i := types.Int(0); i < n; i++ {
		if s, ok := l.Get(i).(types.String); ok {
			total += len(s)
			if total > maxStringBytes {
				return total, true
			}
		}
	}
	return total, true
}

// dynCost prices calls that CEL's cost models cannot: with dyn arguments
// the checker often leaves several overloads possible (`x in input.list`
// may be in_list or in_map), the planner dispatches by function name at
// run time, and CEL then charges such a call 1 whatever the work. dynCost
// charges those calls one unit per ten string bytes or aggregate elements
// of their arguments and result, CEL's own rate for string traversal. Calls
// with a resolved overload are left to CEL's models.
type dynCost struct{}

// freeFuncs run in constant time whatever the size of their arguments.
var freeFuncs = map[string]bool{"size": true, "dyn": true, "type": true}

func (dynCost) CallCost(function, overloadID string, args []ref.Val, result ref.Val) *uint64 {
	if overloadID != "" || freeFuncs[function] {
		return nil
	}
	total := uint64(0)
	for _, a := range args {
		total += valueSize(a)
	}
	total += valueSize(result)
	c := 1 + total/10
	return &c
}

// valueSize is the size of v for dynCost: bytes of a string, aggregate
// elements of a list or map (memoized on the value), 1 otherwise.
func valueSize(v ref.Val) uint64 {
	switch x := v.(type) {
	case nil:
		return 0
	case types.String:
		return uint64(len(x))
	case types.Bytes:
		return uint64(len(x))
	case traits.MutableLister, traits.MutableMapper:
		if s, ok := v.(traits.Sizer).Size().(types.Int); ok {
			return uint64(s)
		}
	case traits.Lister, traits.Mapper:
		return uint64(sizeCalc.ApproximateAggregateSize(v).Size)
	}
	return 1
}
