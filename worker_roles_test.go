package sluice

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWorkerRolesNarrow guards the shape of the worker's roles (issue
// 35): no role, nor the inputs it is built with, holds the Worker or
// another role, and the held runs' lock and map are touched only by
// heldRuns' own file (worker_held.go).
func TestWorkerRolesNarrow(t *testing.T) {
	t.Parallel()
	roles := map[string]bool{"Worker": true, "producer": true, "executor": true, "completer": true, "handovers": true, "leaseKeeper": true}
	checked := map[string]bool{
		"producer": false, "producerInputs": false, "executor": false, "executorInputs": false,
		"completer": false, "completerInputs": false, "handovers": false, "handoverInputs": false,
		"leaseKeeper": false, "leaseInputs": false,
	}
	entries, err := os.ReadDir(".")
	require.NoError(t, err)
	fset := token.NewFileSet()
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.TypeSpec:
				if _, ok := checked[n.Name.Name]; !ok {
					return true
				}
				st, ok := n.Type.(*ast.StructType)
				require.True(t, ok, "%s is a struct", n.Name.Name)
				checked[n.Name.Name] = true
				for _, fld := range st.Fields.List {
					typ := fld.Type
					if s, ok := typ.(*ast.StarExpr); ok {
						typ = s.X
					}
					if id, ok := typ.(*ast.Ident); ok {
						require.False(t, roles[id.Name], "%s: %s holds a %s; give it the calls it needs instead",
							fset.Position(fld.Pos()), n.Name.Name, id.Name)
					}
				}
			case *ast.SelectorExpr:
				if name == "worker_held.go" {
					return true
				}
				require.NotEqual(t, "byID", n.Sel.Name, "%s: the held runs are read through heldRuns' methods", fset.Position(n.Pos()))
				if n.Sel.Name == "mu" {
					var of string
					switch x := n.X.(type) {
					case *ast.Ident:
						of = x.Name
					case *ast.SelectorExpr:
						of = x.Sel.Name
					}
					require.NotEqual(t, "held", of, "%s: heldRuns owns its lock; call its methods", fset.Position(n.Pos()))
				}
			}
			return true
		})
	}
	for typ, seen := range checked {
		require.True(t, seen, "type %s not found: update this test with the roles", typ)
	}
}
