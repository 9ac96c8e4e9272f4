package api_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/audit"
	"github.com/fcd-authz/fcd/internal/apitest"
	"github.com/fcd-authz/fcd/internal/manifesttest"
	"github.com/lestrrat-go/jwx/v2/jwk"
	"github.com/lestrrat-go/jwx/v2/jws"
)

func TestAdmissionOverHTTP(t *testing.T) {
	f, snap := newReadyFixture(t)

	read := f.do("POST", "/v1/formations", api.RoleHost, formationBody(snap, "s1", "github/get_repository", `{"owner":"octo","repo":"demo"}`, ""))
	f.expect(read, http.StatusCreated, "")
	id := read.Body["id"].(string)
	f.expect(f.do("POST", "/v1/formations/"+id+"/admit", api.RoleApprover, nil), http.StatusForbidden, "forbidden-role")
	a := f.do("POST", "/v1/formations/"+id+"/admit", api.RoleGateway, nil)
	f.expect(a, http.StatusOK, "")
	if a.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("token answer is cacheable: %q", a.Header.Get("Cache-Control"))
	}
	tok, _ := a.Body["token"].(string)
	leaseID, _ := a.Body["lease"].(string)
	if target := a.Body["target"].(map[string]any); target["pool"] != "github-v1-4" || !strings.HasPrefix(leaseID, "ls_") {
		t.Fatalf("admission: %s", a.Raw)
	}
	// The host may admit too, and gets the same lease.
	again := f.do("POST", "/v1/formations/"+id+"/admit", api.RoleHost, nil)
	f.expect(again, http.StatusOK, "")
	if again.Body["lease"] != leaseID {
		t.Fatalf("re-admission: %s", again.Raw)
	}

	// The token verifies against the published JWKS, served without a
	// credential.
	jw := f.do("GET", "/.well-known/jwks.json", "", nil)
	f.expect(jw, http.StatusOK, "")
	if jw.Header.Get("Content-Type") != "application/jwk-set+json" {
		t.Fatalf("jwks content type %q", jw.Header.Get("Content-Type"))
	}
	set, err := jwk.Parse(jw.Raw)
	if err != nil || set.Len() != 1 {
		t.Fatalf("jwks: %v %s", err, jw.Raw)
	}
	payload, err := jws.Verify([]byte(tok), jws.WithKeySet(set, jws.WithRequireKid(true)))
	if err != nil {
		t.Fatalf("token does not verify against the JWKS: %v", err)
	}
	var claims map[string]any
	json.Unmarshal(payload, &claims)
	if claims["jti"] != leaseID || claims["aud"] != "github-v1-4" {
		t.Fatalf("claims: %v", claims)
	}

	// Lifecycle over HTTP.
	complete := "/v1/leases/" + leaseID + "/complete"
	f.expect(f.do("POST", complete, api.RoleHost, []byte(`{"outcome":"effect"}`)), http.StatusForbidden, "forbidden-role")
	// A backend limited to another pool cannot close (nor hold) the lease.
	for _, outcome := range []string{"effect", "rejected", "uncertain"} {
		f.expect(f.doAs("POST", complete, f.byID["backend-v1-3"], []byte(`{"outcome":"`+outcome+`"}`)), http.StatusForbidden, "lease-out-of-scope")
	}
	f.expect(f.do("POST", complete, api.RoleBackend, []byte(`{"outcome":"done"}`)), http.StatusBadRequest, "invalid-request")
	// The operator sees the open lease under its epoch.
	srcEpoch := read.Body["source"].(map[string]any)["epoch"].(string)
	leasesPath := "/v1/epochs/" + srcEpoch + "/leases"
	f.expect(f.do("GET", leasesPath, api.RoleHost, nil), http.StatusForbidden, "forbidden-role")
	f.expect(f.do("GET", "/v1/epochs/sha256:nope/leases", api.RoleOperator, nil), http.StatusNotFound, "epoch-not-found")
	openLeases := func() []any {
		t.Helper()
		r := f.do("GET", leasesPath, api.RoleOperator, nil)
		f.expect(r, http.StatusOK, "")
		ls, _ := r.Body["leases"].([]any)
		return ls
	}
	if ls := openLeases(); len(ls) != 1 || ls[0].(map[string]any)["id"] != leaseID || ls[0].(map[string]any)["state"] != "admitted" ||
		ls[0].(map[string]any)["formation"] != id || ls[0].(map[string]any)["revision"] != claims["fcd_revision"] {
		t.Fatalf("open leases: %v (token revision %v)", ls, claims["fcd_revision"])
	}

	// Before the effect the backend claims the lease: once, for one call.
	claim := "/v1/leases/" + leaseID + "/claim"
	claimBody := func(id string, rev any) []byte {
		b, _ := json.Marshal(map[string]any{"claim": id, "epoch": claims["fcd_epoch"], "revision": rev})
		return b
	}
	f.expect(f.do("POST", claim, api.RoleHost, claimBody("cl_a", claims["fcd_revision"])), http.StatusForbidden, "forbidden-role")
	f.expect(f.do("POST", claim, api.RoleGateway, claimBody("cl_a", claims["fcd_revision"])), http.StatusForbidden, "forbidden-role")
	f.expect(f.doAs("POST", claim, f.byID["backend-v1-3"], claimBody("cl_a", claims["fcd_revision"])), http.StatusForbidden, "lease-out-of-scope")
	f.expect(f.do("POST", claim, api.RoleBackend, []byte(`{"claim":"cl_a"}`)), http.StatusBadRequest, "invalid-request")
	f.expect(f.do("POST", claim, api.RoleBackend, []byte(`{"claim":"cl_a","epoch":"e","revision":1,"extra":1}`)), http.StatusBadRequest, "malformed-json")
	f.expect(f.do("POST", claim, api.RoleBackend, claimBody("cl_a", 1)), http.StatusNotFound, "lease-not-found")
	f.expect(f.do("POST", "/v1/leases/ls_nope/claim", api.RoleBackend, claimBody("cl_a", claims["fcd_revision"])), http.StatusNotFound, "lease-not-found")
	// An effect cannot be reported for an unclaimed lease.
	f.expect(f.doAs("POST", complete, f.byID["backend-v1-4"], []byte(`{"outcome":"effect"}`)), http.StatusConflict, "lease-not-claimed")
	c := f.doAs("POST", claim, f.byID["backend-v1-4"], claimBody("cl_a", claims["fcd_revision"]))
	f.expect(c, http.StatusOK, "")
	if c.Body["claim"] != "cl_a" || c.Body["lease"] != leaseID {
		t.Fatalf("claim: %s", c.Raw)
	}
	f.expect(f.doAs("POST", claim, f.byID["backend-v1-4"], claimBody("cl_a", claims["fcd_revision"])), http.StatusOK, "") // its answer was lost
	f.expect(f.doAs("POST", claim, f.byID["backend-v1-4"], claimBody("cl_b", claims["fcd_revision"])), http.StatusConflict, "lease-claimed")
	if ls := openLeases(); len(ls) != 1 || ls[0].(map[string]any)["state"] != "running" ||
		ls[0].(map[string]any)["claim"].(map[string]any)["id"] != "cl_a" {
		t.Fatalf("open leases after the claim: %v", ls)
	}
	// Running: no token again, no release, no outcome under another claim.
	f.expect(f.do("POST", "/v1/formations/"+id+"/admit", api.RoleGateway, nil), http.StatusConflict, "lease-claimed")
	f.expect(f.doAs("POST", complete, f.byID["backend-v1-4"], []byte(`{"outcome":"rejected"}`)), http.StatusConflict, "lease-claimed")
	f.expect(f.doAs("POST", complete, f.byID["backend-v1-4"], []byte(`{"outcome":"effect","claim":"cl_b"}`)), http.StatusConflict, "lease-claimed")

	// The lease's own pool's backend can, under its claim (the refusals
	// above changed nothing).
	f.expect(f.doAs("POST", complete, f.byID["backend-v1-4"], []byte(`{"outcome":"uncertain","detail":"timeout","claim":"cl_a"}`)), http.StatusOK, "")
	if ls := openLeases(); len(ls) != 1 || ls[0].(map[string]any)["state"] != "uncertain" {
		t.Fatalf("open leases after uncertain: %v", ls)
	}
	// The operator finds the call behind it, and the uncertain calls.
	if r := f.do("GET", "/v1/formations/"+id, api.RoleOperator, nil); r.Status != http.StatusOK || r.Body["status"] != "uncertain" || r.Body["lease"] != leaseID {
		t.Fatalf("operator reads the formation: %d %s", r.Status, r.Raw)
	}
	if r := f.do("GET", "/v1/formations?status=uncertain", api.RoleOperator, nil); r.Status != http.StatusOK || len(r.Body["formations"].([]any)) != 1 {
		t.Fatalf("operator lists uncertain formations: %d %s", r.Status, r.Raw)
	}
	f.expect(f.do("POST", complete, api.RoleBackend, []byte(`{"outcome":"effect"}`)), http.StatusConflict, "lease-uncertain")
	f.expect(f.do("POST", "/v1/formations/"+id+"/admit", api.RoleGateway, nil), http.StatusConflict, "lease-uncertain")
	resolve := "/v1/leases/" + leaseID + "/resolve"
	f.expect(f.do("POST", resolve, api.RoleOperator, []byte(`{"outcome":"uncertain"}`)), http.StatusBadRequest, "invalid-request")
	f.expect(f.do("POST", resolve, api.RoleOperator, []byte(`{"outcome":"effect","reason":"checked"}`)), http.StatusOK, "")
	if ls := openLeases(); len(ls) != 0 {
		t.Fatalf("open leases after resolution: %v", ls)
	}
	f.expect(f.do("POST", resolve, api.RoleOperator, []byte(`{"outcome":"effect","reason":"checked"}`)), http.StatusConflict, "lease-closed")
	f.expect(f.do("POST", "/v1/leases/ls_nope/complete", api.RoleBackend, []byte(`{"outcome":"effect"}`)), http.StatusNotFound, "lease-not-found")

	gen := f.do("POST", "/v1/pools/github-v1-4/generation", api.RoleOperator, []byte(`{"generation":3}`))
	f.expect(gen, http.StatusOK, "")
	if gen.Body["generation"] != float64(3) {
		t.Fatalf("generation: %s", gen.Raw)
	}
	f.expect(f.do("POST", "/v1/pools/github-v1-4/generation", api.RoleOperator, []byte(`{"generation":2}`)), http.StatusConflict, "stale-generation")

	// A write without its approval is not admitted; a drained source
	// answers 409 with Retry-After, a stale one 410.
	w := f.do("POST", "/v1/formations", api.RoleHost, formationBody(snap, "s2", "github/create_repository", `{"name":"x"}`, "alice"))
	f.expect(f.do("POST", "/v1/formations/"+w.Body["id"].(string)+"/admit", api.RoleGateway, nil), http.StatusForbidden, "not-approved")
	r2 := f.do("POST", "/v1/formations", api.RoleHost, formationBody(snap, "s3", "github/get_repository", `{"owner":"o","repo":"r"}`, ""))
	epoch := read.Body["source"].(map[string]any)["epoch"].(string)
	f.expect(f.do("POST", "/v1/epochs/"+epoch+"/drain", api.RoleOperator, nil), http.StatusOK, "")
	dr := f.do("POST", "/v1/formations/"+r2.Body["id"].(string)+"/admit", api.RoleGateway, nil)
	f.expect(dr, http.StatusConflict, "source-draining")
	if dr.Header.Get("Retry-After") == "" {
		t.Fatal("409 source-draining without Retry-After")
	}
	f.expect(f.do("POST", "/v1/epochs/"+epoch+"/retire", api.RoleOperator, nil), http.StatusOK, "")
	f.expect(f.do("POST", "/v1/formations/"+r2.Body["id"].(string)+"/admit", api.RoleGateway, nil), http.StatusGone, "source-stale")

	// The use cases' metrics tell the answers apart where HTTP codes
	// cannot.
	m := f.do("GET", "/metrics", "", nil)
	f.expect(m, http.StatusOK, "")
	for _, want := range []string{
		`fcd_formations_total{status="ready",successor="false"} 2`,
		`fcd_formations_total{status="pending_approval",successor="false"} 1`,
		`fcd_admissions_total{result="source"} 1`,
		`fcd_admissions_total{result="reissued"} 1`,
		`fcd_admissions_total{result="lease_closed_or_uncertain"} 1`,
		`fcd_admissions_total{result="not_approved"} 1`,
		`fcd_admissions_total{result="source_draining"} 1`,
		`fcd_admissions_total{result="source_stale"} 1`,
		`fcd_lease_outcomes_total{by="backend",outcome="uncertain"} 1`,
		`fcd_lease_outcomes_total{by="operator",outcome="effect"} 1`,
	} {
		if !strings.Contains(string(m.Raw), want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestMetrics(t *testing.T) {
	f := newFixture(t, 0)
	f.expect(f.do("GET", "/v1/epochs", api.RoleOperator, nil), http.StatusOK, "")
	f.expect(f.do("GET", "/v1/epochs/sha256:nope", api.RoleOperator, nil), http.StatusNotFound, "epoch-not-found")
	m := f.do("GET", "/metrics", "", nil)
	f.expect(m, http.StatusOK, "")
	body := string(m.Raw)
	for _, want := range []string{
		`fcd_http_requests_total{code="200",method="GET",route="/v1/epochs"} 1`,
		`fcd_http_requests_total{code="404",method="GET",route="/v1/epochs/{epoch}"} 1`,
		`fcd_http_request_duration_seconds_count{route="/v1/epochs"} 1`,
		`go_goroutines`,
	} {
		if !strings.Contains(body, want) {
			t.Fatalf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(body, "sha256:nope") {
		t.Fatal("a raw path reached a metric label")
	}
}

// TestCompleteWithAdmissionFacts: a report may repeat its token's
// admission facts (fencecheck sends them); they are decoded strictly, do
// not widen a credential's pools, and a report with forged facts closes
// only the lease it names, as one without them would.
func TestCompleteWithAdmissionFacts(t *testing.T) {
	f, snap := newReadyFixture(t)
	admitted := func(session string) (string, map[string]any) { return f.admittedAndClaimed(snap, session) }
	report := func(leaseID, claim string, facts map[string]any) []byte {
		b, _ := json.Marshal(map[string]any{"outcome": "effect", "claim": claim, "admission": facts})
		return b
	}
	status := func(id any) any {
		t.Helper()
		r := f.do("GET", "/v1/formations/"+id.(string), api.RoleOperator, nil)
		f.expect(r, http.StatusOK, "")
		return r.Body["status"]
	}

	l1, facts1 := admitted("facts-1")
	l2, facts2 := admitted("facts-2")
	path1 := "/v1/leases/" + l1 + "/complete"
	f.expect(f.do("POST", path1, api.RoleBackend, []byte(`{"outcome":"effect","claim":"cl_facts-1","admission":{"epoch":"e","extra":1}}`)),
		http.StatusBadRequest, "malformed-json")
	f.expect(f.doAs("POST", path1, f.byID["backend-v1-3"], report(l1, "cl_facts-1", facts1)), http.StatusForbidden, "lease-out-of-scope")

	// Lease 1 reported with lease 2's formation and session: lease 1
	// closes, lease 2 and its formation are untouched.
	forged := maps.Clone(facts1)
	forged["formation"], forged["session"] = facts2["formation"], facts2["session"]
	r := f.do("POST", path1, api.RoleBackend, report(l1, "cl_facts-1", forged))
	f.expect(r, http.StatusOK, "")
	if r.Body["lease"] != l1 || r.Body["formation"] != facts1["formation"] {
		t.Fatalf("forged report answered %s", r.Raw)
	}
	if st1, st2 := status(facts1["formation"]), status(facts2["formation"]); st1 != "completed" || st2 != "admitted" {
		t.Fatalf("after a forged report: formation 1 %v, formation 2 %v; want completed, admitted", st1, st2)
	}
	f.expect(f.do("POST", "/v1/leases/"+l2+"/complete", api.RoleBackend, report(l2, "cl_facts-2", facts2)), http.StatusOK, "")
	if st := status(facts2["formation"]); st != "completed" {
		t.Fatalf("formation 2 after its report: %v", st)
	}
	f.expect(f.do("POST", "/v1/leases/"+l2+"/complete", api.RoleBackend, report(l2, "cl_facts-2", facts2)), http.StatusConflict, "lease-closed")
}

// admittedAndClaimed forms a read call in session, admits it and claims
// its lease under "cl_"+session, and returns the lease id and the
// admission facts its token states.
func (f *fixture) admittedAndClaimed(snap, session string) (leaseID string, facts map[string]any) {
	t := f.t
	t.Helper()
	r := f.do("POST", "/v1/formations", api.RoleHost, formationBody(snap, session, "github/get_repository", `{"owner":"octo","repo":"demo"}`, ""))
	f.expect(r, http.StatusCreated, "")
	a := f.do("POST", "/v1/formations/"+r.Body["id"].(string)+"/admit", api.RoleGateway, nil)
	f.expect(a, http.StatusOK, "")
	payload, err := base64.RawURLEncoding.DecodeString(strings.Split(a.Body["token"].(string), ".")[1])
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	if err := json.Unmarshal(payload, &c); err != nil {
		t.Fatal(err)
	}
	leaseID = c["jti"].(string)
	body, _ := json.Marshal(map[string]any{"claim": "cl_" + session, "epoch": c["fcd_epoch"], "revision": c["fcd_revision"]})
	f.expect(f.do("POST", "/v1/leases/"+leaseID+"/claim", api.RoleBackend, body), http.StatusOK, "")
	return leaseID, map[string]any{"epoch": c["fcd_epoch"], "revision": c["fcd_revision"], "formation": c["fcd_formation"],
		"session": c["sub"], "tool": c["fcd_tool"]}
}

// TestCompleteLeasesInOneRequest: POST /v1/leases/outcomes answers each
// report as the single route would — applied, or its own problem — and
// one refused report changes nothing of another; a malformed, empty or
// oversized batch, or a role that may not report, changes nothing.
func TestCompleteLeasesInOneRequest(t *testing.T) {
	f, snap := newReadyFixture(t)
	l1, facts1 := f.admittedAndClaimed(snap, "batch-1")
	l2, facts2 := f.admittedAndClaimed(snap, "batch-2")
	l3, facts3 := f.admittedAndClaimed(snap, "batch-3")
	batch := func(reports ...map[string]any) []byte {
		b, _ := json.Marshal(map[string]any{"reports": reports})
		return b
	}
	const path = "/v1/leases/outcomes"
	f.expect(f.do("POST", path, api.RoleHost, batch(map[string]any{"lease": l1, "outcome": "effect"})), http.StatusForbidden, "forbidden-role")
	f.expect(f.do("POST", path, api.RoleBackend, batch()), http.StatusBadRequest, "invalid-request")
	f.expect(f.do("POST", path, api.RoleBackend, []byte(`{"reports":[{"lease":"`+l1+`","outcome":"effect","claim":"cl_batch-1","colour":1}]}`)),
		http.StatusBadRequest, "malformed-json")
	many := make([]map[string]any, 257)
	for i := range many {
		many[i] = map[string]any{"lease": l1, "outcome": "effect", "claim": "cl_batch-1"}
	}
	f.expect(f.do("POST", path, api.RoleBackend, batch(many...)), http.StatusBadRequest, "invalid-request")

	r := f.do("POST", path, api.RoleBackend, batch(
		map[string]any{"lease": l1, "outcome": "effect", "claim": "cl_batch-1", "admission": facts1},
		map[string]any{"lease": l2, "outcome": "effect", "claim": "cl_other", "admission": facts2},
		map[string]any{"lease": l3, "outcome": "failed", "claim": "cl_batch-3"},
		map[string]any{"lease": "ls_nope", "outcome": "rejected"},
		map[string]any{"lease": l2, "outcome": "done", "claim": "cl_batch-2"},
	))
	f.expect(r, http.StatusOK, "")
	results, _ := r.Body["results"].([]any)
	want := []struct {
		status float64
		slug   string
	}{{200, ""}, {409, "lease-claimed"}, {200, ""}, {404, "lease-not-found"}, {400, "invalid-request"}}
	if len(results) != len(want) {
		t.Fatalf("results: %s", r.Raw)
	}
	for i, w := range want {
		res := results[i].(map[string]any)
		got, _ := res["status"].(float64)
		slug := ""
		if p, ok := res["problem"].(map[string]any); ok {
			typ, _ := p["type"].(string)
			slug = typ[strings.LastIndexByte(typ, '#')+1:]
		}
		if got != w.status || slug != w.slug {
			t.Errorf("result %d: %v, want %v %q", i, res, w.status, w.slug)
		}
	}
	for formation, want := range map[any]string{facts1["formation"]: "completed", facts2["formation"]: "admitted", facts3["formation"]: "failed"} {
		g := f.do("GET", "/v1/formations/"+formation.(string), api.RoleOperator, nil)
		if g.Body["status"] != want {
			t.Errorf("formation %v is %v, want %s", formation, g.Body["status"], want)
		}
	}
}

// TestAuditPages: GET /v1/audit pages this replica's trail for an
// operator — every event once, in order, `next` while more follow — and
// refuses other roles and bad parameters; without a trail it is 404.
func TestAuditPages(t *testing.T) {
	f := newFixture(t, 0)
	key := manifesttest.NewSigner(t).Key
	tr, err := audit.Open(audit.Config{Root: t.TempDir(), Replica: "api-test", Key: key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	for i := range 5 {
		if err := tr.Record(t.Context(), "drain", int64(10+i), map[string]any{"epoch": fmt.Sprint("e", i)}); err != nil {
			t.Fatal(err)
		}
	}
	cfg := f.cfg
	cfg.Trail = tr
	h, err := api.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	oasWatch(t, srv.URL, t)
	get := func(role api.Role, query string) apitest.Reply {
		return apitest.Do(t, "GET", srv.URL+"/v1/audit"+query, string(f.creds[role]), nil, nil)
	}
	var seqs []float64
	for q := "?limit=2"; ; {
		r := get(api.RoleOperator, q)
		if r.Status != http.StatusOK || r.Body["replica"] != "api-test" {
			t.Fatalf("page %s: %d %s", q, r.Status, r.Raw)
		}
		for _, e := range r.Body["events"].([]any) {
			seqs = append(seqs, e.(map[string]any)["seq"].(float64))
		}
		next, ok := r.Body["next"].(float64)
		if !ok {
			break
		}
		q = fmt.Sprintf("?limit=2&after=%d", int(next))
	}
	if !slices.Equal(seqs, []float64{1, 2, 3, 4, 5}) {
		t.Fatalf("paged events %v", seqs)
	}
	for _, tc := range []struct {
		role  api.Role
		query string
		want  int
		slug  string
	}{
		{api.RoleHost, "", http.StatusForbidden, "forbidden-role"},
		{api.RoleOperator, "?limit=0", http.StatusBadRequest, "invalid-parameter"},
		{api.RoleOperator, "?limit=1001", http.StatusBadRequest, "invalid-parameter"},
		{api.RoleOperator, "?after=-1", http.StatusBadRequest, "invalid-parameter"},
	} {
		r := get(tc.role, tc.query)
		if r.Status != tc.want || !strings.HasSuffix(r.Body["type"].(string), "#"+tc.slug) {
			t.Errorf("%s %s: %d %s", tc.role, tc.query, r.Status, r.Raw)
		}
	}
	// The fixture's own server keeps no trail.
	f.expect(f.do("GET", "/v1/audit", api.RoleOperator, nil), http.StatusNotFound, "not-found")
}
