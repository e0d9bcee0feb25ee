package sluice_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"time"

	"github.com/sluice-dev/sluice"
)

// A queue's debounce merges the triggers of one thing that come close
// together into one task, which runs once with the last trigger's input:
// here a search index rebuilt once after a burst of edits.
// TriggerParams.Debounce sets one for a single trigger instead.
func ExampleDebounce() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b, closeServer := exampleServer(ctx)
	defer closeServer()

	_, err := b.PutQueue(ctx, "search", sluice.QueueParams{Debounce: sluice.Set(sluice.Debounce{
		Period:  sluice.Duration(250 * time.Millisecond), // start 250ms after the last trigger,
		MaxWait: sluice.Duration(time.Minute),            // at the latest 1m after the first
	})})
	if err != nil {
		log.Fatal(err)
	}
	type Edit struct{ Doc int }
	var task *sluice.Task
	for doc := 1; doc <= 3; doc++ {
		task, _, err = sluice.Trigger(ctx, b, sluice.TriggerParams{Kind: "reindex", Queue: "search"}, Edit{Doc: doc})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("edit %d: merged %v, the task stands for %d triggers\n", doc, task.Debounced, task.DebounceTriggers)
	}

	w := sluice.NewWorker(b, sluice.WorkerConfig{Slots: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	w.Register("reindex", sluice.Handle(func(ctx context.Context, e Edit) (string, error) {
		return fmt.Sprintf("reindexed up to doc %d", e.Doc), nil
	}))
	go w.Run(ctx)
	done, err := sluice.Wait(ctx, b, task.ID)
	if err != nil {
		log.Fatal(err)
	}
	page, err := b.ListTasks(ctx, sluice.TaskFilter{Kind: "reindex"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(page.Tasks), "task:", done.State, string(done.Output))
	// Output:
	// edit 1: merged false, the task stands for 1 triggers
	// edit 2: merged true, the task stands for 2 triggers
	// edit 3: merged true, the task stands for 3 triggers
	// 1 task: succeeded "reindexed up to doc 3"
}
