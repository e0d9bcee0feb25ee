package engine_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/engine"
)

// A definition built in Go (sluice.ApplyDefinition) has no text a line
// could point into: its validation errors name the field's path only.
func TestBuilderErrorsNameNoLine(t *testing.T) {
	f := newFixture(t, engine.Config{})
	_, err := sluice.ApplyDefinition(f.ctx, f.e, sluice.Definition{Name: "built", Steps: []sluice.StepDefinition{
		{Name: "each", Kind: "k", WithItems: sluice.Expr("input.items"), Concurrency: -1},
		{Name: "next", Kind: "k", Needs: []string{"nowhere"}},
	}})
	var se *sluice.Error
	require.True(t, errors.As(err, &se), "%v", err)
	require.Equal(t, sluice.CodeBadRequest, se.Code)
	require.Equal(t, "steps[0].concurrency", se.Field)
	require.Contains(t, se.Message, "steps[0].concurrency: must be ≥ 1")
	require.Contains(t, se.Message, "steps[1].needs[0]:")
	require.NotContains(t, se.Message, "(line ")

	// The same mistake in YAML cites its line.
	_, err = f.e.ApplyWorkflow(f.ctx, []byte("name: built\nsteps:\n  - name: each\n    kind: k\n    with_items: ${{ input.items }}\n    concurrency: -1\n"), "application/yaml")
	require.ErrorContains(t, err, "steps[0].concurrency: must be ≥ 1 (line 6)")
}
