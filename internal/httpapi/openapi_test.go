package httpapi_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
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
	Type       any                  `yaml:"type"`
	Properties map[string]yaml.Node `yaml:"properties"`
	Required   []string             `yaml:"required"`
}

type operationDoc struct {
	Security    *[]map[string][]string `yaml:"security"`
	Parameters  []map[string]any       `yaml:"parameters"`
	RequestBody yaml.Node              `yaml:"requestBody"`
	Responses   map[string]yaml.Node   `yaml:"responses"`
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
// (S-I1): the same (method, path) pairs, a HEAD operation beside each
// GET (the server answers HEAD on every GET route) with the GET's
// statuses, parameters and security, a request body documented exactly
// on the routes that read one, and the security each documents matches
// the route's scope.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	t.Parallel()
	doc := loadOpenAPI(t)
	ops := map[string]operationDoc{}

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
			ops[method+" "+path] = op
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
				if (rt.Method != method && !(rt.Method == "GET" && method == "HEAD")) || rt.Path != path {
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
				if method != "HEAD" {
					require.Equal(t, rt.Body, op.RequestBody.Kind != 0, "%s %s: a requestBody is documented exactly on the routes that read one (Route.Body)", method, path)
				}
			}
		}
	}
	var served []string
	for _, rt := range httpapi.Routes {
		served = append(served, rt.Method+" "+rt.Path)
		if rt.Method == "GET" {
			served = append(served, "HEAD "+rt.Path)
		}
	}
	sort.Strings(documented)
	sort.Strings(served)
	require.Equal(t, served, documented, "openapi.yaml paths must equal httpapi.Routes, with a HEAD beside each GET")

	for _, rt := range httpapi.Routes {
		if rt.Method != "GET" {
			continue
		}
		get, head := ops["GET "+rt.Path], ops["HEAD "+rt.Path]
		require.ElementsMatch(t, slices.Collect(maps.Keys(get.Responses)), slices.Collect(maps.Keys(head.Responses)), "HEAD %s documents the statuses of its GET", rt.Path)
		for status, resp := range head.Responses {
			var ref struct {
				Ref string `yaml:"$ref"`
			}
			require.NoError(t, resp.Decode(&ref))
			require.Equal(t, "#/components/responses/Head", ref.Ref, "HEAD %s %s: no body; refer to the Head response", rt.Path, status)
		}
		require.Equal(t, get.Parameters, head.Parameters, "HEAD %s takes the parameters of its GET", rt.Path)
		require.Equal(t, get.Security, head.Security, "HEAD %s takes the security of its GET", rt.Path)
	}
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
		"TriggerBatchResult":   sluice.TriggerBatchResult{},
		"RateLimit":            sluice.RateLimit{},
		"Debounce":             sluice.Debounce{},
		"WorkflowInfo":         sluice.WorkflowInfo{},
		"ApplyResult":          sluice.ApplyResult{},
		"Run":                  sluice.Run{},
		"RunStep":              sluice.RunStep{},
		"RunPage":              sluice.RunPage{},
		"Schedule":             sluice.Schedule{},
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
		if responseSchemas[name] {
			require.ElementsMatch(t, alwaysSent(rt), s.Required, "schema %s: required lists exactly the fields the server always sends (the json tags of %s without omitempty)", name, rt)
			for _, f := range nullableFields(rt) {
				var prop struct {
					Type  any `yaml:"type"`
					OneOf []struct {
						Type any `yaml:"type"`
					} `yaml:"oneOf"`
				}
				node := s.Properties[f]
				require.NoError(t, node.Decode(&prop))
				nullable := prop.Type == "null"
				if types, ok := prop.Type.([]any); ok {
					nullable = slices.Contains(types, any("null"))
				}
				for _, alt := range prop.OneOf {
					nullable = nullable || alt.Type == "null"
				}
				require.True(t, nullable, "%s.%s may be null (a pointer without omitempty): type it with \"null\"", name, f)
			}
		}
	}
	for name, s := range doc.Comps.Schemas {
		if s.Type == "object" && len(s.Properties) > 0 {
			require.NotNil(t, s.Required, "schema %s has no required list: list the fields always present, or [] for none", name)
		}
	}
}

// responseSchemas are the schemas of answers: their required lists are
// what the server always sends.
var responseSchemas = map[string]bool{
	"Task": true, "Attempt": true, "TaskPage": true, "TriggerBatchResult": true, "Queue": true, "WorkerInfo": true,
	"Environment": true, "DoctorReport": true, "DoctorFinding": true, "CounterRepair": true, "WorkerRegistration": true,
	"ClaimedTask": true, "ClaimResult": true, "ResultAck": true, "CompleteResult": true, "HeartbeatResult": true,
	"ChildResult": true, "WaitChildResult": true, "Error": true, "WorkflowInfo": true, "ApplyResult": true, "Run": true,
	"RunStep": true, "RunPage": true, "Schedule": true, "RateLimit": true, "Debounce": true,
}

// nullableFields lists the JSON names of struct t's pointer fields that
// encoding/json writes as null when nil (no omitempty or omitzero).
func nullableFields(t reflect.Type) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		omit := slices.ContainsFunc(strings.Split(opts, ","), func(o string) bool { return o == "omitempty" || o == "omitzero" })
		if f.Type.Kind() == reflect.Pointer && tag != "-" && tag != "" && !omit {
			out = append(out, tag)
		}
	}
	return out
}

// alwaysSent lists the JSON names of struct t's fields that encoding/json
// always writes: those without omitempty or omitzero, an embedded
// struct's inlined.
func alwaysSent(t reflect.Type) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		omit := slices.ContainsFunc(strings.Split(opts, ","), func(o string) bool { return o == "omitempty" || o == "omitzero" })
		switch {
		case f.Anonymous && tag == "" && f.Type.Kind() == reflect.Struct:
			out = append(out, alwaysSent(f.Type)...)
		case tag != "-" && f.IsExported() && !omit:
			out = append(out, tag)
		}
	}
	return out
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
