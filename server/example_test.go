package server_test

import (
	"context"
	"encoding/json"
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

// openExample opens an embedded server on a SQLite file in a temporary
// directory and starts it; close stops it and removes the directory.
func openExample(ctx context.Context) (srv *server.Server, close func()) {
	dir, err := os.MkdirTemp("", "sluice-example")
	if err != nil {
		log.Fatal(err)
	}
	srv, err = server.Open(ctx, server.Config{
		DB:           "sqlite:" + filepath.Join(dir, "sluice.db"),
		AuthDisabled: true,
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		log.Fatal(err)
	}
	return srv, func() {
		srv.Close(context.Background())
		os.RemoveAll(dir)
	}
}

// A typed handler reads the rest of its task from its context with
// sluice.TaskFromContext: here, the workflow run, step and item a
// fan-out's task runs for, and its attempt.
func Example_taskFromContext() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, closeSrv := openExample(ctx)
	defer closeSrv()
	b := srv.Backend()

	w := sluice.NewWorker(b, sluice.WorkerConfig{Slots: 4, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	w.Register("label", sluice.Handle(func(ctx context.Context, in struct{ Word string }) (string, error) {
		t, _ := sluice.TaskFromContext(ctx)
		return fmt.Sprintf("%s: step %s, item %d, attempt %d, queue %s", in.Word, t.Step, *t.Item, t.Attempt, t.Queue), nil
	}))
	go w.Run(ctx)

	_, err := sluice.ApplyDefinition(ctx, b, sluice.Definition{
		Name: "labels",
		Steps: []sluice.StepDefinition{
			{Name: "each", Kind: "label", WithItems: sluice.Expr("input.words"), Input: map[string]any{"word": sluice.Expr("item")}},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	run, _, err := b.StartRun(ctx, sluice.StartRunParams{Workflow: "labels", Input: []byte(`{"words": ["ant", "bee"]}`)})
	if err != nil {
		log.Fatal(err)
	}
	done, err := sluice.WaitRun(ctx, b, run.ID, nil)
	if err != nil {
		log.Fatal(err)
	}
	var labels []string
	if err := json.Unmarshal(done.Output, &labels); err != nil {
		log.Fatal(err)
	}
	for _, l := range labels {
		fmt.Println(l)
	}
	// Output:
	// ant: step each, item 0, attempt 1, queue label
	// bee: step each, item 1, attempt 1, queue label
}

// sluice.Trigger encodes a typed input as the task's input; the worker's
// sluice.Handle decodes it into the same type.
func Example_trigger() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, closeSrv := openExample(ctx)
	defer closeSrv()
	b := srv.Backend()

	type Greeting struct {
		Name string `json:"name"`
	}
	w := sluice.NewWorker(b, sluice.WorkerConfig{Slots: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	w.Register("greet", sluice.Handle(func(ctx context.Context, in Greeting) (string, error) {
		return "hello, " + in.Name, nil
	}))
	go w.Run(ctx)

	task, created, err := sluice.Trigger(ctx, b, sluice.TriggerParams{Kind: "greet", IdempotencyKey: "greet-ada"}, Greeting{Name: "Ada"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(task.Input), created)
	done, err := sluice.Wait(ctx, b, task.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(done.State, string(done.Output))
	// Output:
	// {"name":"Ada"} true
	// succeeded "hello, Ada"
}
