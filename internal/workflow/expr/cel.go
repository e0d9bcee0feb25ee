package expr

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/cost"
	"cel.dev/cel-go/common/functions"
	"cel.dev/cel-go/common/operators"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/ext"
	"cel.dev/cel-go/interpreter"
)

const (
	// maxExprLen bounds the source length of one expression (in code points).
	maxExprLen = 10_000
	// maxRegexProgram bounds the compiled size of a regular expression.
	maxRegexProgram = 2_000
	// interruptEvery is how many guarded nodes run between checks of the
	// evaluation's deadline.
	interruptEvery = 100
)

// evalTimeout is a wall-clock safety net behind the cost limits (a
// variable for tests).
var evalTimeout = 5 * time.Second

var (
	envPlain = sync.OnceValues(func() (*environ, error) { return newEnv(false) })
	envItem  = sync.OnceValues(func() (*environ, error) { return newEnv(true) })
)

// environ is a CEL environment with what programs planned in it need.
type environ struct {
	env *cel.Env
	// impls holds the bindings of the prechecked functions by overload id
	// and by function name (dynamic dispatch), as the planner finds them.
	impls map[string]*functions.Overload
}

// environment returns the shared CEL environment; building one takes
// milliseconds, so there is one per value of Scope.Item.
func environment(item bool) (*environ, error) {
	if item {
		return envItem()
	}
	return envPlain()
}

func newEnv(item bool) (*environ, error) {
	opts := []cel.EnvOption{
		cel.Variable("input", cel.DynType),
		cel.Variable("steps", cel.MapType(cel.StringType, cel.MapType(cel.StringType, cel.DynType))),
		cel.Variable("run", cel.MapType(cel.StringType, cel.DynType)),
		cel.OptionalTypes(),
		cel.CrossTypeNumericComparisons(true),
		cel.ParserExpressionSizeLimit(maxExprLen),
		cel.RegexProgramSizeLimit(maxRegexProgram),
		// Size values recursively for the cost of equality, membership and
		// the like, so that structures sharing parts ([x, x] nested n
		// times) are costed by their full size. The options must be those
		// of sizeCalc: values memoize their size from the first sizing.
		cel.CostSizingStrategy(cost.AggregateSizingStrategy(sizeCalcOptions...)),
		ext.Strings(),
		ext.Math(),
		ext.Lists(),
		ext.Sets(),
		ext.Encoders(ext.EncodersVersion(0)), // base64 only: json/yaml encoding is uncosted
		ext.Bindings(),
	}
	if item {
		opts = append(opts,
			cel.Variable("item", cel.DynType),
			cel.Variable("index", cel.IntType),
		)
	}
	env, err := cel.NewEnv(opts...)
	if err != nil {
		return nil, err
	}
	e := &environ{env: env, impls: map[string]*functions.Overload{}}
	for name, fn := range env.Functions() {
		if _, ok := prechecked[name]; !ok {
			continue
		}
		bindings, err := fn.Bindings()
		if err != nil {
			return nil, err
		}
		for _, b := range bindings {
			e.impls[b.Operator] = b
		}
	}
	return e, nil
}

// decorate adapts the plan of each expression node: calls to prechecked
// functions are replaced by precheckedCall, and every node producing new
// values is wrapped in a guard.
func (e *environ) decorate(i interpreter.InterpretableV2) (interpreter.InterpretableV2, error) {
	if call, ok := i.(interpreter.InterpretableCall); ok {
		if check, ok := prechecked[call.Function()]; ok {
			impl := e.impls[call.OverloadID()]
			if impl == nil {
				impl = e.impls[call.Function()]
			}
			if impl != nil && impl.Async == nil && !impl.LateBound && !impl.NonStrict {
				i = &precheckedCall{
					id:       call.ID(),
					function: call.Function(),
					overload: call.OverloadID(),
					args:     call.Args(),
					impl:     impl,
					check:    check,
				}
			}
		}
	}
	return guardDecorator(i)
}

// program is one compiled expression.
type program struct {
	text string // the expression source, trimmed
	prg  cel.Program
	typ  *cel.Type // the checked result type
}

// expression parses, checks and plans one expression found at path.
func (c *compiler) expression(src, path string) (*program, error) {
	text := strings.TrimSpace(src)
	if text == "" {
		return nil, &Error{Path: path, Msg: "empty expression"}
	}
	parsed, iss := c.env.env.Parse(text)
	if iss.Err() != nil {
		return nil, &Error{Path: path, Msg: issuesMsg("syntax error in", text, iss)}
	}
	if msg := c.checkRefs(parsed.NativeRep().Expr(), nil); msg != "" {
		return nil, &Error{Path: path, Msg: msg}
	}
	checked, iss := c.env.env.Check(parsed)
	if iss.Err() != nil {
		return nil, &Error{Path: path, Msg: issuesMsg("invalid expression", text, iss)}
	}
	prg, err := c.env.env.Program(checked,
		cel.CostLimit(CostLimit),
		cel.CostTracking(dynCost{}),
		cel.InterruptCheckFrequency(interruptEvery),
		cel.CustomDecoratorV2(c.env.decorate),
	)
	if err != nil {
		return nil, &Error{Path: path, Msg: fmt.Sprintf("invalid expression %s: %s", quoteExpr(text), oneLine(err.Error()))}
	}
	return &program{text: text, prg: prg, typ: checked.OutputType()}, nil
}

// eval runs the program. Errors are one line and name the expression.
func (p *program) eval(act cel.Activation) (ref.Val, error) {
	ctx, cancel := context.WithTimeout(context.Background(), evalTimeout)
	defer cancel()
	val, _, err := p.prg.ContextEval(ctx, act)
	if err == nil {
		return val, nil
	}
	var cancelled interpreter.EvalCancelledError
	switch {
	case errors.As(err, &cancelled) && cancelled.Cause == interpreter.CostLimitExceeded:
		return nil, fmt.Errorf("expression too costly: %s exceeded the cost limit of %d", quoteExpr(p.text), CostLimit)
	case errors.As(err, &cancelled) && cancelled.Cause == interpreter.MemoryLimitExceeded:
		return nil, fmt.Errorf("expression too costly: %s built a value over the size limit (%d elements or string bytes)", quoteExpr(p.text), maxValueSize)
	case errors.As(err, &cancelled), errors.Is(err, interpreter.InterruptError{}):
		return nil, fmt.Errorf("expression too costly: %s ran longer than %s", quoteExpr(p.text), evalTimeout)
	}
	return nil, fmt.Errorf("evaluating %s: %s", quoteExpr(p.text), oneLine(err.Error()))
}

// issuesMsg formats CEL parse or check issues on one line.
func issuesMsg(what, text string, iss *cel.Issues) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: ", what, quoteExpr(text))
	errs := iss.Errors()
	for i, e := range errs {
		if i == 3 {
			fmt.Fprintf(&b, "; and %d more", len(errs)-i)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		msg := strings.TrimPrefix(e.Message, "Syntax error: ")
		b.WriteString(oneLine(msg))
		if loc := e.Location; loc != nil && loc.Line() > 0 {
			if loc.Line() > 1 {
				fmt.Fprintf(&b, " (line %d, column %d)", loc.Line(), loc.Column()+1)
			} else {
				fmt.Fprintf(&b, " (column %d)", loc.Column()+1)
			}
		}
	}
	return b.String()
}

// checkRefs walks a parsed expression for references the type checker
// cannot judge or would judge unhelpfully: unknown steps, fields of a step
// other than output, unknown run fields, and item/index outside a fan-out
// step. shadow holds comprehension variables hiding the globals. It returns
// "" when all is well.
func (c *compiler) checkRefs(e ast.Expr, shadow map[string]bool) string {
	global := func(e ast.Expr, name string) bool {
		return e.Kind() == ast.IdentKind && e.AsIdent() == name && !shadow[name]
	}
	if operand, field, ok := access(e); ok {
		switch {
		case global(operand, "steps"):
			if !c.steps[field] {
				return fmt.Sprintf("unknown step %q", field)
			}
		case global(operand, "run"):
			if field != "id" && field != "workflow" {
				return fmt.Sprintf("run has no field %q (there are run.id and run.workflow)", field)
			}
		default:
			if inner, step, ok := access(operand); ok && global(inner, "steps") && field != "output" {
				return fmt.Sprintf("step %q has no field %q (use %s.output)", step, field, stepRef(step))
			}
		}
	}
	switch e.Kind() {
	case ast.IdentKind:
		name := e.AsIdent()
		if (name == "item" || name == "index") && !c.scope.Item && !shadow[name] {
			return name + " is only available in a step with with_items"
		}
	case ast.SelectKind:
		return c.checkRefs(e.AsSelect().Operand(), shadow)
	case ast.CallKind:
		call := e.AsCall()
		if call.IsMemberFunction() {
			if msg := c.checkRefs(call.Target(), shadow); msg != "" {
				return msg
			}
		}
		for _, a := range call.Args() {
			if msg := c.checkRefs(a, shadow); msg != "" {
				return msg
			}
		}
	case ast.ListKind:
		for _, el := range e.AsList().Elements() {
			if msg := c.checkRefs(el, shadow); msg != "" {
				return msg
			}
		}
	case ast.MapKind:
		for _, en := range e.AsMap().Entries() {
			me := en.AsMapEntry()
			if msg := c.checkRefs(me.Key(), shadow); msg != "" {
				return msg
			}
			if msg := c.checkRefs(me.Value(), shadow); msg != "" {
				return msg
			}
		}
	case ast.StructKind:
		for _, f := range e.AsStruct().Fields() {
			if msg := c.checkRefs(f.AsStructField().Value(), shadow); msg != "" {
				return msg
			}
		}
	case ast.ComprehensionKind:
		comp := e.AsComprehension()
		if msg := c.checkRefs(comp.IterRange(), shadow); msg != "" {
			return msg
		}
		if msg := c.checkRefs(comp.AccuInit(), shadow); msg != "" {
			return msg
		}
		inner := make(map[string]bool, len(shadow)+3)
		for k := range shadow {
			inner[k] = true
		}
		inner[comp.IterVar()] = true
		if comp.HasIterVar2() {
			inner[comp.IterVar2()] = true
		}
		inner[comp.AccuVar()] = true
		for _, sub := range []ast.Expr{comp.LoopCondition(), comp.LoopStep(), comp.Result()} {
			if msg := c.checkRefs(sub, inner); msg != "" {
				return msg
			}
		}
	}
	return ""
}

// access recognizes a field access with a constant name: x.f, x["f"],
// x.?f and x[?"f"].
func access(e ast.Expr) (operand ast.Expr, field string, ok bool) {
	switch e.Kind() {
	case ast.SelectKind:
		sel := e.AsSelect()
		return sel.Operand(), sel.FieldName(), true
	case ast.CallKind:
		call := e.AsCall()
		switch call.FunctionName() {
		case operators.Index, operators.OptIndex, operators.OptSelect:
		default:
			return nil, "", false
		}
		args := call.Args()
		if call.IsMemberFunction() || len(args) != 2 || args[1].Kind() != ast.LiteralKind {
			return nil, "", false
		}
		s, isString := args[1].AsLiteral().(types.String)
		if !isString {
			return nil, "", false
		}
		return args[0], string(s), true
	}
	return nil, "", false
}

// stepRef writes how an expression refers to a step.
func stepRef(name string) string {
	if isIdent(name) {
		return "steps." + name
	}
	return fmt.Sprintf("steps[%q]", name)
}

// quoteExpr quotes an expression for a message, shortened when long.
func quoteExpr(text string) string {
	return fmt.Sprintf("%q", shorten(text))
}

// shorten cuts s to at most 80 bytes (on a rune boundary), marking the cut.
func shorten(s string) string {
	const max = 80
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !isRuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }

// oneLine collapses all whitespace runs (newlines included) to one space.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
