package sluice_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/sluice-dev/sluice"
)

// Handle turns a typed function into a HandlerFunc: the task input is
// decoded into the function's argument and its result is encoded as the
// task output.
func ExampleHandle() {
	type Greeting struct {
		Name string `json:"name"`
	}
	type Reply struct {
		Message string `json:"message"`
	}
	h := sluice.Handle(func(ctx context.Context, in Greeting) (Reply, error) {
		return Reply{Message: "hello, " + in.Name}, nil
	})

	// A worker calls the handler like this for each claimed task
	// (worker.Register("greet", h) wires it up).
	out, err := h(context.Background(), &sluice.TaskContext{
		ID: 1, Kind: "greet", Attempt: 1, MaxAttempts: 3,
		Input: json.RawMessage(`{"name": "Ada"}`),
	})
	fmt.Println(string(out), err)

	// Input that does not decode fails the task without a retry.
	_, err = h(context.Background(), &sluice.TaskContext{ID: 2, Kind: "greet", Input: json.RawMessage(`[1]`)})
	fmt.Println(err)
	// Output:
	// {"message":"hello, Ada"} <nil>
	// decoding input of greet task 2: json: cannot unmarshal array into Go value of type sluice_test.Greeting
}

// NoRetry and RetryAfter tell the server what to do with a failed attempt;
// they wrap the error, so errors.Is still sees the cause.
func ExampleNoRetry() {
	errUnknownUser := errors.New("unknown user")
	charge := func(ctx context.Context, user string) (string, error) {
		switch {
		case strings.HasPrefix(user, "ghost"):
			// Retrying cannot help: fail the task now.
			return "", sluice.NoRetry(fmt.Errorf("charging %s: %w", user, errUnknownUser))
		case user == "busy":
			// The payment provider asked us to come back later.
			return "", sluice.RetryAfter(errors.New("rate limited"), 30e9)
		}
		return "charged " + user, nil
	}
	for _, u := range []string{"ada", "ghost-1", "busy"} {
		out, err := charge(context.Background(), u)
		fmt.Printf("%q %v %v\n", out, err, errors.Is(err, errUnknownUser))
	}
	// Output:
	// "charged ada" <nil> false
	// "" charging ghost-1: unknown user true
	// "" rate limited false
}
