package sluice_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

// A handler triggers a child task and waits for its output. The server
// runs one task at a time (environment limit 1) and the worker has one
// slot: the parent, while it waits, holds neither, so its child runs.
func ExampleRunChild() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b, closeServer := exampleServer(ctx)
	defer closeServer()

	type Order struct{ Item string }
	type Receipt struct{ Text string }
	w := sluice.NewWorker(b, sluice.WorkerConfig{Slots: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	w.Register("charge", sluice.Handle(func(ctx context.Context, o Order) (Receipt, error) {
		if o.Item == "" {
			return Receipt{}, sluice.NoRetry(errors.New("nothing to charge"))
		}
		return Receipt{Text: "charged for " + o.Item}, nil
	}))
	w.Register("order", sluice.Handle(func(ctx context.Context, o Order) (string, error) {
		r, err := sluice.RunChild[Order, Receipt](ctx, "charge", o)
		var ce *sluice.ChildError
		if errors.As(err, &ce) {
			return "order failed: child " + ce.State + ": " + ce.Message, nil
		}
		if err != nil {
			return "", err
		}
		return strings.ToUpper(r.Text), nil
	}))
	go w.Run(ctx)

	for _, item := range []string{"tea", ""} {
		task, _, err := sluice.Trigger(ctx, b, sluice.TriggerParams{Kind: "order"}, Order{Item: item})
		if err != nil {
			log.Fatal(err)
		}
		done, err := sluice.Wait(ctx, b, task.ID)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(done.State, string(done.Output))
	}
	// Output:
	// succeeded "CHARGED FOR TEA"
	// succeeded "order failed: child failed: nothing to charge"
}

// A child that failed for good fails its parent for good too: a retry of
// the parent would get the same child back (children are keyed by call
// position). A handler that wants another try triggers a new child.
func ExampleChildError() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b, closeServer := exampleServer(ctx)
	defer closeServer()

	type Order struct{ Card string }
	w := sluice.NewWorker(b, sluice.WorkerConfig{Slots: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	var charges atomic.Int64
	w.Register("charge", sluice.Handle(func(ctx context.Context, o Order) (string, error) {
		if charges.Add(1) == 1 || o.Card == "expired" {
			return "", errors.New("card declined")
		}
		return "charged " + o.Card, nil
	}))
	w.Register("order", sluice.Handle(func(ctx context.Context, o Order) (string, error) {
		var ce *sluice.ChildError
		for try := 1; ; try++ {
			// Each call takes the next call position: a new child.
			r, err := sluice.RunChild[Order, string](ctx, "charge", o, sluice.ChildMaxAttempts(1))
			if errors.As(err, &ce) && ce.State == "failed" && try < 2 {
				continue
			}
			if err != nil {
				// Wrapped or not, a *ChildError is not retried.
				return "", fmt.Errorf("charging: %w", err)
			}
			return fmt.Sprintf("%s (try %d)", r, try), nil
		}
	}))
	go w.Run(ctx)

	for _, card := range []string{"visa", "expired"} {
		task, _, err := sluice.Trigger(ctx, b, sluice.TriggerParams{Kind: "order", MaxAttempts: 3}, Order{Card: card})
		if err != nil {
			log.Fatal(err)
		}
		done, err := sluice.Wait(ctx, b, task.ID)
		if err != nil {
			log.Fatal(err)
		}
		result := string(done.Output)
		if done.State != sluice.StateSucceeded {
			result = taskID.ReplaceAllString(done.Error, "task N")
		}
		fmt.Printf("%s after %d attempt: %s\n", done.State, done.Attempt, result)
	}
	// Output:
	// succeeded after 1 attempt: "charged visa (try 2)"
	// failed after 1 attempt: charging: child task N failed: card declined
}

// exampleServer opens a server on a temporary SQLite file; the
// environment runs one task at a time.
func exampleServer(ctx context.Context) (sluice.Backend, func()) {
	dir, err := os.MkdirTemp("", "sluice-example")
	if err != nil {
		log.Fatal(err)
	}
	srv, err := server.Open(ctx, server.Config{
		DB:           "sqlite:" + filepath.Join(dir, "sluice.db"),
		AuthDisabled: true,
		MaxRunning:   1,
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		log.Fatal(err)
	}
	return srv.Backend(), func() {
		srv.Close(context.Background())
		os.RemoveAll(dir)
	}
}

// taskID finds the task ids in an error message.
var taskID = regexp.MustCompile(`task \d+`)
