package expr

import (
	"fmt"

	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/common/types/traits"
	"cel.dev/cel-go/interpreter"
)

// maxValueSize bounds every list, map or string an expression computes, in
// units of a types.SizeCalculator: one per list, map, map key or value and
// scalar, and one per byte of a string.
//
// The CEL cost of a call is charged after the call has run, from the sizes
// of its arguments. Values can share structure ([x, x] holds x twice but
// costs one step to build), so ten nested `[x, x]` hold a thousand copies
// of x, and forty hold a trillion; a single comparison of such a value
// would run for hours before its cost could be charged. guard stops any
// value from growing past maxValueSize as it is built, which keeps every
// single call on bounded arguments.
const maxValueSize = 4_000_000

// sizeCalcOptions configure sizeCalc and the cost tracker's sizing alike
// (string unit 1 is what cost.AggregateSizingStrategy pins).
var sizeCalcOptions = []types.SizeCalculatorOption{
	types.SizeCalculatorMaxDepth(maxDepth),
	types.SizeCalculatorMaxTraversal(2 * maxValueSize),
	types.SizeCalculatorStringUnitLength(1),
}

var sizeCalc = types.NewSizeCalculator(sizeCalcOptions...)

// errValueTooLarge is how a guard stops an evaluation; Program.Eval recovers
// it into an error.
var errValueTooLarge = interpreter.EvalCancelledError{
	Cause:   interpreter.MemoryLimitExceeded,
	Message: fmt.Sprintf("a computed value exceeded the size limit of %d", maxValueSize),
}

// guardDecorator wraps every node of a program that produces new values
// (calls, list and map literals, comprehensions) with a size check.
// Attributes and constants are left alone: they only hand out values that
// exist already (and the planner relies on their types).
func guardDecorator(i interpreter.InterpretableV2) (interpreter.InterpretableV2, error) {
	switch i.(type) {
	case interpreter.InterpretableAttribute, interpreter.InterpretableConst:
		return i, nil
	}
	return guard{i}, nil
}

type guard struct{ interpreter.InterpretableV2 }

func (g guard) Exec(f *interpreter.ExecutionFrame) ref.Val {
	v := checkSize(g.InterpretableV2.Exec(f))
	// The guard hides comprehensions from CEL's interrupt checks, so it
	// checks instead (every interruptEvery nodes, cheaply in between).
	if f.CheckInterrupt() {
		panic(interpreter.EvalCancelledError{Cause: interpreter.ContextCancelled, Message: "operation interrupted"})
	}
	return v
}

func (g guard) Eval(a interpreter.Activation) ref.Val {
	return interpreter.EvalActivation(a, g.Exec)
}

// checkSize panics with errValueTooLarge when v is too large. Sizes of
// immutable lists and maps are memoized on the value, so checking a value
// built from checked parts costs in proportion to its new elements only.
// Mutable lists and maps are comprehension accumulators still being built:
// they are checked once complete.
func checkSize(v ref.Val) ref.Val {
	switch x := v.(type) {
	case types.String:
		if len(x) > maxValueSize {
			panic(errValueTooLarge)
		}
	case types.Bytes:
		if len(x) > maxValueSize {
			panic(errValueTooLarge)
		}
	case traits.MutableLister, traits.MutableMapper:
	case traits.Lister, traits.Mapper:
		sz := sizeCalc.ApproximateAggregateSize(v)
		if sz.LimitExceeded || sz.Size > maxValueSize {
			panic(errValueTooLarge)
		}
	}
	return v
}
