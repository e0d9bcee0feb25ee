// Package wire is the hand-written JSON codec of the worker protocol's
// hot answers: the answers to claim and complete calls
// (protocol.ClaimResult, protocol.CompleteResult), which carry every task
// a busy worker runs. The server writes them with AppendAnswer and the Go
// client reads them with ReadAnswer, side by side here so that the two
// change together.
//
// The layout both sides agree on is exactly the bytes encoding/json
// writes for these types: fields in declaration order, compact, strings
// without escapes. The writer produces those bytes or declines (a value
// it cannot prove it writes the same way, such as a string that
// encoding/json would escape, goes through encoding/json instead); the
// reader accepts only those bytes and declines anything else (another
// field order, escapes, whitespace, an unknown field), which the caller
// then reads with a general JSON decoder. Declining is always safe; a
// wrong value is not.
//
// TestEveryField fills every field of these types, found by reflection,
// and requires the writer to write encoding/json's bytes and the reader to
// read them back: a field added to protocol.ClaimedTask and not to this
// codec fails it.
package wire

import "github.com/sluice-dev/sluice/protocol"

// answers are the types this codec writes and reads, as the pointers
// AppendAnswer and ReadAnswer take; TestEveryField covers each.
var answers = []any{(*protocol.ClaimResult)(nil), (*protocol.CompleteResult)(nil)}
