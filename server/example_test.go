package server_test

import (
	"context"
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

// Embed a server in a Go program: its store (SQLite here), its engine
// and an in-process worker, with no HTTP in between. The workflow fetches
// a list, fans out over it three items at a time, and joins the results.
func Example() {
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

	// The worker: typed handlers, running in this process.
	w := sluice.NewWorker(b, sluice.WorkerConfig{Slots: 10, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	w.Register("list", sluice.Handle(func(ctx context.Context, in struct{ N int }) ([]string, error) {
		return []string{"ant", "bee", "cat", "dog", "eel"}[:in.N], nil
	}))
	w.Register("shout", sluice.Handle(func(ctx context.Context, in struct{ Word string }) (string, error) {
		return strings.ToUpper(in.Word), nil
	}))
	w.Register("join", sluice.Handle(func(ctx context.Context, in struct{ Words []string }) (string, error) {
		return strings.Join(in.Words, " "), nil
	}))
	go w.Run(ctx)

	// The workflow, built in Go (YAML works the same: ApplyWorkflow).
	_, err = sluice.ApplyDefinition(ctx, b, sluice.Definition{
		Name: "shouting",
		Steps: []sluice.StepDefinition{
			{Name: "list", Kind: "list", Input: map[string]any{"n": sluice.Expr("input.count")}},
			{Name: "each", Kind: "shout", WithItems: sluice.Expr("steps.list.output"), Concurrency: 3,
				Input: map[string]any{"word": sluice.Expr("item")}},
			{Name: "join", Kind: "join", Input: map[string]any{"words": sluice.Expr("steps.each.output")}},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	run, _, err := b.StartRun(ctx, sluice.StartRunParams{Workflow: "shouting", Input: []byte(`{"count": 4}`)})
	if err != nil {
		log.Fatal(err)
	}
	done, err := sluice.WaitRun(ctx, b, run.ID, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(done.State, string(done.Output))
	for _, s := range done.Steps {
		fmt.Println(s.Name, s.State, len(s.Tasks), "task(s)")
	}
	// Output:
	// succeeded "ANT BEE CAT DOG"
	// list succeeded 1 task(s)
	// each succeeded 4 task(s)
	// join succeeded 1 task(s)
}
