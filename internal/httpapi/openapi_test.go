package httpapi_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/sluice-dev/sluice"
	"github.com/sluice-dev/sluice/internal/httpapi"
)

type openAPIDoc struct {
	OpenAPI  string                                 `yaml:"openapi"`
	Security []map[string][]string                  `yaml:"security"`
	Paths    map[string]map[string]yaml.Node        `yaml:"paths"`
	Comps    struct{ Schemas map[string]schemaDoc } `yaml:"components"`
}

type schemaDoc struct {
	Properties map[string]yaml.Node `yaml:"properties"`
	Required   []string             `yaml:"required"`
}

type operationDoc struct {
	Security  *[]map[string][]string `yaml:"security"`
	Responses map[string]yaml.Node   `yaml:"responses"`
}

func loadOpenAPI(t *testing.T) openAPIDoc {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "openapi.yaml"))
	require.NoError(t, err)
	var doc openAPIDoc
	require.NoError(t, yaml.Unmarshal(b, &doc))
	require.True(t, strings.HasPrefix(doc.OpenAPI, "3."), "openapi version %q", doc.OpenAPI)
	return doc
}

var httpMethods = []string{"get", "put", "post", "delete", "patch", "head", "options", "trace"}

// TestOpenAPIMatchesRoutes keeps openapi.yaml and the route table in sync
// (S-I1): the same (method, path) pairs, and the security each documents
// matches the route's scope.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	t.Parallel()
	doc := loadOpenAPI(t)

	var documented []string
	for path, item := range doc.Paths {
		for key, node := range item {
			if !slices.Contains(httpMethods, key) {
				continue // parameters, summary, …
			}
			method := strings.ToUpper(key)
			documented = append(documented, method+" "+path)

			var op operationDoc
			require.NoError(t, node.Decode(&op), "%s %s", method, path)
			require.NotEmpty(t, op.Responses, "%s %s documents no responses", method, path)
			security := doc.Security
			if op.Security != nil {
				security = *op.Security
			}
			var schemes []string
			for _, req := range security {
				for name := range req {
					schemes = append(schemes, name)
				}
			}
			sort.Strings(schemes)
			for _, rt := range httpapi.Routes {
				if rt.Method != method || rt.Path != path {
					continue
				}
				switch rt.Scope {
				case httpapi.ScopePublic:
					require.Empty(t, schemes, "%s %s is public: document `security: []`", method, path)
				case httpapi.ScopeWorker:
					require.Equal(t, []string{"adminToken", "workerToken"}, schemes, "%s %s takes either token", method, path)
				case httpapi.ScopeAdmin:
					require.Equal(t, []string{"adminToken"}, schemes, "%s %s takes the admin token only", method, path)
				}
			}
		}
	}
	var served []string
	for _, rt := range httpapi.Routes {
		served = append(served, rt.Method+" "+rt.Path)
	}
	sort.Strings(documented)
	sort.Strings(served)
	require.Equal(t, served, documented, "openapi.yaml paths must equal httpapi.Routes")
}

// TestOpenAPISchemasMatchTypes: each documented schema has exactly the JSON
// fields of its Go type, so a renamed or added field fails here.
func TestOpenAPISchemasMatchTypes(t *testing.T) {
	t.Parallel()
	doc := loadOpenAPI(t)
	types := map[string]any{
		"TriggerParams":        sluice.TriggerParams{},
		"Task":                 sluice.Task{},
		"Attempt":              sluice.Attempt{},
		"TaskPage":             sluice.TaskPage{},
		"QueueParams":          sluice.QueueParams{},
		"Queue":                sluice.Queue{},
		"WorkerInfo":           sluice.WorkerInfo{},
		"Environment":          sluice.Environment{},
		"DoctorReport":         sluice.DoctorReport{},
		"DoctorFinding":        sluice.DoctorFinding{},
		"CounterRepair":        sluice.CounterRepair{},
		"RegisterWorkerParams": sluice.RegisterWorkerParams{},
		"WorkerRegistration":   sluice.WorkerRegistration{},
		"ClaimParams":          sluice.ClaimParams{},
		"ClaimedTask":          sluice.ClaimedTask{},
		"ClaimResult":          sluice.ClaimResult{},
		"TaskResult":           sluice.TaskResult{},
		"CompleteParams":       sluice.CompleteParams{},
		"ResultAck":            sluice.ResultAck{},
		"CompleteResult":       sluice.CompleteResult{},
		"HeartbeatParams":      sluice.HeartbeatParams{},
		"HeartbeatResult":      sluice.HeartbeatResult{},
		"ReleaseParams":        sluice.ReleaseParams{},
		"ChildParams":          sluice.ChildParams{},
		"ChildResult":          sluice.ChildResult{},
		"WaitChildParams":      sluice.WaitChildParams{},
		"WaitChildResult":      sluice.WaitChildResult{},
		"Error":                sluice.Error{},
	}
	for name, v := range types {
		s, ok := doc.Comps.Schemas[name]
		require.True(t, ok, "openapi.yaml has no schema %s", name)
		var got []string
		rt := reflect.TypeOf(v)
		want := jsonFields(rt)
		for p := range s.Properties {
			got = append(got, p)
		}
		sort.Strings(want)
		sort.Strings(got)
		require.Equal(t, want, got, "schema %s properties vs json tags of %s", name, rt)
		for _, r := range s.Required {
			require.Contains(t, want, r, "schema %s requires unknown property %s", name, r)
		}
	}
}

// jsonFields lists the JSON names of struct t's fields, those of an
// embedded struct without a JSON name inlined (as encoding/json does).
func jsonFields(t reflect.Type) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case f.Anonymous && tag == "" && f.Type.Kind() == reflect.Struct:
			out = append(out, jsonFields(f.Type)...)
		case tag != "-" && f.IsExported():
			out = append(out, tag)
		}
	}
	return out
}

// Every error code the Go SDK declares (the Code constants of package
// sluice, read from its source) is in openapi.yaml's Error.code enum, so
// a client generated from the document can compare against each.
func TestOpenAPIErrorCodes(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "openapi.yaml"))
	require.NoError(t, err)
	var doc struct {
		Components struct {
			Schemas struct {
				Error struct {
					Properties struct {
						Code struct {
							Enum []string `yaml:"enum"`
						} `yaml:"code"`
					} `yaml:"properties"`
				} `yaml:"Error"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	require.NoError(t, yaml.Unmarshal(b, &doc))
	enum := doc.Components.Schemas.Error.Properties.Code.Enum
	require.NotEmpty(t, enum)

	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, filepath.Join("..", ".."), func(fi fs.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	require.NoError(t, err)
	var codes []string
	for _, f := range pkgs["sluice"].Files {
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if !strings.HasPrefix(name.Name, "Code") || i >= len(vs.Values) {
						continue
					}
					if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						v, err := strconv.Unquote(lit.Value)
						require.NoError(t, err)
						codes = append(codes, v)
					}
				}
			}
		}
	}
	require.Contains(t, codes, sluice.CodeBadRequest, "the Code constants were found")
	for _, c := range codes {
		require.Contains(t, enum, c, "error code %q is missing from Error.code in openapi.yaml", c)
	}
}
