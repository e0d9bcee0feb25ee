package sluice

import (
	"encoding/json"
	"fmt"
	"time"
)

// Duration is a time.Duration that reads and writes JSON as a Go duration
// string ("1.5s", "250ms"). A JSON number is rejected so that units are
// never guessed.
type Duration time.Duration

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// String formats like time.Duration.
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes a duration string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON reads a duration string; null leaves the zero value.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*d = 0
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration string such as \"1.5s\"")
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("invalid duration %q: want a duration string such as \"1.5s\"", s)
	}
	*d = Duration(v)
	return nil
}
