// Package definition reads workflow definitions: it decodes the YAML or
// JSON a user uploads, checks it completely, compiles every ${{ }}
// expression (package expr) and hands the engine a Workflow.
//
// # Reading
//
// Both formats are read into one tree of JSON values that remember their
// line (YAML through go.yaml.in/yaml/v3's Node API, JSON through
// encoding/json's tokenizer, because the YAML parser rejects some valid
// JSON such as surrogate-pair escapes). Only JSON's data model gets
// through: YAML timestamps, binary, NaN and infinities, non-string keys,
// custom tags and merge keys (<<) are errors, and so are aliases (*name),
// which also rules out "billion laughs" expansion; anchors alone are
// ignored. Integers beyond ±2^53 are errors because a float64 cannot hold
// them exactly. A definition is at most MaxSize bytes, nests at most
// MaxDepth levels and holds at most MaxSteps steps, MaxSchedules schedules
// and MaxExpressions expressions. A null, an absent field and (for string
// fields) an empty string mean the same.
//
// # Checking
//
// Every problem becomes an *Error with the field's path
// ("steps[2].concurrency") and line; Parse returns all of them (up to
// MaxErrors) as an *Errors, sorted by line. Unknown fields are errors,
// with a "did you mean" for a near miss. The rules that span fields:
//
//   - Step names are unique. If no step declares needs, the steps run in
//     the listed order (each needs the one before it: Workflow.Sequential).
//     If any step declares needs (even needs: []), the definition is a DAG
//     and each step needs exactly what it lists; a step without needs is a
//     root. needs: NAME is short for needs: [NAME]. Needs naming an unknown
//     step, the step itself or a step twice, and cycles, are errors.
//   - A step's expressions may read steps.X only for the steps X it needs,
//     directly or not (in a sequential definition, every earlier step).
//     item and index exist in a with_items step's input, queue,
//     concurrency_key, priority, max_attempts, timeout and
//     dispatch_deadline, not in with_items or if. The top-level output may
//     read every step; the workflow's concurrency.key only input and run.
//   - Each field's expression must have the right type: with_items a list,
//     if a bool, queue and concurrency_key strings, priority and
//     max_attempts ints, timeout and dispatch_deadline duration strings
//     (ParseDuration). Constants are checked as far as possible at upload:
//     max_attempts 1 to MaxAttemptsLimit, priority an int32, durations
//     positive, a queue name in the API's characters.
//   - if, with_items, priority and max_attempts also take a bare
//     expression without ${{ }} (if: input.enabled); the other string
//     fields are literal text unless they hold ${{ }}.
//   - concurrency (the fan-out window) needs with_items and is at least 1.
//   - The workflow's concurrency.strategy is one of RunStrategies and
//     needs concurrency.limit.
//   - A schedule's cron is 5-field cron or a descriptor (@hourly, @every
//     5m), always in UTC (CRON_TZ= is refused); its input is constant JSON.
//   - workflow: NAME (a child run) is read and checked but refused for now.
//
// # Canonical form
//
// Workflow.Canonical is the Definition re-encoded as compact JSON with
// sorted keys, so formatting, comments, key order and YAML-versus-JSON do
// not change it, and Workflow.Hash identifies a version. FromJSON reads it
// back (errors then have no lines).
package definition
