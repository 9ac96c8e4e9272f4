package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/internal/apitest"
	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/internal/manifesttest"
	"github.com/fcd-authz/fcd/internal/servertest"
	"github.com/fcd-authz/fcd/internal/testutil"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	fcdserver "github.com/fcd-authz/fcd/server"
	"github.com/lestrrat-go/jwx/v2/jwa"
)

// registerAndSnapshot registers the example v1.4 and returns a snapshot id.
func (f *fixture) registerAndSnapshot() string {
	f.t.Helper()
	f.expect(f.do("POST", "/v1/manifests", api.RoleRegistrar, f.sign(readExample(f.t, "v1.4"), nil)), http.StatusCreated, "")
	snap := f.do("POST", "/v1/snapshots", api.RoleHost, nil)
	f.expect(snap, http.StatusCreated, "")
	return snap.Body["id"].(string)
}

func formationBody(snapshot, session, tool, args, principal string) []byte {
	p := ""
	if principal != "" {
		p = fmt.Sprintf(`,"principal":{"id":%q,"attributes":{"groups":["dev"]}}`, principal)
	}
	return []byte(fmt.Sprintf(`{"snapshot":%q,"session":%q,"tool":%q,"arguments":%s%s}`, snapshot, session, tool, args, p))
}

func approvalBody(decision, digest string) []byte {
	return []byte(fmt.Sprintf(`{"decision":%q,"digest":%q,"reason":"reviewed"}`, decision, digest))
}

func TestFormationsAndApprovalsOverHTTP(t *testing.T) {
	f := newFixture(t, 0)
	snap := f.registerAndSnapshot()

	read := f.do("POST", "/v1/formations", api.RoleHost, formationBody(snap, "s1", "github/get_repository", `{"owner":"octo","repo":"demo"}`, ""))
	f.expect(read, http.StatusCreated, "")
	if read.Body["status"] != "ready" || !strings.HasPrefix(read.Header.Get("Location"), "/v1/formations/fm_") {
		t.Fatalf("read formation: %s", read.Raw)
	}
	if p := read.Body["principal"].(map[string]any); p["id"] != "host" || p["host"] != "host" {
		t.Fatalf("principal defaults to the host credential: %v", p)
	}

	write := f.do("POST", "/v1/formations", api.RoleHost, formationBody(snap, "s1", "github/create_repository", `{"name":"demo"}`, "alice"))
	f.expect(write, http.StatusCreated, "")
	if write.Body["status"] != "pending_approval" || write.Body["approvalsRequired"] != float64(1) {
		t.Fatalf("write formation: %s", write.Raw)
	}
	id, digest := write.Body["id"].(string), write.Body["digest"].(string)

	del := f.do("POST", "/v1/formations", api.RoleHost, formationBody(snap, "s1", "github/delete_repository", `{"owner":"octo","repo":"demo"}`, "alice"))
	f.expect(del, http.StatusForbidden, "")
	if del.Body["status"] != "denied" || del.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("denied formation must be answered 403 with the record: %s", del.Raw)
	}
	// The denied record is kept for audit.
	f.expect(f.do("GET", "/v1/formations/"+del.Body["id"].(string), api.RoleApprover, nil), http.StatusOK, "")

	pending := f.do("GET", "/v1/formations?status=pending_approval", api.RoleApprover, nil)
	f.expect(pending, http.StatusOK, "")
	if list := pending.Body["formations"].([]any); len(list) != 1 || list[0].(map[string]any)["id"] != id {
		t.Fatalf("pending list: %s", pending.Raw)
	}
	f.expect(f.do("GET", "/v1/formations?status=waiting", api.RoleApprover, nil), http.StatusBadRequest, "invalid-request")

	path := "/v1/formations/" + id + "/approvals"
	f.expect(f.doAs("POST", path, f.byID["alice"], approvalBody("approve", digest)), http.StatusForbidden, "self-approval")
	f.expect(f.do("POST", path, api.RoleApprover, approvalBody("approve", "sha256:"+strings.Repeat("0", 64))), http.StatusConflict, "digest-mismatch")
	f.expect(f.do("POST", path, api.RoleHost, approvalBody("approve", digest)), http.StatusForbidden, "forbidden-role")
	f.expect(f.do("POST", path, api.RoleApprover, []byte(`{"decision":"approve","digest":"x","extra":1}`)), http.StatusBadRequest, "malformed-json")
	f.expect(f.do("POST", path, api.RoleApprover, approvalBody("perhaps", digest)), http.StatusBadRequest, "invalid-request")
	ok := f.do("POST", path, api.RoleApprover, approvalBody("approve", digest))
	f.expect(ok, http.StatusOK, "")
	if ok.Body["status"] != "ready" {
		t.Fatalf("after approval: %s", ok.Raw)
	}
	f.expect(f.doAs("POST", path, f.byID["approver-2"], approvalBody("approve", digest)), http.StatusConflict, "not-pending")
	f.expect(f.do("POST", "/v1/formations/fm_nope/approvals", api.RoleApprover, approvalBody("approve", digest)), http.StatusNotFound, "formation-not-found")

	// A deny ends a formation.
	w2 := f.do("POST", "/v1/formations", api.RoleHost, formationBody(snap, "s2", "github/create_repository", `{"name":"x"}`, "alice"))
	p2 := "/v1/formations/" + w2.Body["id"].(string) + "/approvals"
	denied := f.doAs("POST", p2, f.byID["approver-2"], approvalBody("deny", w2.Body["digest"].(string)))
	f.expect(denied, http.StatusOK, "")
	if denied.Body["status"] != "denied" {
		t.Fatalf("after deny: %s", denied.Raw)
	}
	f.expect(f.do("POST", p2, api.RoleApprover, approvalBody("approve", w2.Body["digest"].(string))), http.StatusConflict, "not-pending")
}

func TestFormationBadInputOverHTTP(t *testing.T) {
	f := newFixture(t, 0)
	snap := f.registerAndSnapshot()
	cases := []struct {
		note   string
		body   string
		status int
		slug   string
		check  func(r reply) bool
	}{
		{"malformed JSON", `{"snapshot":`, 400, "malformed-json", nil},
		{"unknown field", `{"snapshot":"x","session":"s","tool":"github/get_repository","arguments":{},"tools":1}`, 400, "malformed-json", nil},
		{"duplicate member", `{"snapshot":"x","snapshot":"y","session":"s","tool":"github/get_repository"}`, 400, "malformed-json", nil},
		{"missing session", string(formationBody(snap, "", "github/get_repository", `{}`, "")), 400, "invalid-request", nil},
		{"unknown snapshot", string(formationBody("sha256:00", "s", "github/get_repository", `{}`, "")), 422, "unknown-reference", nil},
		{"unknown tool", string(formationBody(snap, "s", "github/fork", `{}`, "")), 422, "unknown-reference", nil},
		{"schema violation", string(formationBody(snap, "s", "github/create_repository", `{"name":"x","private":"no"}`, "")), 422, "invalid-arguments",
			func(r reply) bool {
				vs, _ := r.Body["violations"].([]any)
				return len(vs) == 1 && vs[0].(map[string]any)["instancePath"] == "/private"
			}},
		{"duplicate argument", string(formationBody(snap, "s", "github/create_repository", `{"name":"x","name":"y"}`, "")), 400, "malformed-json", nil},
	}
	for _, tc := range cases {
		t.Run(tc.note, func(t *testing.T) {
			f.t = t
			r := f.do("POST", "/v1/formations", api.RoleHost, []byte(tc.body))
			f.expect(r, tc.status, tc.slug)
			if tc.check != nil && !tc.check(r) {
				t.Fatalf("body: %s", r.Raw)
			}
		})
	}
	f.t = t
	all := f.do("GET", "/v1/formations", api.RoleHost, nil)
	var out struct{ Formations []json.RawMessage }
	_ = json.Unmarshal(all.Raw, &out)
	if len(out.Formations) != 0 {
		t.Fatalf("refused formations were stored: %s", all.Raw)
	}
}

func TestReadyzShowsPolicies(t *testing.T) {
	f := newFixture(t, 0)
	// Not ready until the signing key is published: nothing could be
	// admitted before.
	if r := f.do("GET", "/readyz", "", nil); r.Status == http.StatusServiceUnavailable {
		if checks, _ := r.Body["checks"].(map[string]any); checks["admission"] != "signing-key-unpublished" {
			t.Fatalf("not ready before publication: %s", r.Raw)
		}
	}
	f.waitPublished()
	r := f.do("GET", "/readyz", "", nil)
	f.expect(r, http.StatusOK, "")
	checks := r.Body["checks"].(map[string]any)
	if checks["admission"] != "ok" {
		t.Errorf("checks.admission %v", checks["admission"])
	}
	pol, ok := checks["policies"].(map[string]any)
	if !ok || !strings.HasPrefix(pol["digest"].(string), "sha256:") || pol["source"] != "embedded" {
		t.Fatalf("readyz policies: %s", r.Raw)
	}
}

// TestListFormationsPagesOverHTTP walks GET /v1/formations page by page:
// every formation once, in id order, `next` only while more may follow,
// and limit and after checked.
func TestListFormationsPagesOverHTTP(t *testing.T) {
	f := newFixture(t, 0)
	snap := f.registerAndSnapshot()
	var ids, pending []string
	for i := range 5 {
		tool, args, principal := "github/get_repository", `{"owner":"octo","repo":"demo"}`, ""
		if i%2 == 0 {
			tool, args, principal = "github/create_repository", `{"name":"demo"}`, "alice"
		}
		r := f.do("POST", "/v1/formations", api.RoleHost, formationBody(snap, "s", tool, args, principal))
		f.expect(r, http.StatusCreated, "")
		ids = append(ids, r.Body["id"].(string))
		if r.Body["status"] == "pending_approval" {
			pending = append(pending, r.Body["id"].(string))
		}
	}
	slices.Sort(ids)
	slices.Sort(pending)
	walk := func(t *testing.T, query string) (got []string, pages int) {
		t.Helper()
		after := ""
		for pages < 20 {
			pages++
			r := f.do("GET", "/v1/formations?"+query+"&after="+url.QueryEscape(after), api.RoleApprover, nil)
			f.expect(r, http.StatusOK, "")
			var page struct {
				Formations []struct{ ID string }
				Next       *string
			}
			if err := json.Unmarshal(r.Raw, &page); err != nil || page.Formations == nil {
				t.Fatalf("page %s: %v", r.Raw, err)
			}
			for _, fm := range page.Formations {
				got = append(got, fm.ID)
			}
			if page.Next == nil {
				return got, pages
			}
			if *page.Next == "" {
				t.Fatalf("next is present but empty: %s", r.Raw)
			}
			after = *page.Next
		}
		t.Fatalf("paging does not end: %v", got)
		return nil, 0
	}
	cases := []struct {
		query string
		want  []string
		pages int
	}{
		{"", ids, 1},
		{"limit=1", ids, 5},
		{"limit=2", ids, 3},
		{"limit=5", ids, 1},
		{"limit=1000", ids, 1},
		{"limit=2&status=pending_approval", pending, 2},
		{"status=ready", slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return slices.Contains(pending, id) }), 1},
	}
	for _, tc := range cases {
		t.Run(tc.query, func(t *testing.T) {
			f.t = t
			got, pages := walk(t, tc.query)
			if !slices.Equal(got, tc.want) || pages != tc.pages {
				t.Fatalf("listed %v in %d pages, want %v in %d", got, pages, tc.want, tc.pages)
			}
		})
	}
	f.t = t
	// A page starts after any id, stored or not.
	r := f.do("GET", "/v1/formations?after=fm_", api.RoleHost, nil)
	f.expect(r, http.StatusOK, "")
	if n := len(r.Body["formations"].([]any)); n != len(ids) {
		t.Fatalf("after fm_: %d formations, want %d", n, len(ids))
	}
	r = f.do("GET", "/v1/formations?after=fm_~", api.RoleHost, nil)
	f.expect(r, http.StatusOK, "")
	if list, ok := r.Body["formations"].([]any); !ok || len(list) != 0 || r.Body["next"] != nil {
		t.Fatalf("after every id: %s", r.Raw)
	}
	for _, q := range []string{"limit=0", "limit=-1", "limit=1001", "limit=ten", "limit=1.5", "after=%0Afm"} {
		f.expect(f.do("GET", "/v1/formations?"+q, api.RoleHost, nil), http.StatusBadRequest, "invalid-parameter")
	}
}

// TestFormationRateLimitOverHTTP: a host over its formation limit is
// answered 429 rate-limited with Retry-After, and nothing is recorded;
// another host is not affected; the bucket refills.
func TestFormationRateLimitOverHTTP(t *testing.T) {
	f := newFixture(t, 0)
	snap := f.registerAndSnapshot()
	var creds []api.Credential
	secrets := map[string]api.Secret{}
	for _, id := range []string{"host-a", "host-b"} {
		secret, cred, err := api.NewCredential(id, api.RoleHost)
		if err != nil {
			t.Fatal(err)
		}
		creds, secrets[id] = append(creds, cred), secret
	}
	auth, err := api.NewAuthenticator(creds)
	if err != nil {
		t.Fatal(err)
	}
	const burst = 3
	key, err := manifest.GenerateKey(jwa.EdDSA)
	if err != nil {
		t.Fatal(err)
	}
	// A second replica on the fixture's store, serving the two hosts with
	// the limit on: one token every 2 s, slow enough that the requests of
	// a step, even slowed down by the race detector, do not earn a token
	// back.
	limited := servertest.Start(t, fcdserver.Config{
		EtcdEndpoints: f.member.Endpoints(), EtcdPrefix: testPrefix, EtcdQuota: f.member.Quota(),
		Registrars: manifesttest.NewSigner(t).Verifier, Issuers: f.certificates, Auth: auth, Signer: key, Issuer: "fcd-test",
		GatewayCaller: string(f.binding), FormationRate: 0.5, FormationBurst: burst, AuditDir: fcdserver.AuditOff, Logger: f.cfg.Logger,
	})
	base := limited.URL()
	oasWatch(t, base, t)
	form := func(host string) reply {
		t.Helper()
		return apitest.Do(t, "POST", base+"/v1/formations", string(secrets[host]), nil,
			formationBody(snap, "s", "github/get_repository", `{"owner":"octo","repo":"demo"}`, ""))
	}
	count := func(host string) int {
		t.Helper()
		r := apitest.Do(t, "GET", base+"/v1/formations?limit=1000", string(secrets[host]), nil, nil)
		n := 0
		for _, fm := range r.Body["formations"].([]any) {
			if fm.(map[string]any)["principal"].(map[string]any)["host"] == host {
				n++
			}
		}
		return n
	}
	steps := []struct {
		note  string
		sleep time.Duration
		host  string
		want  []int
	}{
		{note: "the burst passes, then 429", host: "host-a", want: []int{201, 201, 201, 429, 429}},
		{note: "another host is not limited by the first", host: "host-b", want: []int{201, 201, 201, 429}},
		{note: "the bucket refills", sleep: 2100 * time.Millisecond, host: "host-a", want: []int{201, 429}},
	}
	for _, st := range steps {
		t.Run(st.note, func(t *testing.T) {
			time.Sleep(st.sleep)
			for i, want := range st.want {
				r := form(st.host)
				if r.Status != want {
					t.Fatalf("request %d: status %d, want %d: %s", i, r.Status, want, r.Raw)
				}
				if want != 429 {
					continue
				}
				if r.Body["type"] != api.ProblemBase+"rate-limited" || r.Header.Get("Fcd-Problem") != "rate-limited" ||
					r.Header.Get("Content-Type") != "application/problem+json" {
					t.Fatalf("429 is not the rate-limited problem: %v %s", r.Header, r.Raw)
				}
				if ra, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || ra < 1 {
					t.Fatalf("Retry-After %q, want whole seconds >= 1", r.Header.Get("Retry-After"))
				}
			}
		})
	}
	if a, b := count("host-a"), count("host-b"); a != burst+1 || b != burst {
		t.Fatalf("recorded %d formations of host-a and %d of host-b, want %d and %d: a refused one was recorded", a, b, burst+1, burst)
	}
	// The limit is on forming only: listing is never limited.
	for range 2 * burst {
		if r := apitest.Do(t, "GET", base+"/v1/formations", string(secrets["host-a"]), nil, nil); r.Status != http.StatusOK {
			t.Fatalf("listing: %d", r.Status)
		}
	}
}

// TestReadyzAndMetricsShowStoreHealth fills a member with a small quota
// until etcd raises NOSPACE: /readyz shows the sizes, quota and alarm in
// checks.etcd and answers 503 not-ready (with Fcd-Problem) while the
// alarm is active, and ready again once it is disarmed; /metrics exports
// the same as gauges.
func TestReadyzAndMetricsShowStoreHealth(t *testing.T) {
	const quota = 4 << 20
	member := etcdtest.StartWith(t, func(c *lease.EmbedConfig) { c.QuotaBytes = quota })
	f := newFixtureOn(t, member, 0, authz.CallerOff)
	f.waitPublished()
	steps := []struct {
		note    string
		do      func(testing.TB)
		status  int
		alarms  []any
		nospace string // the fcd_etcd_alarm{alarm="NOSPACE"} sample
	}{
		{note: "fresh", status: http.StatusOK, alarms: []any{}, nospace: "0"},
		{note: "full", do: member.FillToQuota, status: http.StatusServiceUnavailable, alarms: []any{"NOSPACE"}, nospace: "1"},
		{note: "disarmed", do: member.Disarm, status: http.StatusOK, alarms: []any{}, nospace: "0"},
	}
	for _, st := range steps {
		t.Run(st.note, func(t *testing.T) {
			f.t = t
			if st.do != nil {
				st.do(t)
			}
			r := f.do("GET", "/readyz", "", nil)
			slug := ""
			if st.status != http.StatusOK {
				slug = "not-ready"
				if r.Header.Get("Fcd-Problem") != "not-ready" || r.Header.Get("Retry-After") != "1" {
					t.Fatalf("503 without Fcd-Problem or Retry-After: %v", r.Header)
				}
			}
			f.expect(r, st.status, slug)
			checks := r.Body["checks"].(map[string]any)
			etcd, _ := checks["etcd"].(map[string]any)
			if etcd == nil || etcd["quota"] != float64(quota) || etcd["dbSize"].(float64) <= 0 || etcd["dbSizeInUse"].(float64) <= 0 {
				t.Fatalf("readyz checks.etcd: %s", r.Raw)
			}
			if got := etcd["alarms"].([]any); !slices.Equal(got, st.alarms) {
				t.Fatalf("alarms %v, want %v", got, st.alarms)
			}
			wantStore := map[bool]string{true: "ok", false: "alarm"}[st.status == http.StatusOK]
			if checks["store"] != wantStore {
				t.Fatalf("checks.store %v, want %s", checks["store"], wantStore)
			}
			// The gauges are read at most every 5 s: wait for this state.
			var m string
			testutil.Eventually(t, 15*time.Second, `fcd_etcd_alarm{alarm="NOSPACE"} to be `+st.nospace, func() bool {
				m = string(f.do("GET", "/metrics", "", nil).Raw)
				return strings.Contains(m, `fcd_etcd_alarm{alarm="NOSPACE"} `+st.nospace+"\n")
			})
			for _, want := range []string{"fcd_etcd_status_up 1\n", fmt.Sprintf("fcd_etcd_quota_bytes %g\n", float64(quota)),
				"fcd_etcd_db_size_bytes ", "fcd_etcd_db_size_in_use_bytes ", `fcd_etcd_alarm{alarm="CORRUPT"} 0` + "\n"} {
				if !strings.Contains(m, want) {
					t.Fatalf("metrics lack %q", want)
				}
			}
		})
	}
}

// TestRecoverOverHTTP: POST /v1/formations/{id}/recover answers a
// recovery as a formation (201, Location), with the failure the backend
// reported kept on the original; the refusals are problems: a blocked
// recovery (lease open, Retry-After), one not allowed (naming the mode),
// a second one (recovery-exists), another role, a malformed body, an
// unknown formation; a failure with an outcome that has none is refused.
func TestRecoverOverHTTP(t *testing.T) {
	f, snap := newReadyFixture(t)
	body := formationBody(snap, "s1", "github/get_repository", `{"owner":"octo","repo":"gone"}`, "")
	form := func() string {
		r := f.do("POST", "/v1/formations", api.RoleHost, body)
		f.expect(r, http.StatusCreated, "")
		return r.Body["id"].(string)
	}
	id := form()
	adm := f.do("POST", "/v1/formations/"+id+"/admit", api.RoleHost, nil)
	f.expect(adm, http.StatusOK, "")
	blocked := f.do("POST", "/v1/formations/"+id+"/recover", api.RoleHost, nil)
	f.expect(blocked, http.StatusConflict, "recovery-blocked")
	if blocked.Header.Get("Retry-After") == "" {
		t.Errorf("recovery-blocked without Retry-After")
	}
	f.ranWith(adm, `{"outcome":"failed","claim":"cl_test","failure":{"error":"not_found","message":"no repository octo/gone"}}`)
	got := f.do("GET", "/v1/formations/"+id, api.RoleHost, nil)
	if fl, _ := got.Body["failure"].(map[string]any); got.Body["outcome"] != "failed" || fl["error"] != "not_found" {
		t.Fatalf("the failed formation: %s", got.Raw)
	}

	path := "/v1/formations/" + id + "/recover"
	f.expect(f.do("POST", path, api.RoleApprover, nil), http.StatusForbidden, "forbidden-role")
	f.expect(f.do("POST", path, api.RoleHost, []byte(`{"tool":"github/get_repository","extra":1}`)), http.StatusBadRequest, "malformed-json")
	f.expect(f.do("POST", "/v1/formations/fm_nope/recover", api.RoleHost, nil), http.StatusNotFound, "formation-not-found")
	rec := f.do("POST", path, api.RoleHost, []byte(`{"arguments":{"owner":"octo","repo":"found"}}`))
	f.expect(rec, http.StatusCreated, "")
	r, _ := rec.Body["recovery"].(map[string]any)
	if rec.Header.Get("Location") != "/v1/formations/"+rec.Body["id"].(string) || rec.Body["status"] != "pending_approval" ||
		r["of"] != id || r["attempt"] != float64(2) || r["outcome"] != "failed" {
		t.Fatalf("the recovery: %v %s", rec.Header, rec.Raw)
	}
	f.expect(f.do("POST", path, api.RoleHost, nil), http.StatusConflict, "recovery-exists")

	// A failure no declared mode matches: not allowed, "none" named.
	other := form()
	adm = f.do("POST", "/v1/formations/"+other+"/admit", api.RoleHost, nil)
	f.expect(adm, http.StatusOK, "")
	f.ranWith(adm, `{"outcome":"failed","claim":"cl_test","failure":{"error":"disk_full"}}`)
	no := f.do("POST", "/v1/formations/"+other+"/recover", api.RoleHost, nil)
	f.expect(no, http.StatusConflict, "recovery-not-allowed")
	if !strings.Contains(fmt.Sprint(no.Body["detail"]), "failure mode: none") {
		t.Errorf("detail %v", no.Body["detail"])
	}

	third := form()
	adm = f.do("POST", "/v1/formations/"+third+"/admit", api.RoleHost, nil)
	f.expect(adm, http.StatusOK, "")
	lease, _ := adm.Body["lease"].(string)
	f.expect(f.do("POST", "/v1/leases/"+lease+"/complete", api.RoleBackend, []byte(`{"outcome":"effect","failure":{"error":"x"}}`)),
		http.StatusBadRequest, "invalid-request")
}
