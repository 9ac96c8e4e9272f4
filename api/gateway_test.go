package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/internal/apitest"
)

// gw sends a gateway request with headers (and a body, or nil).
func (f *fixture) gw(method, path string, secret api.Secret, headers map[string]string, body []byte) reply {
	f.t.Helper()
	return apitest.Do(f.t, method, f.url+path, string(secret), headers, body)
}

// denied checks a gateway refusal: status, problem type, the Fcd-Problem
// header, and the formation named in header and body when formation is
// not empty.
func (f *fixture) denied(r reply, status int, slug, formation string) {
	f.t.Helper()
	f.expect(r, status, slug)
	if got := r.Header.Get("Fcd-Problem"); got != slug {
		f.t.Fatalf("Fcd-Problem %q, want %q", got, slug)
	}
	if r.Body["status"] != float64(status) {
		f.t.Fatalf("problem status member %v, want %d: %s", r.Body["status"], status, r.Raw)
	}
	if r.Header.Get(fencecheck.Header) != "" || r.Header.Get(fencecheck.TargetHeader) != "" {
		f.t.Fatalf("refusal carries a token or target: %v", r.Header)
	}
	if formation != "" && (r.Header.Get("Fcd-Formation") != formation || r.Body["formation"] != formation) {
		f.t.Fatalf("refusal does not name formation %s: header %q, body %s", formation, r.Header.Get("Fcd-Formation"), r.Raw)
	}
}

// passed checks a pass without a token (session traffic).
func (f *fixture) passed(r reply) {
	f.t.Helper()
	f.expect(r, http.StatusOK, "")
	if r.Header.Get(fencecheck.Header) != "" || r.Header.Get(fencecheck.TargetHeader) != "" || len(r.Raw) != 0 {
		f.t.Fatalf("session traffic got a token, target or body: %v %s", r.Header, r.Raw)
	}
}

// allowed checks an admission answered to a gateway, verifies its token
// as the backend's fencecheck would for the call (tool, arguments), and
// returns its claims.
func (f *fixture) allowed(r reply, tool, args string) *fencecheck.Claims {
	f.t.Helper()
	f.expect(r, http.StatusOK, "")
	if len(r.Raw) != 0 || r.Header.Get("Cache-Control") != "no-store" {
		f.t.Fatalf("allow: body %q, Cache-Control %q", r.Raw, r.Header.Get("Cache-Control"))
	}
	if got := r.Header.Get(fencecheck.TargetHeader); got != "github-v1-4" {
		f.t.Fatalf("Fcd-Target %q", got)
	}
	return f.verifyToken(r.Header.Get(fencecheck.Header), tool, args)
}

// verifyToken verifies a dispatch token with a fresh fencecheck.Verifier
// of the v1.4 pool that fetches authzd's JWKS.
func (f *fixture) verifyToken(token, tool, args string) *fencecheck.Claims {
	f.t.Helper()
	ep := f.do("GET", "/v1/epochs", api.RoleOperator, nil)
	var list struct {
		Epochs []struct {
			Pool         string `json:"pool"`
			ConfigDigest string `json:"configDigest"`
			Artifact     struct {
				Digest string `json:"digest"`
			} `json:"artifact"`
		} `json:"epochs"`
	}
	if err := json.Unmarshal(ep.Raw, &list); err != nil {
		f.t.Fatal(err)
	}
	// A dry check of the token's content: offline, judging leases admitted
	// before it like any other, and claiming nothing (the same formation is
	// admitted again by the tests).
	v := &fencecheck.Verifier{Pool: "github-v1-4", Issuer: "fcd-test", JWKSURL: f.url + "/.well-known/jwks.json", Started: time.Unix(0, 0)}
	for _, e := range list.Epochs {
		if e.Pool == v.Pool {
			v.Artifact, v.Config = e.Artifact.Digest, e.ConfigDigest
		}
	}
	if err := v.Validate(); err != nil {
		f.t.Fatalf("verifier: %v (epochs %s)", err, ep.Raw)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := v.Verify(ctx, token, tool, json.RawMessage(args))
	if err != nil {
		f.t.Fatalf("token does not verify for %s %s: %v", tool, args, err)
	}
	return c
}

func toolsCall(name, args, meta string) []byte {
	m := ""
	if meta != "" {
		m = fmt.Sprintf(`,"_meta":{"dev.fcd/formation":%q}`, meta)
	}
	return []byte(fmt.Sprintf(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":%q,"arguments":%s%s}}`, name, args, m))
}

func TestForwardAuth(t *testing.T) {
	f, snap := newReadyFixture(t)
	gwc := f.creds[api.RoleGateway]
	const readArgs = `{"owner":"octo","repo":"demo"}`

	read := f.do("POST", "/v1/formations", api.RoleHost, formationBody(snap, "s1", "github/get_repository", readArgs, ""))
	f.expect(read, http.StatusCreated, "")
	id := read.Body["id"].(string)

	// The formation sent on every request of a session (an SDK's custom
	// header): its GET stream and DELETE are never a tools/call — always a
	// POST — and pass without admitting it, nor does a POST its
	// Mcp-Method shows is another method.
	for _, h := range []map[string]string{
		{"Fcd-Formation": id, "X-Original-Method": "GET", "X-Original-URI": "/mcp"},
		{"Fcd-Formation": id, "X-Forwarded-Method": "DELETE", "X-Forwarded-Uri": "/mcp"},
		{"Fcd-Formation": id, "X-Original-Method": "POST", "Mcp-Method": "notifications/initialized"},
	} {
		f.passed(f.gw("GET", "/v1/forward_auth", gwc, h, nil))
	}
	if st := f.do("GET", "/v1/formations/"+id, api.RoleHost, nil).Body["status"]; st != "ready" {
		t.Fatalf("session traffic admitted the formation: %v", st)
	}

	// nginx: X-Original-*.
	nginx := map[string]string{"Fcd-Formation": id, "X-Original-Method": "POST", "X-Original-URI": "/mcp"}
	a := f.gw("GET", "/v1/forward_auth", gwc, nginx, nil)
	c := f.allowed(a, "github/get_repository", readArgs)
	if c.Formation != id || a.Header.Get("Fcd-Formation") != id {
		t.Fatalf("claims %+v, Fcd-Formation %q", c, a.Header.Get("Fcd-Formation"))
	}
	// Caddy and Traefik: X-Forwarded-*; the same formation again gets the
	// same lease.
	caddy := map[string]string{"Fcd-Formation": id, "X-Forwarded-Method": "POST", "X-Forwarded-Uri": "/mcp"}
	if again := f.allowed(f.gw("GET", "/v1/forward_auth", gwc, caddy, nil), "github/get_repository", readArgs); again.ID != c.ID {
		t.Fatalf("re-admission: lease %s, want %s", again.ID, c.ID)
	}

	// Session traffic passes without a token: initialize, tools/list (named
	// by Mcp-Method or not at all), a GET stream, DELETE.
	for _, h := range []map[string]string{
		{"X-Original-Method": "POST", "X-Original-URI": "/mcp", "Mcp-Method": "initialize"},
		{"X-Forwarded-Method": "POST", "X-Forwarded-Uri": "/mcp", "Mcp-Method": "tools/list"},
		{"X-Original-Method": "POST", "X-Original-URI": "/mcp"},
		{"X-Forwarded-Method": "GET", "X-Forwarded-Uri": "/mcp"},
		{"X-Original-Method": "DELETE", "X-Original-URI": "/mcp"},
	} {
		f.passed(f.gw("GET", "/v1/forward_auth", gwc, h, nil))
	}
	// A tools/call named by Mcp-Method needs a formation.
	f.denied(f.gw("GET", "/v1/forward_auth", gwc, map[string]string{"Mcp-Method": "tools/call", "Mcp-Name": "get_repository"}, nil),
		http.StatusForbidden, "formation-required", "")
	f.denied(f.gw("GET", "/v1/forward_auth", gwc, map[string]string{"Mcp-Method": " Tools/Call "}, nil),
		http.StatusForbidden, "formation-required", "")

	// Credentials: 401 without one, 403 with another role; the type and
	// Fcd-Problem say which.
	noCred := f.gw("GET", "/v1/forward_auth", "", nginx, nil)
	f.denied(noCred, http.StatusUnauthorized, "unauthenticated", "")
	if noCred.Header.Get("WWW-Authenticate") == "" {
		t.Fatal("401 without WWW-Authenticate")
	}
	f.denied(f.gw("GET", "/v1/forward_auth", "fcd_gateway_forged", nginx, nil), http.StatusUnauthorized, "unauthenticated", "")
	f.denied(f.gw("GET", "/v1/forward_auth", f.creds[api.RoleHost], nginx, nil), http.StatusForbidden, "forbidden-role", "")

	// Every other refusal is 403 on forward-auth, whatever its own status;
	// the type keeps the cause.
	write := f.do("POST", "/v1/formations", api.RoleHost, formationBody(snap, "s2", "github/create_repository", `{"name":"x"}`, "alice"))
	wid := write.Body["id"].(string)
	f.denied(f.gw("GET", "/v1/forward_auth", gwc, map[string]string{"Fcd-Formation": wid}, nil), http.StatusForbidden, "not-approved", wid)
	del := f.do("POST", "/v1/formations", api.RoleHost, formationBody(snap, "s2", "github/delete_repository", readArgs, "alice"))
	did := del.Body["id"].(string)
	f.denied(f.gw("GET", "/v1/forward_auth", gwc, map[string]string{"Fcd-Formation": did}, nil), http.StatusForbidden, "formation-denied", did)
	f.denied(f.gw("GET", "/v1/forward_auth", gwc, map[string]string{"Fcd-Formation": "fm_nope"}, nil), http.StatusForbidden, "formation-not-found", "fm_nope")
	long := f.gw("GET", "/v1/forward_auth", gwc, map[string]string{"Fcd-Formation": strings.Repeat("x", 300)}, nil)
	f.denied(long, http.StatusForbidden, "invalid-request", "")
	if long.Header.Get("Fcd-Formation") != "" {
		t.Fatal("an invalid formation id is echoed")
	}
	twice := f.gw("GET", "/v1/forward_auth", gwc, nil, nil)
	f.expect(twice, http.StatusOK, "") // no formation at all: session traffic
	req, _ := http.NewRequest("GET", f.url+"/v1/forward_auth", nil)
	req.Header.Set("Authorization", "Bearer "+string(gwc))
	req.Header.Add("Fcd-Formation", id)
	req.Header.Add("Fcd-Formation", wid)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || resp.Header.Get("Fcd-Problem") != "invalid-parameter" {
		t.Fatalf("two Fcd-Formation headers: %d %s", resp.StatusCode, resp.Header.Get("Fcd-Problem"))
	}
	// A route nginx reaches with the wrong method is still 401/403.
	f.denied(f.gw("POST", "/v1/forward_auth", gwc, nginx, nil), http.StatusForbidden, "method-not-allowed", "")

	// Draining: 403 (not 409), Retry-After kept.
	r2 := f.do("POST", "/v1/formations", api.RoleHost, formationBody(snap, "s3", "github/get_repository", readArgs, ""))
	r2id := r2.Body["id"].(string)
	epoch := read.Body["source"].(map[string]any)["epoch"].(string)
	f.expect(f.do("POST", "/v1/epochs/"+epoch+"/drain", api.RoleOperator, nil), http.StatusOK, "")
	dr := f.gw("GET", "/v1/forward_auth", gwc, map[string]string{"Fcd-Formation": r2id}, nil)
	f.denied(dr, http.StatusForbidden, "source-draining", r2id)
	if dr.Header.Get("Retry-After") != "5" {
		t.Fatalf("source-draining on forward-auth without Retry-After: %v", dr.Header)
	}
	// Session traffic still passes: it needs no epoch.
	f.passed(f.gw("GET", "/v1/forward_auth", gwc, map[string]string{"Mcp-Method": "tools/list"}, nil))
}

func TestExtAuthzHTTP(t *testing.T) {
	f, snap := newReadyFixture(t)
	gwc := f.creds[api.RoleGateway]
	const readArgs = `{"owner":"octo","repo":"demo"}`
	oneStep := func(session string, extra map[string]string) map[string]string {
		h := map[string]string{"Fcd-Snapshot": snap, "Fcd-Session": session, "Content-Type": "application/json"}
		for k, v := range extra {
			h[k] = v
		}
		return h
	}

	// The formation in a header; the original request's path follows the
	// prefix.
	read := f.do("POST", "/v1/formations", api.RoleHost, formationBody(snap, "s1", "github/get_repository", readArgs, ""))
	id := read.Body["id"].(string)
	a := f.gw("POST", "/v1/ext_authz/mcp?x=1", gwc, map[string]string{"Fcd-Formation": id}, toolsCall("get_repository", readArgs, ""))
	if c := f.allowed(a, "github/get_repository", readArgs); c.Formation != id {
		t.Fatalf("claims %+v", c)
	}

	// The formation in params._meta of the body Envoy forwards.
	read2 := f.do("POST", "/v1/formations", api.RoleHost, formationBody(snap, "s1", "github/get_repository", `{"owner":"octo","repo":"two"}`, ""))
	id2 := read2.Body["id"].(string)
	m := f.gw("POST", "/v1/ext_authz/mcp", gwc, nil, toolsCall("get_repository", `{"owner":"octo","repo":"two"}`, id2))
	if c := f.allowed(m, "github/get_repository", `{"owner":"octo","repo":"two"}`); c.Formation != id2 {
		t.Fatalf("claims %+v", c)
	}
	// Header and _meta naming different formations: refused.
	f.denied(f.gw("POST", "/v1/ext_authz/mcp", gwc, map[string]string{"Fcd-Formation": id}, toolsCall("get_repository", readArgs, id2)),
		http.StatusBadRequest, "invalid-request", "")

	// One step: a read is formed and admitted in one request, the tool's
	// server from Fcd-Server, or from params.name itself.
	one := f.gw("POST", "/v1/ext_authz/mcp", gwc, oneStep("s-one", map[string]string{"Fcd-Server": "github"}), toolsCall("get_repository", readArgs, ""))
	c := f.allowed(one, "github/get_repository", readArgs)
	if c.Formation == "" || one.Header.Get("Fcd-Formation") != c.Formation || c.Subject != "s-one" {
		t.Fatalf("one-step claims %+v, Fcd-Formation %q", c, one.Header.Get("Fcd-Formation"))
	}
	formed := f.do("GET", "/v1/formations/"+c.Formation, api.RoleHost, nil)
	if p := formed.Body["principal"].(map[string]any); p["id"] != "gateway" || p["host"] != "gateway" || formed.Body["snapshot"] != snap {
		t.Fatalf("one-step formation: %s", formed.Raw)
	}
	f.allowed(f.gw("POST", "/v1/ext_authz/mcp", gwc, oneStep("s-one", nil), toolsCall("github/get_repository", readArgs, "")),
		"github/get_repository", readArgs)

	// One step, a write: refused until approved, with the formation id;
	// approved over REST, then retried by id, it is admitted.
	const writeArgs = `{"name":"demo"}`
	w := f.gw("POST", "/v1/ext_authz/mcp", gwc, oneStep("s-write", map[string]string{"Fcd-Server": "github", "Fcd-Principal": "alice"}),
		toolsCall("create_repository", writeArgs, ""))
	wid := w.Header.Get("Fcd-Formation")
	if !strings.HasPrefix(wid, "fm_") {
		t.Fatalf("pending one-step call without its formation id: %v %s", w.Header, w.Raw)
	}
	f.denied(w, http.StatusForbidden, "not-approved", wid)
	pending := f.do("GET", "/v1/formations/"+wid, api.RoleApprover, nil)
	if pending.Body["status"] != "pending_approval" || pending.Body["principal"].(map[string]any)["id"] != "alice" {
		t.Fatalf("pending formation: %s", pending.Raw)
	}
	// Retrying before the approval changes nothing.
	f.denied(f.gw("POST", "/v1/ext_authz/mcp", gwc, map[string]string{"Fcd-Formation": wid}, toolsCall("create_repository", writeArgs, "")),
		http.StatusForbidden, "not-approved", wid)
	f.expect(f.do("POST", "/v1/formations/"+wid+"/approvals", api.RoleApprover, approvalBody("approve", pending.Body["digest"].(string))), http.StatusOK, "")
	retried := f.gw("POST", "/v1/ext_authz/mcp", gwc, oneStep("s-write", map[string]string{"Fcd-Server": "github", "Fcd-Formation": wid}),
		toolsCall("create_repository", writeArgs, ""))
	if c := f.allowed(retried, "github/create_repository", writeArgs); c.Formation != wid {
		t.Fatalf("retried write: claims %+v", c)
	}

	// One step, a call the policy denies: 403 with its id.
	d := f.gw("POST", "/v1/ext_authz/mcp", gwc, oneStep("s-del", map[string]string{"Fcd-Server": "github", "Fcd-Principal": "alice"}),
		toolsCall("delete_repository", readArgs, ""))
	f.denied(d, http.StatusForbidden, "formation-denied", d.Header.Get("Fcd-Formation"))
	if did := d.Header.Get("Fcd-Formation"); f.do("GET", "/v1/formations/"+did, api.RoleHost, nil).Body["status"] != "denied" {
		t.Fatal("denied one-step formation not kept for audit")
	}
	// One step with bad input: the formation's own errors, nothing formed.
	f.denied(f.gw("POST", "/v1/ext_authz/mcp", gwc, oneStep("s-bad", map[string]string{"Fcd-Server": "github"}), toolsCall("get_repository", `{"owner":1}`, "")),
		http.StatusUnprocessableEntity, "invalid-arguments", "")
	f.denied(f.gw("POST", "/v1/ext_authz/mcp", gwc, oneStep("s-bad", nil), toolsCall("get_repository", readArgs, "")),
		http.StatusBadRequest, "invalid-request", "")
	f.denied(f.gw("POST", "/v1/ext_authz/mcp", gwc, map[string]string{"Fcd-Snapshot": snap}, toolsCall("get_repository", readArgs, "")),
		http.StatusBadRequest, "invalid-request", "")

	// Session traffic without a formation passes without a token, and
	// Envoy is asked to drop any token the client sent.
	for _, tc := range []struct {
		method string
		body   string
		h      map[string]string
	}{
		{"POST", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`, nil},
		{"POST", `{"jsonrpc":"2.0","method":"notifications/initialized"}`, map[string]string{"Mcp-Method": "notifications/initialized"}},
		{"POST", `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, oneStep("s1", nil)},
		{"POST", `[{"jsonrpc":"2.0","id":3,"method":"tools/list"}]`, nil},
		{"GET", "", map[string]string{"Accept": "text/event-stream"}},
		{"DELETE", "", nil},
	} {
		r := f.gw(tc.method, "/v1/ext_authz/mcp", gwc, tc.h, []byte(tc.body))
		f.passed(r)
		if got := r.Header.Get("X-Envoy-Auth-Headers-To-Remove"); got != "fcd-dispatch-token, fcd-target" {
			t.Fatalf("%s %s: headers to remove %q", tc.method, tc.body, got)
		}
	}

	// A formation sent on every request of a session (an SDK's custom
	// header): the session's other requests pass without admitting it;
	// its tools/call then admits it.
	every := f.do("POST", "/v1/formations", api.RoleHost, formationBody(snap, "s-every", "github/get_repository", `{"owner":"octo","repo":"every"}`, ""))
	eid := every.Body["id"].(string)
	for _, tc := range []struct {
		body string
		h    map[string]string
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`, nil},
		{`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, nil},
		{"", map[string]string{"Mcp-Method": "resources/list"}},
	} {
		h := map[string]string{"Fcd-Formation": eid}
		for k, v := range tc.h {
			h[k] = v
		}
		f.passed(f.gw("POST", "/v1/ext_authz/mcp", gwc, h, []byte(tc.body)))
	}
	if st := f.do("GET", "/v1/formations/"+eid, api.RoleHost, nil).Body["status"]; st != "ready" {
		t.Fatalf("session traffic with the formation header admitted it: %v", st)
	}
	f.allowed(f.gw("POST", "/v1/ext_authz/mcp", gwc, map[string]string{"Fcd-Formation": eid}, toolsCall("get_repository", `{"owner":"octo","repo":"every"}`, "")),
		"github/get_repository", `{"owner":"octo","repo":"every"}`)

	// A tools/call without a formation and without one-step headers.
	f.denied(f.gw("POST", "/v1/ext_authz/mcp", gwc, nil, toolsCall("get_repository", readArgs, "")), http.StatusForbidden, "formation-required", "")
	f.denied(f.gw("POST", "/v1/ext_authz/mcp", gwc, map[string]string{"Mcp-Method": "tools/call"}, nil), http.StatusForbidden, "formation-required", "")

	// Bodies that another parser could read differently are refused.
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/list"`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/list","METHOD":"tools/call"}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_repository","Name":"delete_repository"}}`,
		`[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_repository"}}]`,
		`"tools/call"`,
		string(toolsCall("get_repository", `{"owner":"octo","Owner":"evil","repo":"demo"}`, "")),
	} {
		f.denied(f.gw("POST", "/v1/ext_authz/mcp", gwc, map[string]string{"Fcd-Formation": id}, []byte(body)), http.StatusBadRequest, "malformed-mcp", "")
	}
	f.denied(f.gw("POST", "/v1/ext_authz/mcp", gwc, map[string]string{"Mcp-Method": "tools/call"}, []byte(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)),
		http.StatusBadRequest, "malformed-mcp", "")
	f.denied(f.gw("POST", "/v1/ext_authz/mcp", gwc, map[string]string{"Fcd-Formation": id, "Mcp-Name": "delete_repository"}, toolsCall("get_repository", readArgs, "")),
		http.StatusBadRequest, "malformed-mcp", "")
	// Bounded by the body limit.
	f.expect(f.gw("POST", "/v1/ext_authz/mcp", gwc, nil, bytes.Repeat([]byte(" "), api.DefaultBodyLimit+1)), http.StatusRequestEntityTooLarge, "body-too-large")

	// Credentials.
	f.denied(f.gw("POST", "/v1/ext_authz/mcp", "", nil, toolsCall("get_repository", readArgs, id)), http.StatusUnauthorized, "unauthenticated", "")
	f.denied(f.gw("GET", "/v1/ext_authz/mcp", f.creds[api.RoleBackend], nil, nil), http.StatusForbidden, "forbidden-role", "")

	// Not folded on ext_authz: a draining source is 409 with Retry-After.
	r3 := f.do("POST", "/v1/formations", api.RoleHost, formationBody(snap, "s3", "github/get_repository", readArgs, ""))
	r3id := r3.Body["id"].(string)
	f.expect(f.do("POST", "/v1/epochs/"+read.Body["source"].(map[string]any)["epoch"].(string)+"/drain", api.RoleOperator, nil), http.StatusOK, "")
	dr := f.gw("POST", "/v1/ext_authz/mcp", gwc, map[string]string{"Fcd-Formation": r3id}, nil)
	f.denied(dr, http.StatusConflict, "source-draining", r3id)
	if dr.Header.Get("Retry-After") != "5" {
		t.Fatalf("source-draining without Retry-After: %v", dr.Header)
	}
}
