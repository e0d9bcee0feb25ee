// Package expr implements the ${{ … }} expression templates of workflow
// definitions. Expressions are written in CEL, the Common Expression
// Language (https://cel.dev), evaluated with cel-go.
//
// # Templates
//
// A template is a JSON-like value (what encoding/json decodes into an any:
// nil, bool, float64 or json.Number, string, []any, map[string]any; YAML's
// map[any]any with string keys and Go integer types are accepted too) in
// which strings may hold expressions:
//
//   - A string that is exactly one expression, "${{ input.url }}", takes the
//     expression's value and type: a number stays a number, a list a list, an
//     object an object. Whitespace inside the braces is ignored; any other
//     character outside them (a space included) makes the string an
//     interpolation instead.
//   - Expressions inside a longer string are interpolated:
//     "img-${{ index }}.png" renders as "img-3.png". Strings are inserted
//     as they are, null as the empty string, booleans and numbers in their
//     JSON form (3, not 3.0), lists and objects as compact JSON.
//   - A string without "${{" is a constant, and so is any number, boolean or
//     null. Object keys are never templates, only values are.
//
// An expression ends at the first "}}" outside a CEL string literal and
// outside braces it opened, so "${{ {'a': {'b': 1}} }}" and "${{ '}}' }}"
// work. There is no escape for a literal "${{" in text: write it as an
// expression, "${{ '${{' }}".
//
// CompileString compiles fields that hold a single expression (a step's
// `if:`): a string containing "${{" is a template as above, any other
// string is one whole expression, `input.n > 1`.
//
// # Variables
//
//   - input: the run's input, decoded JSON (dyn).
//   - steps: each step named in Scope.Steps as {"output": <its output>}:
//     steps.fetch.output, or steps["fetch-data"].output for names that are
//     not identifiers. The output of a step that has none (skipped, not run)
//     is null. Naming a step that is not in the scope, or a field of a step
//     other than output, is a compile error.
//   - run: {"id": <run id>, "workflow": <workflow name>}.
//   - item and index: the current element of a fan-out step's with_items
//     and its position (int); only where Scope.Item is true.
//
// The CEL standard library is available (size, matches, startsWith, has,
// map, filter, exists, all, timestamps and durations, …) with these
// cel-go extensions: strings (split, join, replace, lowerAscii, format, …),
// math (math.greatest, math.round, …), lists (lists.range, slice, flatten,
// sort, sortBy, distinct, …), sets (sets.contains, …), base64 (base64.encode,
// base64.decode), bindings (cel.bind) and optional values (x.?y,
// optional.of). Nothing reads the clock or reaches the network. The json and
// yaml encoders are left out: cel-go prices them as unboundedly costly, so
// every call would fail the cost limit; interpolating a list or object
// already yields its JSON.
//
// # Numbers
//
// JSON has one number type, CEL has int and double, and CEL does not mix
// them in arithmetic (1 + 1.5 is an error). Every JSON number that is a whole
// number within int64 range is an int in expressions, other numbers are
// doubles: with input {"n": 2}, ${{ input.n + 1 }} is 3. Use double(x) to
// compute with a whole number as a double. Comparisons across int and double
// (input.price > 1.5) work whatever the types. Constants in templates are
// normalized the same way, so Render returns int64 for integers and float64
// for other numbers. A CEL double that happens to be whole stays a float64.
//
// # Results
//
// Render turns CEL values back into JSON-like Go values: null → nil, bool,
// int and uint → int64 (a uint above MaxInt64 is an error), double →
// float64 (NaN and ±Inf are errors), string, bytes → base64 (standard
// encoding), timestamp → RFC 3339 string in UTC, duration → seconds string
// such as "3600s", list → []any, map → map[string]any (a key that is not a
// string is an error), an empty optional → nil. The Kind a template was
// compiled for is checked on the result: at compile time where the CEL type
// is known (dyn passes), and always at render time.
//
// # Cost limits
//
// Expressions are written by workflow authors and run inside the server, so
// every evaluation is bounded:
//
//   - CostLimit (one million CEL cost units) per expression evaluation;
//     mapping over ten thousand elements costs about 150,000.
//   - Calls whose overload is only known at run time (most functions of a dyn
//     value, `x in input.list` for one) are charged one unit per ten bytes or
//     elements of their arguments and result, where cel-go would charge 1.
//   - Functions whose work is out of proportion to their arguments (indexOf,
//     distinct, sets.*, hasAll, matches, …) are charged before they run, not
//     after, and replace and join are refused before they build a string
//     over the size limit. Regular expressions computed at run time are held
//     to the same program size limit as constant ones.
//   - Every list, map or string an expression builds may hold at most four
//     million units (one per element, map entry part or string byte), checked
//     as it is built: values can share structure, and forty nested [x, x]
//     would otherwise be a value of a trillion elements built in forty steps.
//   - A wall-clock limit per evaluation backs all this up.
//
// Exceeding any of these is an *Error whose Msg starts "expression too
// costly". Separately, a rendered template may be at most MaxOutputSize
// bytes of JSON, or Render fails with a "too large" *Error. Static cost
// estimates are not used at compile time: with dyn inputs they are
// unbounded for any comprehension.
package expr
