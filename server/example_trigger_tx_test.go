package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/server"
)

// Trigger a task in the application's own transaction (PostgreSQL): the
// order and the task that ships it commit together, or neither exists.
// Workers on every server sharing the database get the task when the
// transaction commits. Keep such transactions short: until it ends, the
// transaction holds the lock every sluice write takes.
func Example_triggerTx() {
	ctx := context.Background()
	const db = "postgres://app@localhost:5432/app?search_path=sluice"
	srv, err := server.Open(ctx, server.Config{DB: db})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close(ctx)
	if err := srv.Start(ctx); err != nil {
		log.Fatal(err)
	}
	// The application's own pool on the same database.
	pool, err := pgxpool.New(ctx, "postgres://app@localhost:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	placeOrder := func(ctx context.Context, id int64, total int) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) // a no-op once committed
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, total) VALUES ($1, $2)`, id, total); err != nil {
			return err
		}
		input, err := json.Marshal(map[string]int64{"order": id})
		if err != nil {
			return err
		}
		_, _, err = srv.TriggerTx(ctx, tx, sluice.TriggerParams{Kind: "ship", Input: input, IdempotencyKey: fmt.Sprint("ship-", id)})
		if ae, ok := sluice.IsAdmission(err); ok {
			// Over a ceiling: nothing was triggered, tx is still usable.
			return fmt.Errorf("too busy, retry in %s: %w", ae.RetryAfter, err)
		} else if err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	if err := placeOrder(ctx, 42, 1999); err != nil {
		log.Fatal(err)
	}
}
