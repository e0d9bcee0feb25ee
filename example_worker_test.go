package sluice_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/sluice-dev/sluice"
)

// A worker process: register typed handlers, then run until interrupted.
// On Ctrl-C it stops claiming, lets running tasks finish for up to
// ShutdownTimeout, releases the rest and deregisters.
func ExampleWorker() {
	client := sluice.NewClient("http://localhost:8080", sluice.WithToken(os.Getenv("SLUICE_TOKEN")))

	w := sluice.NewWorker(client, sluice.WorkerConfig{
		Slots:           200, // at most 200 tasks at once
		ShutdownTimeout: 20 * time.Second,
	})
	type Resize struct {
		URL   string `json:"url"`
		Width int    `json:"width"`
	}
	w.Register("resize", sluice.Handle(func(ctx context.Context, in Resize) (map[string]string, error) {
		if in.Width <= 0 {
			return nil, sluice.NoRetry(fmt.Errorf("width must be positive, got %d", in.Width))
		}
		// ... fetch, resize, upload, honouring ctx ...
		return map[string]string{"thumbnail": in.URL + "?w=" + fmt.Sprint(in.Width)}, nil
	}))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := w.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// Trigger a task and wait for its result.
func ExampleClient_Trigger() {
	ctx := context.Background()
	client := sluice.NewClient("http://localhost:8080")

	task, _, err := client.Trigger(ctx, sluice.TriggerParams{
		Kind:           "resize",
		Input:          json.RawMessage(`{"url": "https://example.com/cat.png", "width": 128}`),
		Queue:          "images",
		ConcurrencyKey: "tenant-42", // each tenant gets the queue's limit
		Timeout:        sluice.Duration(time.Minute),
	})
	if ae, ok := sluice.IsAdmission(err); ok {
		log.Printf("server full (%s); retry in %s", ae.Ceiling, ae.RetryAfter)
		return
	} else if err != nil {
		log.Fatal(err)
	}
	done, err := client.Wait(ctx, task.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(done.State, string(done.Output))
}
