package api_test

import (
	"net/http"
	"testing"

	"github.com/fcd-authz/fcd/authz"
)

// TestGatewayCallerBinding: with the binding on (authzd's default), a
// formation is admitted through a gateway only for the caller the gateway
// authenticated, and only if that caller is the formation's principal —
// knowing a formation id is not enough. Identities compare trimmed, NFC
// and case-folded.
func TestGatewayCallerBinding(t *testing.T) {
	f := newFixtureBinding(t, 0, authz.CallerPrincipal)
	snap := f.registerAndSnapshot()
	f.waitPublished()
	gwc := f.creds["gateway"]
	const args = `{"owner":"octo","repo":"demo"}`
	form := func(session, principal string) string {
		r := f.do("POST", "/v1/formations", "host", formationBody(snap, session, "github/get_repository", args, principal))
		f.expect(r, http.StatusCreated, "")
		return r.Body["id"].(string)
	}

	id := form("b1", "alice")
	for _, tc := range []struct {
		note    string
		route   string
		headers map[string]string
	}{
		{"forward_auth, no caller", "/v1/forward_auth", map[string]string{"Fcd-Formation": id}},
		{"forward_auth, another caller", "/v1/forward_auth", map[string]string{"Fcd-Formation": id, "Fcd-Caller": "bob"}},
		{"forward_auth, a caller that only looks alike", "/v1/forward_auth", map[string]string{"Fcd-Formation": id, "Fcd-Caller": "alicе"}}, // Cyrillic е
		{"ext_authz, another caller", "/v1/ext_authz/mcp", map[string]string{"Fcd-Formation": id, "Fcd-Caller": "mallory"}},
	} {
		t.Run(tc.note, func(t *testing.T) {
			f.t = t
			method := "GET"
			if tc.route != "/v1/forward_auth" {
				method = "POST"
			}
			f.denied(f.gw(method, tc.route, gwc, tc.headers, nil), http.StatusForbidden, "caller-mismatch", id)
		})
	}
	f.t = t
	if r := f.do("GET", "/v1/formations/"+id, "host", nil); r.Body["status"] != "ready" {
		t.Fatalf("refused callers changed the formation: %s", r.Raw)
	}
	// The principal, as the gateway spells it after its own authentication.
	c := f.allowed(f.gw("GET", "/v1/forward_auth", gwc, map[string]string{"Fcd-Formation": id, "Fcd-Caller": " Alice "}, nil),
		"github/get_repository", args)
	if c.Formation != id {
		t.Fatalf("admitted %+v", c)
	}
	// Through ext_authz too.
	id2 := form("b2", "alice")
	f.allowed(f.gw("POST", "/v1/ext_authz/mcp", gwc, map[string]string{"Fcd-Formation": id2, "Fcd-Caller": "alice"}, nil),
		"github/get_repository", args)

	// One step: the principal is the caller; another Fcd-Principal is
	// refused and nothing is formed.
	oneStep := map[string]string{"Fcd-Snapshot": snap, "Fcd-Session": "b3", "Fcd-Server": "github", "Content-Type": "application/json"}
	body := toolsCall("get_repository", args, "")
	with := func(extra map[string]string) map[string]string {
		h := map[string]string{}
		for k, v := range oneStep {
			h[k] = v
		}
		for k, v := range extra {
			h[k] = v
		}
		return h
	}
	f.denied(f.gw("POST", "/v1/ext_authz/mcp", gwc, with(nil), body), http.StatusForbidden, "caller-mismatch", "")
	f.denied(f.gw("POST", "/v1/ext_authz/mcp", gwc, with(map[string]string{"Fcd-Caller": "bob", "Fcd-Principal": "alice"}), body),
		http.StatusForbidden, "caller-mismatch", "")
	if r := f.do("GET", "/v1/formations", "approver", nil); len(r.Body["formations"].([]any)) != 2 {
		t.Fatalf("a refused one-step call was formed: %s", r.Raw)
	}
	ok := f.gw("POST", "/v1/ext_authz/mcp", gwc, with(map[string]string{"Fcd-Caller": "bob"}), body)
	f.allowed(ok, "github/get_repository", args)
	formed := f.do("GET", "/v1/formations/"+ok.Header.Get("Fcd-Formation"), "host", nil)
	if p := formed.Body["principal"].(map[string]any); p["id"] != "bob" {
		t.Fatalf("one-step principal %v, want the caller", p)
	}
}

// TestSelfApprovalAfterNormalization: the principal who formed a call
// cannot approve it under another spelling of the same id (trailing space,
// letter case, another Unicode normal form).
func TestSelfApprovalAfterNormalization(t *testing.T) {
	f := newFixture(t, 0)
	snap := f.registerAndSnapshot()
	for _, principal := range []string{"alice ", "ALICE", " Alice\t", "Alice"} {
		r := f.do("POST", "/v1/formations", "host", formationBody(snap, "sa", "github/create_repository", `{"name":"x"}`, principal))
		f.expect(r, http.StatusCreated, "")
		path := "/v1/formations/" + r.Body["id"].(string) + "/approvals"
		f.expect(f.doAs("POST", path, f.byID["alice"], approvalBody("approve", r.Body["digest"].(string))), http.StatusForbidden, "self-approval")
	}
}
