package api_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/internal/apitest"
	"github.com/fcd-authz/fcd/internal/usertext"
)

// errTextLimit is the body limit of TestErrorTextNamesTheMember's server,
// small enough to exceed with a test body.
const errTextLimit = 64 << 10

// TestErrorTextNamesTheMember is the table the issue asks for, over the
// HTTP API: every endpoint that takes a JSON body is sent a misspelt
// member, a value of the wrong kind, broken JSON and a body over the
// limit; the manifest and certificate routes an unsigned document, and
// signed manifests with an unknown member, a value of the wrong kind and
// a missing field. Each answer is a problem whose detail names the
// member by JSON Pointer (and errors[].pointer is that pointer), suggests
// the nearest member for an unknown one, and shows no Go type, decoder
// word or repeated layer prefix.
func TestErrorTextNamesTheMember(t *testing.T) {
	f := newFixture(t, errTextLimit)
	example := readExample(t, "v1.4")
	signed := func(from, to string) []byte {
		if !bytes.Contains(example, []byte(from)) {
			t.Fatalf("the example has no %s", from)
		}
		return f.sign(bytes.Replace(example, []byte(from), []byte(to), 1), nil)
	}
	big := []byte(`{"servers":["` + strings.Repeat("x", errTextLimit) + `"]}`)

	type tc struct {
		name   string
		method string
		path   string
		role   api.Role
		body   []byte
		status int
		slug   string
		// pointer is the member the answer must name ("" for the whole
		// body); want are more words the detail must hold.
		pointer string
		want    []string
	}
	var cases []tc
	// Every route with a JSON body: a misspelt member (its nearest known
	// member suggested), the wrong kind of value, broken JSON, too large.
	routes := []struct {
		method, path string
		role         api.Role
		// misspelt is a body with one misspelt member, at pointer; the
		// member meant is near.
		misspelt, pointer, near string
		// wrongKind is a body with a value of the wrong kind at kindAt,
		// which takes takes.
		wrongKind, kindAt, takes string
	}{
		{"POST", "/v1/snapshots", api.RoleHost, `{"server":["github"]}`, "/server", "servers",
			`{"servers":"github"}`, "/servers", "a list of strings"},
		{"POST", "/v1/formations", api.RoleHost, `{"snapshot":"s","tool":"t","argument":{}}`, "/argument", "arguments",
			`{"snapshot":"s","tool":"t","principal":{"id":7}}`, "/principal/id", "a string"},
		{"POST", "/v1/formations/fm_x/recover", api.RoleHost, `{"tol":"github/x"}`, "/tol", "tool",
			`{"tool":["github/x"]}`, "/tool", "a string"},
		{"POST", "/v1/formations/fm_x/approvals", api.RoleApprover, `{"decision":"approve","digests":"x"}`, "/digests", "digest",
			`{"decision":"approve","digest":"x","reason":false}`, "/reason", "a string"},
		{"POST", "/v1/leases/ls_x/claim", api.RoleBackend, `{"claim":"cl_a","epoch":"e","revison":1}`, "/revison", "revision",
			`{"claim":"cl_a","epoch":"e","revision":"1"}`, "/revision", "a whole number"},
		{"POST", "/v1/leases/ls_x/complete", api.RoleBackend, `{"outcom":"effect"}`, "/outcom", "outcome",
			`{"outcome":"effect","admission":[]}`, "/admission", "an object"},
		{"POST", "/v1/leases/outcomes", api.RoleBackend, `{"reports":[{"lease":"ls_a","Outcome":"effect"}]}`, "/reports/0/Outcome", "outcome",
			`{"reports":{"lease":"ls_a"}}`, "/reports", "a list of objects"},
		{"POST", "/v1/leases/ls_x/resolve", api.RoleOperator, `{"outcome":"effect","resolutions":"x"}`, "/resolutions", "resolution",
			`{"outcome":"effect","reason":1.5}`, "/reason", "a string"},
		{"POST", "/v1/pools/github-v1-4/generation", api.RoleOperator, `{"generations":2}`, "/generations", "generation",
			`{"generation":2.5}`, "/generation", "a whole number"},
	}
	for _, r := range routes {
		cases = append(cases,
			tc{r.path + " misspelt member", r.method, r.path, r.role, []byte(r.misspelt), 400, "malformed-json", r.pointer,
				[]string{"not a known member", fmt.Sprintf("did you mean %q", r.near)}},
			tc{r.path + " wrong kind", r.method, r.path, r.role, []byte(r.wrongKind), 400, "malformed-json", r.kindAt,
				[]string{"must be " + r.takes}},
			tc{r.path + " broken JSON", r.method, r.path, r.role, []byte(`{1:2}`), 400, "malformed-json", "",
				[]string{"not valid JSON", "at byte 1"}},
			tc{r.path + " cut short", r.method, r.path, r.role, []byte(`{`), 400, "malformed-json", "",
				[]string{"cut short"}},
			tc{r.path + " too large", r.method, r.path, r.role, big, 413, "body-too-large", "",
				[]string{fmt.Sprint(errTextLimit)}},
		)
	}
	cases = append(cases,
		tc{"formation body not an object", "POST", "/v1/formations", api.RoleHost, []byte(`["s"]`), 400, "malformed-json", "",
			[]string{"must be an object, not a list"}},
		tc{"duplicate member", "POST", "/v1/formations", api.RoleHost, []byte(`{"tool":"a","tool":"b"}`), 400, "malformed-json", "/tool",
			[]string{"appears twice"}},
		tc{"empty body", "POST", "/v1/formations", api.RoleHost, nil, 400, "malformed-json", "", []string{"is empty"}},
		// Signed documents.
		tc{"unsigned manifest", "POST", "/v1/manifests", api.RoleRegistrar, example, 400, "malformed-document", "",
			[]string{"the manifest is not signed", "authzd manifest sign"}},
		tc{"garbage manifest", "POST", "/v1/manifests", api.RoleRegistrar, []byte("hello"), 400, "malformed-document", "",
			[]string{"compact JWS", "authzd manifest sign"}},
		tc{"unsigned certificate", "POST", "/v1/certificates", api.RoleRegistrar, []byte(`{"source":"x"}`), 400, "malformed-document", "",
			[]string{"the certificate is not signed", "authzd cert sign"}},
		tc{"manifest with a misspelt member", "POST", "/v1/manifests", api.RoleRegistrar, signed(`"sideEffects"`, `"sideEffect"`),
			400, "malformed-document", "/tools/0/sideEffect", []string{`did you mean "sideEffects"`}},
		tc{"manifest with a value of the wrong kind", "POST", "/v1/manifests", api.RoleRegistrar, signed(`"requiresApproval": true`, `"requiresApproval": "yes"`),
			400, "malformed-document", "", []string{"/requiresApproval must be true or false, not a string"}},
		tc{"manifest without a pool", "POST", "/v1/manifests", api.RoleRegistrar, signed(`"pool": "github-v1-4"`, `"pool": ""`),
			400, "invalid-manifest", "/pool", []string{"is required"}},
	)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := apitest.Do(t, c.method, f.url+c.path, string(f.creds[c.role]), nil, c.body)
			if r.Status != c.status || r.Body["type"] != api.ProblemBase+c.slug {
				t.Fatalf("%d %v, want %d %s: %s", r.Status, r.Body["type"], c.status, c.slug, r.Raw)
			}
			detail, _ := r.Body["detail"].(string)
			t.Log(detail)
			for _, w := range c.want {
				if !strings.Contains(detail, w) {
					t.Errorf("detail %q, want it to say %q", detail, w)
				}
			}
			if c.pointer != "" {
				if !strings.HasPrefix(detail, c.pointer+" ") && !strings.Contains(detail, " "+c.pointer+" ") {
					t.Errorf("detail %q does not name %s", detail, c.pointer)
				}
				errs, _ := r.Body["errors"].([]any)
				if len(errs) == 0 || errs[0].(map[string]any)["pointer"] != c.pointer {
					t.Errorf("errors %v, want the first at %s", r.Body["errors"], c.pointer)
				}
			}
			if p := usertext.Problems(detail); len(p) > 0 {
				t.Errorf("detail %q: %s", detail, strings.Join(p, "; "))
			}
			if strings.Contains(detail, "authz: ") || strings.Contains(detail, "manifest: ") || strings.Contains(detail, "lease: ") {
				t.Errorf("detail %q carries a layer prefix", detail)
			}
		})
	}
}
