package definition

import (
	"fmt"
	"sort"
	"strings"
)

// Error is one problem in a definition.
type Error struct {
	// Path names the field, as a JSON path from the top of the definition
	// ("steps[2].concurrency", "steps[0].input.url"); empty for the
	// document as a whole (a syntax error, say).
	Path string
	// Line is the 1-based line of the field in the uploaded text; 0 when
	// unknown (FromJSON).
	Line int
	Msg  string
}

// Error returns "PATH: MSG (line N)", leaving out what is unknown.
func (e *Error) Error() string {
	var b strings.Builder
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	if e.Line > 0 {
		fmt.Fprintf(&b, " (line %d)", e.Line)
	}
	return b.String()
}

// Errors is what Parse and FromJSON return when a definition is invalid:
// every problem found, in line order, up to MaxErrors of them.
type Errors struct {
	List []*Error
	// Omitted counts the problems found beyond MaxErrors.
	Omitted int
}

// Error returns one problem per line.
func (e *Errors) Error() string {
	lines := make([]string, 0, len(e.List)+1)
	for _, x := range e.List {
		lines = append(lines, x.Error())
	}
	if e.Omitted > 0 {
		lines = append(lines, fmt.Sprintf("(and %d more)", e.Omitted))
	}
	return strings.Join(lines, "\n")
}

// Unwrap returns the listed problems, for errors.As.
func (e *Errors) Unwrap() []error {
	out := make([]error, len(e.List))
	for i, x := range e.List {
		out[i] = x
	}
	return out
}

// maxCollected bounds the problems kept before sorting, so that a huge
// broken definition costs bounded memory.
const maxCollected = 1000

// collector gathers problems.
type collector struct {
	list  []*Error
	extra int // found beyond maxCollected
	lines bool
}

func (c *collector) add(path string, line int, format string, args ...any) {
	if len(c.list) >= maxCollected {
		c.extra++
		return
	}
	if !c.lines {
		line = 0
	}
	msg := format
	if len(args) > 0 {
		msg = fmt.Sprintf(format, args...)
	}
	c.list = append(c.list, &Error{Path: path, Line: line, Msg: msg})
}

func (c *collector) any() bool { return len(c.list) > 0 }

// result returns nil or an *Errors holding the first MaxErrors problems in
// line order (problems without a line keep their order, after the others).
func (c *collector) result() error {
	if len(c.list) == 0 {
		return nil
	}
	sort.SliceStable(c.list, func(i, j int) bool {
		a, b := c.list[i].Line, c.list[j].Line
		if a == 0 || b == 0 {
			return a != 0 && b == 0
		}
		return a < b
	})
	e := &Errors{List: c.list, Omitted: c.extra}
	if len(e.List) > MaxErrors {
		e.Omitted += len(e.List) - MaxErrors
		e.List = e.List[:MaxErrors]
	}
	return e
}
