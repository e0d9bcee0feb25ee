package definition

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every example under examples/workflows parses.
func TestExamplesParse(t *testing.T) {
	files, err := filepath.Glob("../../../examples/workflows/*")
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(files), 4, "examples/workflows holds the examples")
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			require.NoError(t, err)
			f := YAML
			if strings.HasSuffix(file, ".json") {
				f = JSON
			}
			w, err := Parse(data, f)
			require.NoError(t, err)
			require.Equal(t, strings.TrimSuffix(filepath.Base(file), filepath.Ext(file)), w.Def.Name, "the file is named after its workflow")
			again, err := FromJSON(w.Canonical)
			require.NoError(t, err)
			require.Equal(t, w.Hash, again.Hash)
		})
	}
}
