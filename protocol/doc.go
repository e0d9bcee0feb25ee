// Package protocol is the wire contract of sluice's worker protocol: the
// JSON bodies and answers of the /v1/workers routes, which a worker in any
// language speaks to a sluice server over HTTP.
//
// A worker's life, in calls:
//
//	POST   /v1/workers                  RegisterWorkerParams → 201 WorkerRegistration
//	POST   /v1/workers/{id}/claim       ClaimParams          → 200 ClaimResult
//	POST   /v1/workers/{id}/complete    CompleteParams       → 200 CompleteResult
//	POST   /v1/workers/{id}/heartbeat   HeartbeatParams      → 200 HeartbeatResult
//	POST   /v1/workers/{id}/release     ReleaseParams        → 204
//	DELETE /v1/workers/{id}                                  → 204
//
// and, for a running task's children (see ChildParams):
//
//	POST   /v1/workers/{wid}/tasks/{id}/children  ChildParams     → 201 ChildResult
//	POST   /v1/workers/{wid}/tasks/{id}/wait      WaitChildParams → 200 WaitChildResult
//
// An error is answered with {"error": {"code", "message", "field"}} and a
// 4xx or 5xx status; a worker that gets 404 for its id (its lease expired
// and the server forgot it) registers again. openapi.yaml at the root of
// the repository documents every route and schema; the JSON names in the
// struct tags here are the contract, and a test keeps the two equal.
//
// Timeouts: a claimed task's Timeout (zero: none) bounds its attempt,
// counted from the server's record of its start: the claim, or for a
// reserved successor the hand-over. A worker must enforce it, since the
// server cannot stop a handler: stop the handler by then and report a
// failed result (an error such as "timeout: attempt exceeded 30s", without
// no_retry, so that the task is retried while attempts remain). The server
// does not wait for that report: its sweeper ends the attempt at its first
// pass after start + timeout (every --sweep-interval, 1s by default), as a
// failed attempt with that error, and frees its slots; from start +
// timeout on, the worker's heartbeats list the task in
// HeartbeatResult.Cancel, as for a requested cancellation; a result sent
// after the sweep is acknowledged "stale". The Go Worker does all this;
// examples/python/sluice_worker.py shows it for a worker in another language.
//
// Encoding rules that hold for every type here:
//
//   - Durations are JSON strings in Go's duration syntax ("1.5s", "250ms",
//     "1h2m"); a number is rejected, so units are never guessed. See
//     Duration.
//   - Times are RFC 3339 strings with up to nanoseconds, as Go's time.Time
//     writes them ("2026-11-25T06:00:00.123456Z").
//   - Inputs and outputs are any JSON value, passed through verbatim.
//   - A field tagged omitempty may be absent; a reader treats absent as the
//     zero value. Requests are read strictly (unknown, duplicate or
//     wrongly-cased names are rejected, naming the field); answers should
//     be read leniently, since a newer server may add fields.
//
// The sluice Go package re-exports every type here under the same name
// (sluice.ClaimedTask is protocol.ClaimedTask; sluice.ChildResult is
// ChildResult with its Task and Run), so Go programs need not import this
// package.
package protocol
