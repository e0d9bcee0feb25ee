package sluice_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

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
			return "", sluice.RetryAfter(errors.New("rate limited"), 30*time.Second)
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

// A handler made with Handle gets only its input; TaskFromContext gives it
// the rest of its task: id, attempt, queue, concurrency key and, for a
// task of a workflow run, the run, the step and the item.
func ExampleTaskFromContext() {
	h := sluice.Handle(func(ctx context.Context, in struct{ Word string }) (string, error) {
		t, ok := sluice.TaskFromContext(ctx)
		if !ok {
			return "", errors.New("not run by a worker")
		}
		if t.RunID != 0 && t.Item != nil {
			return fmt.Sprintf("%s: run %d, step %s, item %d, attempt %d of %d (queue %s, key %s)",
				in.Word, t.RunID, t.Step, *t.Item, t.Attempt, t.MaxAttempts, t.Queue, t.ConcurrencyKey), nil
		}
		return fmt.Sprintf("%s: task %d, attempt %d", in.Word, t.ID, t.Attempt), nil
	})

	// A worker calls the handler like this for each task it claims.
	item := 2
	out, _ := h(context.Background(), &sluice.TaskContext{ID: 7, Kind: "shout", Queue: "shout", ConcurrencyKey: "tenant-1",
		Attempt: 1, MaxAttempts: 3, Input: json.RawMessage(`{"word":"cat"}`), RunID: 12, Step: "each", Item: &item})
	fmt.Println(string(out))
	out, _ = h(context.Background(), &sluice.TaskContext{ID: 8, Kind: "shout", Attempt: 2, MaxAttempts: 3, Input: json.RawMessage(`{"word":"dog"}`)})
	fmt.Println(string(out))
	// Output:
	// "cat: run 12, step each, item 2, attempt 1 of 3 (queue shout, key tenant-1)"
	// "dog: task 8, attempt 2"
}

// echoTrigger is a Backend whose Trigger prints what it was given.
type echoTrigger struct{ sluice.Backend }

func (echoTrigger) Trigger(ctx context.Context, p sluice.TriggerParams) (*sluice.Task, bool, error) {
	fmt.Printf("%s %s\n", p.Kind, p.Input)
	return &sluice.Task{ID: 1, Kind: p.Kind, Input: p.Input}, true, nil
}

// Trigger encodes a typed input as the task's JSON input, the input a
// handler made with Handle decodes.
func ExampleTrigger() {
	type Resize struct {
		URL   string `json:"url"`
		Width int    `json:"width"`
	}
	var b sluice.Backend = echoTrigger{} // a Client, or a server's Backend
	_, _, err := sluice.Trigger(context.Background(), b, sluice.TriggerParams{Kind: "resize", Queue: "images"},
		Resize{URL: "https://example.com/cat.png", Width: 128})
	fmt.Println(err)
	// Output:
	// resize {"url":"https://example.com/cat.png","width":128}
	// <nil>
}
