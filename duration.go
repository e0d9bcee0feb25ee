package sluice

import "github.com/sluice-dev/sluice/protocol"

// Duration is a time.Duration that reads and writes JSON as a Go duration
// string ("1.5s", "250ms"); a JSON number is rejected so that units are
// never guessed. It is protocol.Duration, re-exported: D returns the
// time.Duration, String formats like time.Duration.
type Duration = protocol.Duration
