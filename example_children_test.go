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
	"strings"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

// A handler triggers a child task and waits for its output. The server
// runs one task at a time (environment limit 1) and the worker has one
// slot: the parent, while it waits, holds neither, so its child runs.
func ExampleRunChild() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, err := os.MkdirTemp("", "sluice-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	srv, err := server.Open(ctx, server.Config{
		DB:           "sqlite:" + filepath.Join(dir, "sluice.db"),
		AuthDisabled: true,
		MaxRunning:   1,
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close(context.Background())
	if err := srv.Start(ctx); err != nil {
		log.Fatal(err)
	}
	b := srv.Backend()

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
