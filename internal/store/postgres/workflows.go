package postgres

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/store"
)

// Workflow definitions: versions of canonical JSON. Mirrors the SQLite
// store's workflows.go.

// PutWorkflow stores a definition as the next version; see store.RunStore.
// It holds the env lock, as every write does: two replicas storing the
// same workflow at once are serialised, so neither takes the other's
// version number.
func (s *Store) PutWorkflow(ctx context.Context, name string, def json.RawMessage, hash string) (int, bool, error) {
	var (
		version int
		created bool
	)
	err := s.run(ctx, nil, func(t *txn) error {
		version, created = 0, false
		var last int
		var lastHash string
		found, err := t.queryRow("reading workflow", `SELECT version, hash FROM workflows WHERE name = $1 ORDER BY version DESC LIMIT 1`,
			[]any{name}, &last, &lastHash)
		if err != nil {
			return fmt.Errorf("workflow %q: %w", name, err)
		}
		if found && lastHash == hash {
			version = last
			return nil
		}
		version, created = last+1, true
		t.exec("storing workflow", `INSERT INTO workflows (name, version, hash, definition, created_at) VALUES ($1, $2, $3, $4, $5)`,
			name, version, hash, []byte(def), t.now)
		return nil
	})
	return version, created, err
}

// GetWorkflow returns a version of a workflow (0: the latest).
func (s *Store) GetWorkflow(ctx context.Context, name string, version int) (*sluice.WorkflowInfo, error) {
	const cols = `name, version, definition, created_at, EXISTS (SELECT 1 FROM workflow_pauses p WHERE p.name = workflows.name)`
	q := `SELECT ` + cols + ` FROM workflows WHERE name = $1 AND version = $2`
	args := []any{name, version}
	if version == 0 {
		q, args = `SELECT `+cols+` FROM workflows WHERE name = $1 ORDER BY version DESC LIMIT 1`, []any{name}
	}
	list, err := store.ReadWorkflows(ctx, s.reader(), q, args...)
	if err != nil {
		return nil, fmt.Errorf("reading workflow %q: %w", name, err)
	}
	if len(list) == 0 {
		return nil, store.WorkflowNotFound(name, version)
	}
	return &list[0], nil
}

// ListWorkflows returns the latest version of every workflow.
func (s *Store) ListWorkflows(ctx context.Context) ([]sluice.WorkflowInfo, error) {
	list, err := store.ReadWorkflows(ctx, s.reader(), `SELECT w.name, w.version, NULL::bytea, w.created_at,
			EXISTS (SELECT 1 FROM workflow_pauses p WHERE p.name = w.name) FROM workflows w
		WHERE w.version = (SELECT max(version) FROM workflows v WHERE v.name = w.name) ORDER BY w.name COLLATE "C"`)
	if err != nil {
		return nil, fmt.Errorf("listing workflows: %w", err)
	}
	return list, nil
}
