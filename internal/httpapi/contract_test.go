package httpapi_test

// The API contract as a test: every answer the handler tests get from the
// server is checked against openapi.yaml (its operation's status list,
// its headers and body schema), so that a test of any route is also a test
// of its documentation.
//
// The checks use kin-openapi (github.com/getkin/kin-openapi). It was
// chosen over libopenapi-validator (github.com/pb33f/libopenapi-validator)
// after trying both on this document: both validate answers with a JSON
// Schema 2020-12 validator, so both understand OpenAPI 3.1's type arrays
// (`type: [string, "null"]`) and `const`; but only kin-openapi's document
// validation rejects a schema with an unknown key (the stray `or null.`
// key an unquoted description once added), an unknown `type` or a
// malformed `required`, which libopenapi-validator's check against the
// OpenAPI 3.1 meta-schema lets through. It also brings fewer modules.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
)

var openAPIPath = filepath.Join("..", "..", "openapi.yaml")

// loadKinOpenAPI loads and resolves openapi.yaml.
func loadKinOpenAPI() (*openapi3.T, error) {
	doc, err := openapi3.NewLoader().LoadFromFile(openAPIPath)
	if err != nil {
		return nil, fmt.Errorf("loading openapi.yaml: %w", err)
	}
	return doc, nil
}

// TestOpenAPIDocumentIsValid: openapi.yaml is a valid OpenAPI 3.1
// document, every $ref resolves, and every schema uses only known
// keywords with well-formed values.
func TestOpenAPIDocumentIsValid(t *testing.T) {
	t.Parallel()
	doc, err := loadKinOpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	if !doc.IsOpenAPI31OrLater() || doc.OpenAPIMajorMinor() != "3.1" {
		t.Fatalf("openapi.yaml declares OpenAPI %s; it is written for 3.1", doc.OpenAPI)
	}
	if err := doc.Validate(context.Background(), openapi3.EnableMultiError()); err != nil {
		t.Fatalf("openapi.yaml is not valid OpenAPI 3.1:\n%v", err)
	}
}

// contractSpec is openapi.yaml as the answers are checked against it.
type contractSpec struct {
	doc      *openapi3.T
	router   routers.Router
	envelope *openapi3.Schema
}

var loadContract = sync.OnceValues(func() (*contractSpec, error) {
	doc, err := loadKinOpenAPI()
	if err != nil {
		return nil, err
	}
	// Answers are checked strictly: a property the document does not
	// name is an error (a client generated from it would drop it), though
	// the document itself leaves objects open for later additions.
	closeObjects(doc)
	inlineRefs(doc)
	// The server list names a dev address; match requests by path alone.
	doc.Servers = nil
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("routing openapi.yaml: %w", err)
	}
	env := doc.Components.Schemas["ErrorEnvelope"]
	if env == nil || env.Value == nil {
		return nil, errors.New("openapi.yaml has no ErrorEnvelope schema")
	}
	return &contractSpec{doc: doc, router: router, envelope: env.Value}, nil
})

// closeObjects sets additionalProperties: false on every object schema
// that lists its properties and says nothing of others.
func closeObjects(doc *openapi3.T) {
	seen := map[*openapi3.Schema]bool{}
	var walk func(ref *openapi3.SchemaRef)
	walk = func(ref *openapi3.SchemaRef) {
		if ref == nil || ref.Value == nil || seen[ref.Value] {
			return
		}
		s := ref.Value
		seen[s] = true
		if len(s.Properties) > 0 && len(s.AllOf) == 0 && s.AdditionalProperties.Has == nil && s.AdditionalProperties.Schema == nil {
			closed := false
			s.AdditionalProperties.Has = &closed
		}
		for _, p := range s.Properties {
			walk(p)
		}
		walk(s.Items)
		walk(s.AdditionalProperties.Schema)
		for _, list := range []openapi3.SchemaRefs{s.OneOf, s.AnyOf, s.AllOf} {
			for _, sub := range list {
				walk(sub)
			}
		}
	}
	for _, s := range doc.Components.Schemas {
		walk(s)
	}
	for _, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			for _, resp := range op.Responses.Map() {
				if resp.Value == nil {
					continue
				}
				for _, mt := range resp.Value.Content {
					walk(mt.Schema)
				}
			}
		}
	}
}

// inlineRefs makes every schema that a response uses hold the schemas
// it refers to inline rather than by $ref. kin-openapi hands a schema
// whose JSON has a $ref inside to its older, OpenAPI 3.0 validator unless
// the schema uses a keyword new in 3.1, and that validator rejects null
// for a schema without a type (`output: {description: …}`, any JSON),
// which in 3.1 takes any value. Inline, every schema goes to the JSON
// Schema 2020-12 validator. The document has no recursive schema, so
// inlining ends.
func inlineRefs(doc *openapi3.T) {
	seen := map[*openapi3.Schema]bool{}
	var walk func(s *openapi3.Schema)
	inline := func(ref *openapi3.SchemaRef) {
		if ref != nil && ref.Value != nil {
			ref.Ref = ""
			walk(ref.Value)
		}
	}
	walk = func(s *openapi3.Schema) {
		if seen[s] {
			return
		}
		seen[s] = true
		for _, p := range s.Properties {
			inline(p)
		}
		inline(s.Items)
		inline(s.AdditionalProperties.Schema)
		inline(s.PropertyNames)
		for _, list := range []openapi3.SchemaRefs{s.OneOf, s.AnyOf, s.AllOf} {
			for _, sub := range list {
				inline(sub)
			}
		}
	}
	for _, s := range doc.Components.Schemas {
		if s.Value != nil {
			walk(s.Value)
		}
	}
}

// exchange is one request a test sent and the answer it got.
type exchange struct {
	test           string
	method, target string // target: the request's path and query
	status         int
	header         http.Header
	body           []byte
	truncated      bool // body is only the start of the answer
	// injected: the test made the backend fail with an error of its
	// choosing, which the real one may never return on this route.
	injected bool
}

func (x exchange) String() string {
	body := bytes.TrimSpace(x.body)
	if len(body) > 300 {
		body = append(body[:300:300], "…"...)
	}
	return fmt.Sprintf("%s %s → %d %s (in %s)", x.method, x.target, x.status, body, x.test)
}

// check returns what is wrong with x against the document, or nil, and
// the operation ("GET /v1/tasks/{id}") x was an answer of, if any.
func (s *contractSpec) check(x exchange) (string, error) {
	req := httptest.NewRequest(x.method, x.target, nil)
	route, params, err := s.router.FindRoute(req)
	if err != nil {
		// No operation: the server answers an unknown path 404 and a
		// known path with another method 405, with the error envelope
		// (the API's conventions).
		want := http.StatusNotFound
		if errors.Is(err, routers.ErrMethodNotAllowed) {
			want = http.StatusMethodNotAllowed
		}
		if x.status != want {
			return "", fmt.Errorf("%s: no operation (%v), so want %d", x, err, want)
		}
		return "", s.checkEnvelope(x)
	}
	op := route.Method + " " + route.Path
	documented := route.Operation.Responses.Status(x.status)
	if documented == nil && x.injected && x.status >= 400 {
		// The status is the test's choice; the answer's shape is still
		// the server's. It does not count as a checked answer of op.
		return "", s.checkEnvelope(x)
	}
	if documented == nil {
		return "", fmt.Errorf("%s: %s documents no %d response", x, op, x.status)
	}
	if x.method == http.MethodHead {
		// The server sends no body (net/http drops what the GET handler
		// writes); the status list is the contract.
		return op, nil
	}
	if len(documented.Value.Content) == 0 && len(x.body) > 0 {
		return "", fmt.Errorf("%s: %s documents no body for %d", x, op, x.status)
	}
	if x.truncated {
		return op, nil
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{
			Request: req, PathParams: params, Route: route,
		},
		Status: x.status,
		Header: x.header,
		Options: &openapi3filter.Options{
			IncludeResponseStatus: true,
			MultiError:            true,
		},
	}
	in.SetBodyBytes(x.body)
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		return "", fmt.Errorf("%s: %s: %w", x, op, err)
	}
	return op, nil
}

func (s *contractSpec) checkEnvelope(x exchange) error {
	if ct := x.header.Get("Content-Type"); ct != "application/json" {
		return fmt.Errorf("%s: Content-Type %q, want application/json", x, ct)
	}
	v, err := decodeJSONValue(x.body)
	if err != nil {
		return fmt.Errorf("%s: %w", x, err)
	}
	if err := s.envelope.VisitJSON(v, openapi3.EnableJSONSchema2020(), openapi3.VisitAsResponse(), openapi3.MultiErrors()); err != nil {
		return fmt.Errorf("%s: not an ErrorEnvelope: %w", x, err)
	}
	return nil
}

// decodeJSONValue decodes body as VisitJSON takes it.
func decodeJSONValue(body []byte) (any, error) {
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return nil, fmt.Errorf("body is not JSON: %w", err)
	}
	return v, nil
}

// coveredOps are the operations whose answers were checked, for
// TestMain's check that each route's answers were.
type coveredOps struct {
	mu  sync.Mutex
	ops map[string]bool
}

var covered = &coveredOps{ops: map[string]bool{}}

func (c *coveredOps) add(op string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ops[op] = true
}

// missing returns the operations of the document no checked answer was
// for.
func (c *coveredOps) missing(s *contractSpec) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for path, item := range s.doc.Paths.Map() {
		for method := range item.Operations() {
			if op := method + " " + path; !c.ops[op] {
				out = append(out, op)
			}
		}
	}
	sort.Strings(out)
	return out
}

// checkContractCoverage is TestMain's: when the whole package ran, every
// operation of openapi.yaml had at least one answer checked. It returns
// what to report, or "".
func checkContractCoverage() string {
	if f := flag.Lookup("test.run"); f == nil || f.Value.String() != "" {
		return "" // a selection of tests ran
	}
	for _, name := range []string{"test.skip", "test.list"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" {
			return "" // some tests were left out, or none ran
		}
	}
	s, err := loadContract()
	if err != nil {
		return err.Error()
	}
	if m := covered.missing(s); len(m) > 0 {
		return "no handler test checked an answer of these operations of openapi.yaml against it: " + strings.Join(m, ", ")
	}
	return ""
}

// withContract wraps h, the handler of test t, so that every answer it
// gives is checked against openapi.yaml when t ends. injected, when not
// nil, reports whether the test makes the backend fail with an error of
// its choosing (see exchange.injected). Benchmarks are not checked.
func withContract(t testing.TB, h http.Handler, injected func() bool) http.Handler {
	if _, ok := t.(*testing.B); ok {
		return h
	}
	c := &contractHandler{h: h, test: t.Name(), injected: injected}
	t.Cleanup(func() {
		s, err := loadContract()
		if err != nil {
			t.Error(err)
			return
		}
		for _, x := range c.take() {
			op, err := s.check(x)
			if err != nil {
				t.Errorf("the answer does not match openapi.yaml: %v", err)
			} else if op != "" {
				covered.add(op)
			}
		}
	})
	return c
}

// contractHandler records the exchanges of a handler.
type contractHandler struct {
	h        http.Handler
	test     string
	injected func() bool

	mu   sync.Mutex
	seen []exchange
}

// maxRecorded bounds the part of an answer kept for the check; a longer
// answer's status and headers are still checked.
const maxRecorded = 4 << 20

func (c *contractHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tw := &teeWriter{ResponseWriter: w}
	x := exchange{test: c.test, method: r.Method, target: r.URL.RequestURI(), injected: c.injected != nil && c.injected()}
	defer func() {
		// Recorded also when the handler panics (http.ErrAbortHandler).
		if tw.status == 0 {
			tw.status = http.StatusOK
		}
		x.status, x.header, x.body, x.truncated = tw.status, w.Header().Clone(), tw.body.Bytes(), tw.truncated
		c.mu.Lock()
		c.seen = append(c.seen, x)
		c.mu.Unlock()
	}()
	c.h.ServeHTTP(tw, r)
}

func (c *contractHandler) take() []exchange {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.seen
	c.seen = nil
	return out
}

// teeWriter keeps a copy of the status and body written through it.
type teeWriter struct {
	http.ResponseWriter
	status    int
	body      bytes.Buffer
	truncated bool
}

func (w *teeWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *teeWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if !w.truncated && w.body.Len()+len(b) <= maxRecorded {
		w.body.Write(b)
	} else {
		w.truncated = true
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *teeWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// TestContractCatchesMismatches: the contract check rejects what it is
// for: an undocumented status, a body that breaks its schema (a wrong
// const, a missing required field, a wrong type, an unknown field, an
// unknown error code), and a route answered without an operation.
func TestContractCatchesMismatches(t *testing.T) {
	t.Parallel()
	s, err := loadContract()
	if err != nil {
		t.Fatal(err)
	}
	jsonCT := http.Header{"Content-Type": {"application/json"}}
	run := `{"id":1,"workflow":"w","version":1,"state":"running","input":null,"output":null,"error":"","created_at":"2026-01-02T15:04:05Z","started_at":null,"finished_at":null}`
	for _, tt := range []struct {
		name string
		x    exchange
		ok   bool
	}{
		{"healthz", exchange{method: "GET", target: "/healthz", status: 200, header: jsonCT, body: []byte(`{"status":"ok"}`)}, true},
		{"const", exchange{method: "GET", target: "/healthz", status: 200, header: jsonCT, body: []byte(`{"status":"fine"}`)}, false},
		{"undocumented status", exchange{method: "GET", target: "/healthz", status: 418, header: jsonCT, body: []byte(`{"status":"ok"}`)}, false},
		{"nullable", exchange{method: "GET", target: "/v1/runs/1", status: 200, header: jsonCT, body: []byte(run)}, true},
		{"missing required", exchange{method: "GET", target: "/v1/runs/1", status: 200, header: jsonCT, body: []byte(strings.Replace(run, `"started_at":null,`, "", 1))}, false},
		{"wrong type", exchange{method: "GET", target: "/v1/runs/1", status: 200, header: jsonCT, body: []byte(strings.Replace(run, `"version":1`, `"version":"1"`, 1))}, false},
		{"unknown field", exchange{method: "GET", target: "/v1/runs/1", status: 200, header: jsonCT, body: []byte(strings.Replace(run, `"id":1`, `"id":1,"idd":2`, 1))}, false},
		{"error code", exchange{method: "GET", target: "/v1/runs/1", status: 404, header: jsonCT, body: []byte(`{"error":{"code":"gone","message":"x"}}`)}, false},
		{"no route", exchange{method: "GET", target: "/v1/nope", status: 404, header: jsonCT, body: []byte(`{"error":{"code":"not_found","message":"x"}}`)}, true},
		{"no route 200", exchange{method: "GET", target: "/v1/nope", status: 200, header: jsonCT, body: []byte(`{}`)}, false},
		{"wrong method", exchange{method: "PATCH", target: "/v1/tasks", status: 405, header: jsonCT, body: []byte(`{"error":{"code":"method_not_allowed","message":"x"}}`)}, true},
		{"head", exchange{method: "HEAD", target: "/v1/queues", status: 200, header: jsonCT}, true},
		{"head undocumented", exchange{method: "HEAD", target: "/v1/queues", status: 409, header: jsonCT}, false},
		{"body on 204", exchange{method: "DELETE", target: "/v1/workers/w1", status: 204, body: []byte(`{}`)}, false},
	} {
		_, err := s.check(tt.x)
		if tt.ok && err != nil {
			t.Errorf("%s: want it accepted, got %v", tt.name, err)
		}
		if !tt.ok && err == nil {
			t.Errorf("%s: want it rejected, was accepted", tt.name)
		}
	}
}
