package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/authz/policy"
	"github.com/fcd-authz/fcd/internal/authztest"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/record"
	"github.com/go-chi/chi/v5"
	"sigs.k8s.io/yaml"
)

// oasRoute is one (method, path template) pair, with path parameters written
// as OpenAPI writes them: {name}.
type oasRoute struct{ method, path string }

func (r oasRoute) String() string { return r.method + " " + r.path }

// oasOperation is the part of an OpenAPI operation the tests check.
type oasOperation struct {
	OperationID string                     `json:"operationId"`
	Roles       []string                   `json:"x-fcd-roles"`
	Security    []map[string][]string      `json:"security"`
	Parameters  []map[string]any           `json:"parameters"`
	Responses   map[string]json.RawMessage `json:"responses"`
}

// oasMethods are the operation keys of an OpenAPI path item.
var oasMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// noDecider is a Decider for a router whose use cases are never called.
type noDecider struct{}

func (noDecider) Decide(context.Context, *policy.Input) record.Decision {
	return record.Decision{Verdict: record.VerdictDeny}
}

func (noDecider) Digest() string { return "" }

// oasRouter builds the real router over a registry and use cases without
// a store. The walk never calls them; a probe that passes the role check and
// reaches the store panics, which the router's recovery answers with 500,
// and the role probe counts as admitted. It returns one secret per role.
func oasRouter(t *testing.T) (http.Handler, map[api.Role]api.Secret) {
	t.Helper()
	secrets := map[api.Role]api.Secret{}
	var creds []api.Credential
	for _, role := range api.Roles() {
		s, c, err := api.NewCredential("test-"+string(role), role)
		if err != nil {
			t.Fatal(err)
		}
		secrets[role] = s
		creds = append(creds, c)
	}
	auth, err := api.NewAuthenticator(creds)
	if err != nil {
		t.Fatal(err)
	}
	h, err := api.New(api.Config{
		// A store that was never opened: the walk never reaches it (a
		// probe that does panics and is answered 500, see above).
		Registry: authztest.Registry(t, authz.RegistryConfig{Store: new(lease.Store)}),
		UseCases: authztest.New(t, authz.Config{Store: new(lease.Store), Decider: noDecider{}}),
		Auth:     auth,
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	return h, secrets
}

var oasChiRegexParam = regexp.MustCompile(`\{([^{}:]+):[^{}]*\}`)

// oasCatchAll is how the document writes chi's catch-all "/*" (the rest of
// the path, slashes included): a path parameter named path.
const oasCatchAll = "/{path}"

// oasServed walks the router and returns what it serves.
func oasServed(t *testing.T, h http.Handler) map[oasRoute]bool {
	t.Helper()
	rs, ok := h.(chi.Routes)
	if !ok {
		t.Fatalf("api.New returned %T, not a chi.Routes", h)
	}
	out := map[oasRoute]bool{}
	err := chi.Walk(rs, func(method, path string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		path = oasChiRegexParam.ReplaceAllString(path, "{$1}")
		if rest, ok := strings.CutSuffix(path, "/*"); ok {
			path = rest + oasCatchAll
		}
		if len(path) > 1 {
			path = strings.TrimSuffix(path, "/")
		}
		out[oasRoute{strings.ToUpper(method), path}] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatal("the router serves no route")
	}
	return out
}

// oasParse parses the embedded document twice: generically (for $ref
// checks) and into its operations.
func oasParse(t *testing.T) (generic map[string]any, ops map[oasRoute]oasOperation) {
	t.Helper()
	raw := api.OpenAPI()
	if len(raw) == 0 {
		t.Fatal("openapi.yaml is empty")
	}
	if err := yaml.Unmarshal(raw, &generic); err != nil {
		t.Fatalf("openapi.yaml: %v", err)
	}
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("openapi.yaml: %v", err)
	}
	ops = map[oasRoute]oasOperation{}
	for path, item := range doc.Paths {
		for key, v := range item {
			if !slices.Contains(oasMethods, key) {
				continue
			}
			var op oasOperation
			if err := json.Unmarshal(v, &op); err != nil {
				t.Fatalf("openapi.yaml: %s %s: %v", key, path, err)
			}
			ops[oasRoute{strings.ToUpper(key), path}] = op
		}
	}
	return generic, ops
}

func oasSorted(m map[oasRoute]bool) []string {
	var out []string
	for r := range m {
		out = append(out, r.String())
	}
	slices.Sort(out)
	return out
}

// TestOpenAPIMatchesRouter fails for every route the router serves that
// the document lacks, and every documented operation the router lacks.
func TestOpenAPIMatchesRouter(t *testing.T) {
	h, _ := oasRouter(t)
	served := oasServed(t, h)
	_, ops := oasParse(t)

	undocumented, unserved := map[oasRoute]bool{}, map[oasRoute]bool{}
	for r := range served {
		if _, ok := ops[r]; !ok {
			undocumented[r] = true
		}
	}
	for r := range ops {
		if !served[r] {
			unserved[r] = true
		}
	}
	for _, r := range oasSorted(undocumented) {
		t.Errorf("route %s is served but not in api/openapi.yaml", r)
	}
	for _, r := range oasSorted(unserved) {
		t.Errorf("operation %s is in api/openapi.yaml but the router does not serve it", r)
	}
}

// TestOpenAPIDocument checks the document's own consistency.
func TestOpenAPIDocument(t *testing.T) {
	generic, ops := oasParse(t)
	if v, _ := generic["openapi"].(string); !strings.HasPrefix(v, "3.1") {
		t.Errorf("openapi = %q, want 3.1.x", v)
	}
	ids := map[string]oasRoute{}
	pathParam := regexp.MustCompile(`\{([^{}]+)\}`)
	statusKey := regexp.MustCompile(`^([1-5][0-9][0-9]|[1-5]XX|default)$`)
	for r, op := range ops {
		if op.OperationID == "" {
			t.Errorf("%s: no operationId", r)
		} else if prev, dup := ids[op.OperationID]; dup {
			t.Errorf("%s: operationId %q also used by %s", r, op.OperationID, prev)
		}
		ids[op.OperationID] = r
		if len(op.Responses) == 0 {
			t.Errorf("%s: no responses", r)
		}
		for code := range op.Responses {
			if !statusKey.MatchString(code) {
				t.Errorf("%s: response key %q is not a status code", r, code)
			}
		}

		if op.Security == nil {
			t.Errorf("%s: no security requirement (use [] for a public route)", r)
		}
		if strings.HasPrefix(r.path, "/v1/") {
			if len(op.Roles) == 0 {
				t.Errorf("%s: no x-fcd-roles", r)
			}
			for _, role := range op.Roles {
				if !api.Role(role).Valid() {
					t.Errorf("%s: x-fcd-roles names unknown role %q", r, role)
				}
			}
			if !slices.ContainsFunc(op.Security, func(req map[string][]string) bool { _, ok := req["bearer"]; return ok }) {
				t.Errorf("%s: security does not require bearer", r)
			}
			if _, ok := op.Responses["401"]; !ok {
				t.Errorf("%s: no 401 response", r)
			}
			if _, ok := op.Responses["403"]; !ok {
				t.Errorf("%s: no 403 response", r)
			}
		} else if len(op.Security) != 0 || len(op.Roles) != 0 {
			t.Errorf("%s: a route outside /v1 is public: want security [] and no x-fcd-roles", r)
		}

		// Every template parameter is declared as a required path
		// parameter, and no path parameter is declared that the template
		// lacks.
		declared := map[string]bool{}
		for _, p := range op.Parameters {
			if ref, ok := p["$ref"].(string); ok {
				target, err := oasResolve(generic, ref)
				if err != nil {
					t.Errorf("%s: %v", r, err)
					continue
				}
				p, _ = target.(map[string]any)
			}
			if p["in"] == "path" {
				name, _ := p["name"].(string)
				declared[name] = true
				if p["required"] != true {
					t.Errorf("%s: path parameter %q is not required: true", r, name)
				}
			}
		}
		for _, m := range pathParam.FindAllStringSubmatch(r.path, -1) {
			if !declared[m[1]] {
				t.Errorf("%s: path parameter {%s} is not declared", r, m[1])
			}
			delete(declared, m[1])
		}
		for name := range declared {
			t.Errorf("%s: declares path parameter %q the path lacks", r, name)
		}
	}

	// Every $ref resolves.
	var walk func(where string, v any)
	walk = func(where string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				if k == "$ref" {
					ref, _ := e.(string)
					if _, err := oasResolve(generic, ref); err != nil {
						t.Errorf("%s: %v", where, err)
					}
					continue
				}
				walk(where+"/"+k, e)
			}
		case []any:
			for i, e := range v {
				walk(fmt.Sprintf("%s/%d", where, i), e)
			}
		}
	}
	walk("#", generic)
}

// oasResolve follows a local JSON pointer reference ("#/components/...").
func oasResolve(doc map[string]any, ref string) (any, error) {
	rest, ok := strings.CutPrefix(ref, "#/")
	if !ok {
		return nil, fmt.Errorf("$ref %q is not local", ref)
	}
	var cur any = doc
	for _, tok := range strings.Split(rest, "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("$ref %q does not resolve", ref)
		}
		if cur, ok = m[tok]; !ok {
			return nil, fmt.Errorf("$ref %q does not resolve", ref)
		}
	}
	return cur, nil
}

// TestOpenAPIRolesMatchRouter probes every documented operation with a
// credential of each role and with none, and checks that exactly the
// roles of x-fcd-roles pass the role check, and that the security
// requirement matches what the route does without a credential.
func TestOpenAPIRolesMatchRouter(t *testing.T) {
	h, secrets := oasRouter(t)
	_, ops := oasParse(t)
	served := oasServed(t, h)
	param := regexp.MustCompile(`\{[^{}]+\}`)

	for r, op := range ops {
		if !served[r] {
			continue // reported by TestOpenAPIMatchesRouter
		}
		target := param.ReplaceAllString(r.path, "x")
		status, typ := oasProbe(t, h, r.method, target, "")
		if len(op.Security) > 0 {
			if status != http.StatusUnauthorized || typ != api.ProblemBase+"unauthenticated" {
				t.Errorf("%s without a credential: %d %s, want 401 unauthenticated", r, status, typ)
			}
		} else if status == http.StatusUnauthorized || status == http.StatusForbidden {
			t.Errorf("%s is documented public but answers %d %s without a credential", r, status, typ)
		}
		if len(op.Security) == 0 {
			continue
		}
		var admitted []string
		for _, role := range api.Roles() {
			status, typ := oasProbe(t, h, r.method, target, secrets[role])
			switch {
			case status == http.StatusForbidden && typ == api.ProblemBase+"forbidden-role":
			case status == http.StatusUnauthorized && typ == api.ProblemBase+"unauthenticated":
				t.Errorf("%s with a valid %s credential: 401", r, role)
			default:
				admitted = append(admitted, string(role))
			}
		}
		want := slices.Clone(op.Roles)
		slices.Sort(want)
		slices.Sort(admitted)
		if !slices.Equal(admitted, want) {
			t.Errorf("%s: router admits roles %v, x-fcd-roles says %v", r, admitted, want)
		}
	}
}

// oasProbe sends one request and returns its status and problem type. A
// panic (a handler reaching the absent store without the router's own
// recovery) counts as passing the role check: status 0.
func oasProbe(t *testing.T, h http.Handler, method, target string, secret api.Secret) (status int, typ string) {
	t.Helper()
	req := httptest.NewRequest(method, target, nil)
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+string(secret))
	}
	rec := httptest.NewRecorder()
	func() {
		defer func() {
			if recover() != nil {
				status = 0
			}
		}()
		h.ServeHTTP(rec, req)
		status = rec.Code
	}()
	if status != 0 {
		oasCheckRecorded(t, req, rec)
	}
	if strings.HasPrefix(rec.Header().Get("Content-Type"), "application/problem+json") {
		var p struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(rec.Body.Bytes(), &p)
		typ = p.Type
	}
	return status, typ
}

// TestOpenAPIServed checks that /openapi.yaml serves the embedded document.
func TestOpenAPIServed(t *testing.T) {
	h, _ := oasRouter(t)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/openapi.yaml", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /openapi.yaml: %d", rec.Code)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/yaml" {
		t.Errorf("Content-Type %q, want application/yaml", ct)
	}
	if rec.Body.String() != string(api.OpenAPI()) {
		t.Error("GET /openapi.yaml differs from api.OpenAPI()")
	}
}
