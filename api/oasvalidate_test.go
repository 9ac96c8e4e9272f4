package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/internal/apitest"
	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
)

// Every answer the api tests get over HTTP from a server they started is
// validated against api/openapi.yaml: TestMain puts oasTransport in front
// of http.DefaultTransport (which apitest.Do, the UI test's client and
// fencecheck's clients use), and each test that starts a server names it
// with oasWatch. An answer is matched to its operation by method and path
// and checked with openapi3filter.ValidateResponse: its status is one the
// operation declares (or 500, which any route may answer: the document's
// description says so, and the validator adds components/responses/Internal
// to every operation that does not list 500), its content type one the
// status declares, its declared headers and its body against the schema,
// problem+json included, with every object schema closed (oasClose: a
// member the document does not list is reported), and a problem's slug
// one its response lists in x-fcd-problem-types and carried in the
// Fcd-Problem header. A request outside the document (an unknown path,
// a method the path does not serve) is checked only for the problem body
// every error carries: a problem+json answer must match
// components/schemas/Problem. A failure is reported with t.Errorf on the
// test that started the server, naming method, path and status.

// oasDoc is the loaded document and its router, built once.
var oasDoc = sync.OnceValues(func() (*oasValidator, error) {
	// The approval UI's files and the document itself are text, their
	// schemas type: string: their bodies are checked as strings (kin
	// decodes YAML into the value it describes). The key set is JSON.
	for _, ct := range []string{"text/html", "text/css", "text/javascript", "image/svg+xml", "application/yaml"} {
		openapi3filter.RegisterBodyDecoder(ct, openapi3filter.PlainBodyDecoder)
	}
	openapi3filter.RegisterBodyDecoder("application/jwk-set+json", openapi3filter.JSONBodyDecoder)
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(api.OpenAPI())
	if err != nil {
		return nil, fmt.Errorf("load api/openapi.yaml: %w", err)
	}
	// Match paths alone, whatever host the test server listens on.
	doc.Servers = nil
	internal := doc.Components.Responses["Internal"]
	if internal == nil {
		return nil, errors.New("api/openapi.yaml: no components/responses/Internal")
	}
	problem := doc.Components.Schemas["Problem"]
	if problem == nil {
		return nil, errors.New("api/openapi.yaml: no components/schemas/Problem")
	}
	v := &oasValidator{doc: doc, problem: problem}
	oasClose(doc)
	for path, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			if op.Responses.Status(http.StatusInternalServerError) == nil {
				op.Responses.Set("500", internal)
			}
		}
		if prefix, ok := strings.CutSuffix(path, oasCatchAll); ok {
			v.catchAll = append(v.catchAll, prefix+"/")
		}
	}
	if v.router, err = legacy.NewRouter(doc); err != nil {
		return nil, fmt.Errorf("route api/openapi.yaml: %w", err)
	}
	return v, nil
})

type oasValidator struct {
	doc     *openapi3.T
	router  routers.Router
	problem *openapi3.SchemaRef
	// catchAll are the prefixes of the paths whose last parameter is the
	// rest of the path, slashes included ("/ui/"): the router matches a
	// parameter to one segment.
	catchAll []string
}

// validate checks one answer to req. It returns nil when the answer
// matches the document. A body the caller did not read whole (whole false)
// is not checked, its status, content type and headers are.
func (v *oasValidator) validate(req *http.Request, status int, header http.Header, body []byte, whole bool) error {
	match := req.Clone(context.Background())
	match.URL = &url.URL{Path: req.URL.Path, RawQuery: req.URL.RawQuery}
	for _, prefix := range v.catchAll {
		if strings.HasPrefix(match.URL.Path, prefix) {
			match.URL.Path = prefix + "rest"
		}
	}
	route, params, err := v.router.FindRoute(match)
	if err != nil {
		// Outside the document: only the problem shape is checked.
		if !strings.HasPrefix(header.Get("Content-Type"), "application/problem+json") {
			if status >= 400 {
				return fmt.Errorf("outside the document (%v), answered %q, not application/problem+json", err, header.Get("Content-Type"))
			}
			return nil
		}
		if !whole {
			return nil
		}
		value, err := openapi3filter.JSONBodyDecoder(bytes.NewReader(body), header, v.problem, nil)
		if err != nil {
			return fmt.Errorf("problem body: %w", err)
		}
		if err := v.problem.Value.VisitJSON(value, openapi3.EnableJSONSchema2020(), openapi3.VisitAsResponse()); err != nil {
			return fmt.Errorf("problem body doesn't match components/schemas/Problem: %w", err)
		}
		return nil
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: match, PathParams: params, Route: route},
		Status:                 status,
		Header:                 header,
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true, ExcludeResponseBody: !whole},
	}
	in.SetBodyBytes(body)
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		return fmt.Errorf("%s %s: %w", route.Method, route.Path, err)
	}
	if err := oasProblemType(route.Operation, status, header, body, whole && req.Method != http.MethodHead); err != nil {
		return fmt.Errorf("%s %s: %w", route.Method, route.Path, err)
	}
	return nil
}

// oasProblemType checks a problem answer's slug: it is one the response
// lists in x-fcd-problem-types, and the Fcd-Problem header carries it, as
// the document's description says of every problem answer. A body not
// read whole, or a HEAD answer's, is not looked at (whole false).
func oasProblemType(op *openapi3.Operation, status int, header http.Header, body []byte, whole bool) error {
	if !whole || !strings.HasPrefix(header.Get("Content-Type"), "application/problem+json") {
		return nil
	}
	var p struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(body, &p); err != nil {
		return fmt.Errorf("problem body: %w", err)
	}
	slug, ok := strings.CutPrefix(p.Type, api.ProblemBase)
	if !ok {
		return fmt.Errorf("problem type %q is not under %s", p.Type, api.ProblemBase)
	}
	if got := header.Get("Fcd-Problem"); got != slug {
		return fmt.Errorf("problem %s: Fcd-Problem header %q", slug, got)
	}
	ref := op.Responses.Status(status)
	if ref == nil || ref.Value == nil {
		return nil // reported by ValidateResponse
	}
	listed, _ := ref.Value.Extensions["x-fcd-problem-types"].([]any)
	for _, l := range listed {
		if l == slug {
			return nil
		}
	}
	return fmt.Errorf("problem %s is not in the %d response's x-fcd-problem-types %v", slug, status, listed)
}

// oasOpen are the object schemas oasClose leaves open, by name, with why.
var oasOpen = map[string]string{}

// oasClose makes the document's object schemas closed for the validator:
// an object schema that lists properties and says nothing of others
// (no additionalProperties, patternProperties or unevaluatedProperties)
// gets additionalProperties: false, so that a member the server answers
// and the document does not list is reported. An allOf branch stays open
// (each branch is checked alone, and would refuse its siblings' members),
// and so does an object built with allOf; they are listed in oasOpen.
// First, a component built with allOf of plain object schemas is
// flattened into one (the union of their properties and required
// members), so that it and its branches can be closed too.
func oasClose(doc *openapi3.T) {
	for _, ref := range doc.Components.Schemas {
		oasFlatten(ref.Value)
	}
	branches := map[*openapi3.Schema]bool{}
	seen := map[*openapi3.Schema]bool{}
	var all []*openapi3.Schema
	var walk func(ref *openapi3.SchemaRef)
	walk = func(ref *openapi3.SchemaRef) {
		if ref == nil || ref.Value == nil || seen[ref.Value] {
			return
		}
		sc := ref.Value
		seen[sc] = true
		all = append(all, sc)
		for _, b := range sc.AllOf {
			if b.Value != nil {
				branches[b.Value] = true
			}
			walk(b)
		}
		for _, refs := range []openapi3.SchemaRefs{sc.AnyOf, sc.OneOf} {
			for _, b := range refs {
				walk(b)
			}
		}
		for _, p := range sc.Properties {
			walk(p)
		}
		for _, p := range sc.PatternProperties {
			walk(p)
		}
		walk(sc.Items)
		walk(sc.AdditionalProperties.Schema)
	}
	for _, ref := range doc.Components.Schemas {
		walk(ref)
	}
	for _, resp := range doc.Components.Responses {
		for _, mt := range resp.Value.Content {
			walk(mt.Schema)
		}
	}
	for _, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			for _, resp := range op.Responses.Map() {
				for _, mt := range resp.Value.Content {
					walk(mt.Schema)
				}
			}
		}
	}
	names := map[*openapi3.Schema]string{}
	for name, ref := range doc.Components.Schemas {
		names[ref.Value] = name
	}
	for _, sc := range all {
		switch {
		case len(sc.Properties) == 0:
		case sc.AdditionalProperties.Has != nil || sc.AdditionalProperties.Schema != nil ||
			len(sc.PatternProperties) != 0 || sc.UnevaluatedProperties.Has != nil || sc.UnevaluatedProperties.Schema != nil:
		case branches[sc]:
			if name := names[sc]; name != "" {
				oasOpen[name] = "an allOf branch"
			}
		default:
			sc.AdditionalProperties.Has = openapi3.Ptr(false)
		}
	}
	for _, sc := range all {
		if len(sc.AllOf) != 0 && names[sc] != "" {
			oasOpen[names[sc]] = "built with allOf"
		}
	}
}

// oasFlatten replaces sc's allOf with the members of its branches when
// every branch is a plain object schema (properties, required, nothing
// composed or open-ended).
func oasFlatten(sc *openapi3.Schema) {
	if len(sc.AllOf) == 0 || len(sc.AnyOf)+len(sc.OneOf) != 0 || sc.Not != nil {
		return
	}
	props := openapi3.Schemas{}
	required := slices.Clone(sc.Required)
	for name, p := range sc.Properties {
		props[name] = p
	}
	for _, b := range sc.AllOf {
		v := b.Value
		if v == nil || len(v.AllOf)+len(v.AnyOf)+len(v.OneOf) != 0 || v.Not != nil || len(v.Properties) == 0 ||
			v.AdditionalProperties.Has != nil || v.AdditionalProperties.Schema != nil || len(v.PatternProperties) != 0 {
			return
		}
		for name, p := range v.Properties {
			if _, dup := props[name]; dup {
				return
			}
			props[name] = p
		}
		required = append(required, v.Required...)
	}
	sc.AllOf = nil
	sc.Type = &openapi3.Types{openapi3.TypeObject}
	sc.Properties = props
	sc.Required = required
}

// oasCheckRecorded validates an answer a test got by calling a handler
// directly (httptest.NewRecorder), as oasTransport does over HTTP.
func oasCheckRecorded(t testing.TB, req *http.Request, rec *httptest.ResponseRecorder) {
	t.Helper()
	v, err := oasDoc()
	if err != nil {
		t.Fatal(err)
	}
	if err := v.validate(req, rec.Code, rec.Header(), rec.Body.Bytes(), true); err != nil {
		t.Errorf("openapi: %s %s answered %d: %v", req.Method, req.URL.RequestURI(), rec.Code, err)
	}
}

// oasReporter is where a watched server's mismatches go: the test that
// started it (or, in TestOpenAPIValidatorFails, a collector).
type oasReporter interface {
	Errorf(format string, args ...any)
}

// oasWatched is a server whose answers are validated.
type oasWatched struct {
	mu     sync.Mutex
	to     oasReporter
	closed bool // the test has ended: nothing more is reported
}

func (w *oasWatched) report(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.to.Errorf(format, args...)
	}
}

var (
	oasWatchMu sync.Mutex
	oasWatches = map[string]*oasWatched{} // by host:port
)

// oasWatch validates every answer of the server at base (its URL) that
// the test gets over http.DefaultTransport until the test ends, reporting
// mismatches to to (t itself, usually).
func oasWatch(t testing.TB, base string, to oasReporter) {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil || u.Host == "" {
		t.Fatalf("oasWatch: %q is not a server URL", base)
	}
	if _, err := oasDoc(); err != nil {
		t.Fatal(err)
	}
	w := &oasWatched{to: to}
	oasWatchMu.Lock()
	oasWatches[u.Host] = w
	oasWatchMu.Unlock()
	t.Cleanup(func() {
		oasWatchMu.Lock()
		if oasWatches[u.Host] == w {
			delete(oasWatches, u.Host)
		}
		oasWatchMu.Unlock()
		w.mu.Lock()
		w.closed = true
		w.mu.Unlock()
	})
}

// oasTransport validates the answers of watched servers.
type oasTransport struct{ next http.RoundTripper }

func (tr oasTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	oasWatchMu.Lock()
	w := oasWatches[req.URL.Host]
	oasWatchMu.Unlock()
	resp, err := tr.next.RoundTrip(req)
	if w == nil || err != nil {
		return resp, err
	}
	// The body is validated as the caller reads it, once it has read it
	// all: a caller may act on the headers before the body is complete.
	resp.Body = &oasBody{ReadCloser: resp.Body, length: resp.ContentLength, check: func(body []byte, whole bool) {
		v, err := oasDoc()
		if err != nil {
			w.report("openapi: %v", err)
			return
		}
		if err := v.validate(req, resp.StatusCode, resp.Header, body, whole); err != nil {
			w.report("openapi: %s %s answered %d: %v", req.Method, req.URL.RequestURI(), resp.StatusCode, err)
		}
	}}
	return resp, nil
}

// oasBody keeps what is read and validates it once, at EOF or Close.
type oasBody struct {
	io.ReadCloser
	buf    bytes.Buffer
	length int64 // the answer's Content-Length, -1 if unknown
	once   sync.Once
	check  func(body []byte, whole bool)
}

func (b *oasBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.buf.Write(p[:n])
	if errors.Is(err, io.EOF) {
		b.once.Do(func() { b.check(b.buf.Bytes(), true) })
	}
	return n, err
}

func (b *oasBody) Close() error {
	// A body read to its Content-Length without seeing EOF is whole too.
	whole := b.length >= 0 && int64(b.buf.Len()) == b.length
	b.once.Do(func() { b.check(b.buf.Bytes(), whole) })
	return b.ReadCloser.Close()
}

// oasCollected collects what a watched server's validation reports.
type oasCollected struct {
	mu   sync.Mutex
	msgs []string
}

func (c *oasCollected) Errorf(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msgs = append(c.msgs, fmt.Sprintf(format, args...))
}

func (c *oasCollected) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.msgs
	c.msgs = nil
	return out
}

// TestOpenAPIValidatorFails proves the validator reports what the document
// does not declare: a server that answers each case below is watched with
// a collector in place of the test, and each answer must be reported (or,
// for the answers that match the document, not).
func TestOpenAPIValidatorFails(t *testing.T) {
	answers := map[string]func(w http.ResponseWriter){
		"/healthz": func(w http.ResponseWriter) { // ok
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"status":"ok"}`)
		},
		"/healthz?member": func(w http.ResponseWriter) { // a value the schema refuses
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"status":"fine"}`)
		},
		"/healthz?extra": func(w http.ResponseWriter) { // an undeclared member
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"status":"ok","uptime":7}`)
		},
		"/readyz?slug": func(w http.ResponseWriter) { // a slug the response does not list
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Fcd-Problem", "internal")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"type":"`+api.ProblemBase+`internal","title":"Internal","status":503}`)
		},
		"/readyz?header": func(w http.ResponseWriter) { // no Fcd-Problem header
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"type":"`+api.ProblemBase+`not-ready","title":"Not ready","status":503}`)
		},
		"/healthz?status": func(w http.ResponseWriter) { // an undeclared status
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTeapot)
			_, _ = io.WriteString(w, `{"status":"ok"}`)
		},
		"/healthz?type": func(w http.ResponseWriter) { // an undeclared content type
			w.Header().Set("Content-Type", "text/plain")
			_, _ = io.WriteString(w, `ok`)
		},
		"/healthz?internal": func(w http.ResponseWriter) { // 500, any route's, as a problem: ok
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Fcd-Problem", "internal")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, `{"type":"`+api.ProblemBase+`internal","title":"Internal","status":500}`)
		},
		"/healthz?problem": func(w http.ResponseWriter) { // 500 with a problem lacking its type
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, `{"title":"Internal","status":500}`)
		},
		"/nowhere": func(w http.ResponseWriter) { // outside the document, a problem: ok
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"type":"`+api.ProblemBase+`not-found","title":"Not found","status":404}`)
		},
		"/nowhere?problem": func(w http.ResponseWriter) { // outside the document, a bad problem
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"type":"`+api.ProblemBase+`not-found","status":"404"}`)
		},
		"/v1/ext_authz/a/b": func(w http.ResponseWriter) { // a problem's headers, for HEAD: ok
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Fcd-Problem", "forbidden-role")
			w.WriteHeader(http.StatusForbidden)
		},
		"/nowhere?plain": func(w http.ResponseWriter) { // outside the document, no problem
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `not found`)
		},
	}
	// The schemas the check cannot close are known, and printed.
	if _, err := oasDoc(); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	if !maps.Equal(oasOpen, want) {
		t.Errorf("schemas left open for undeclared members: %v, want %v (a new allOf? its members are checked only by their branch)", oasOpen, want)
	}
	t.Logf("schemas left open for undeclared members: %v", oasOpen)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		answers[r.URL.RequestURI()](w)
	}))
	defer srv.Close()
	got := &oasCollected{}
	oasWatch(t, srv.URL, got)
	for target, want := range map[string]string{
		"/healthz":          "",
		"/healthz?member":   "response body doesn't match schema",
		"/healthz?extra":    "uptime",
		"/readyz?slug":      "problem internal is not in the 503 response's x-fcd-problem-types [not-ready]",
		"/readyz?header":    `Fcd-Problem header ""`,
		"/healthz?status":   "status is not supported",
		"/healthz?type":     "text/plain",
		"/healthz?internal": "",
		"/healthz?problem":  `property "type" is missing`,
		"/nowhere":          "",
		"/nowhere?problem":  "components/schemas/Problem",
		"/nowhere?plain":    "not application/problem+json",
	} {
		r := apitest.Do(t, "GET", srv.URL+target, "", nil, nil)
		msgs := got.take()
		switch {
		case want == "" && len(msgs) != 0:
			t.Errorf("GET %s (%d) is reported: %q", target, r.Status, msgs)
		case want != "" && (len(msgs) != 1 || !strings.Contains(msgs[0], want) || !strings.Contains(msgs[0], "GET "+target+" answered")):
			t.Errorf("GET %s (%d): reported %q, want one report naming it and containing %q", target, r.Status, msgs, want)
		}
	}
	if r := apitest.Do(t, "HEAD", srv.URL+"/v1/ext_authz/a/b", "", nil, nil); r.Status != http.StatusForbidden {
		t.Errorf("HEAD /v1/ext_authz/a/b: %d", r.Status)
	}
	if msgs := got.take(); len(msgs) != 0 {
		t.Errorf("HEAD /v1/ext_authz/a/b is reported: %q", msgs)
	}
}
