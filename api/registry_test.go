package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/authz/policy"
	"github.com/fcd-authz/fcd/internal/apitest"
	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/internal/manifesttest"
	"github.com/fcd-authz/fcd/internal/servertest"
	"github.com/fcd-authz/fcd/internal/testutil"
	"github.com/fcd-authz/fcd/manifest"
	fcdserver "github.com/fcd-authz/fcd/server"
	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwk"
)

const testPrefix = "/apitest/"

// fixture is a real authzd as it ships (server.New): embedded etcd,
// store, registry, use cases, router, HTTP and gRPC servers. Nothing is
// mocked.
type fixture struct {
	t      *testing.T
	member *etcdtest.Member
	server *fcdserver.Server
	url    string  // the server's
	key    jwk.Key // trusted registrar key
	// issuerKey is a trusted compatibility-certificate issuer key.
	issuerKey jwk.Key
	// certificates verifies certificates signed with issuerKey; formations
	// capture successors through them.
	certificates *manifest.Verifier
	creds        map[api.Role]api.Secret
	// byID holds every credential by its id, extra approvers included.
	byID map[string]api.Secret
	// policies decide formations (the embedded defaults).
	policies *policy.Manager
	// issuer signs dispatch tokens.
	issuer *authz.TokenIssuer
	// cfg is the handler's configuration over the server's use cases, for
	// the tests that serve a variant of the handler (with a trail, a rate
	// limit).
	cfg api.Config
	// binding is the gateway caller binding the use cases enforce.
	binding authz.CallerBinding
}

// newFixture serves the API with the gateway caller binding off: the
// transport tests name formations without an authenticated caller;
// TestGatewayCallerBinding serves it on (newFixtureBinding).
func newFixture(t *testing.T, bodyLimit int64) *fixture {
	t.Helper()
	return newFixtureBinding(t, bodyLimit, authz.CallerOff)
}

func newFixtureBinding(t *testing.T, bodyLimit int64, binding authz.CallerBinding) *fixture {
	t.Helper()
	return newFixtureOn(t, etcdtest.Start(t), bodyLimit, binding)
}

// newFixtureOn is newFixtureBinding on a member the test started.
func newFixtureOn(t *testing.T, member *etcdtest.Member, bodyLimit int64, binding authz.CallerBinding) *fixture {
	t.Helper()
	registrar := manifesttest.NewSigner(t)
	f := &fixture{t: t, member: member, key: registrar.Key, creds: map[api.Role]api.Secret{}, byID: map[string]api.Secret{}, binding: binding}
	var stored []api.Credential
	add := func(id string, role api.Role, pools ...string) api.Secret {
		secret, cred, err := api.NewCredential(id, role)
		if err != nil {
			t.Fatal(err)
		}
		cred.Pools = pools
		f.byID[id] = secret
		stored = append(stored, cred)
		return secret
	}
	for _, role := range api.Roles() {
		f.creds[role] = add(string(role), role)
	}
	// More approvers, one of them also a principal ("alice") forming calls.
	add("approver-2", api.RoleApprover)
	add("alice", api.RoleApprover)
	// Backends limited to one pool each.
	add("backend-v1-3", api.RoleBackend, "github-v1-3")
	add("backend-v1-4", api.RoleBackend, "github-v1-4")
	auth, err := api.NewAuthenticator(stored)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	issuer := manifesttest.NewSigner(t)
	f.issuerKey = issuer.Key
	f.certificates = issuer.Verifier
	key, err := manifest.GenerateKey(jwa.EdDSA)
	if err != nil {
		t.Fatal(err)
	}
	// The server as it ships, on member, with the ext_authz gRPC service.
	// It keeps no audit trail and sets no formation rate limit: the tests
	// form calls faster than a host may, TestAuditPages serves a handler
	// with a trail of its own (and checks this one has none), and
	// TestFormationRateLimitOverHTTP a second replica with the limit on.
	f.server = servertest.Start(t, fcdserver.Config{
		EtcdEndpoints: member.Endpoints(), EtcdPrefix: testPrefix, EtcdQuota: member.Quota(), GRPCListen: "127.0.0.1:0",
		Registrars: registrar.Verifier, Issuers: issuer.Verifier, Auth: auth, Signer: key, Issuer: "fcd-test",
		BodyLimit: bodyLimit, GatewayCaller: string(binding), FormationRate: fcdserver.NoFormationLimit,
		AuditDir: fcdserver.AuditOff, Logger: log,
	})
	f.url = f.server.URL()
	oasWatch(t, f.url, t)
	f.policies, f.issuer = f.server.Policies(), f.server.Issuer()
	f.cfg = api.Config{Registry: f.server.UseCases().Registry, UseCases: f.server.UseCases(),
		PolicyStatus: f.policies.Status, Auth: auth, BodyLimit: bodyLimit, Logger: log}
	return f
}

// reply is an answer of the API under test.
type reply = apitest.Reply

func (f *fixture) do(method, path string, role api.Role, body []byte) reply {
	f.t.Helper()
	return f.doAs(method, path, f.creds[role], body)
}

// doAs calls with the given credential ("" for none).
func (f *fixture) doAs(method, path string, secret api.Secret, body []byte) reply {
	f.t.Helper()
	return apitest.Do(f.t, method, f.url+path, string(secret), nil, body)
}

// expect checks status and, for errors, the problem type slug and media
// type.
func (f *fixture) expect(r reply, status int, slug string) {
	f.t.Helper()
	if r.Status != status {
		f.t.Fatalf("status %d, want %d: %s", r.Status, status, r.Raw)
	}
	if slug == "" {
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/problem+json" {
		f.t.Fatalf("content type %q, want application/problem+json", ct)
	}
	if got := r.Body["type"]; got != api.ProblemBase+slug {
		f.t.Fatalf("problem type %v, want %s: %s", got, slug, r.Raw)
	}
}

func readExample(t *testing.T, release string) []byte {
	t.Helper()
	data, err := os.ReadFile("../examples/github/manifest-" + release + ".json")
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func (f *fixture) sign(payload []byte, key jwk.Key) []byte {
	f.t.Helper()
	if key == nil {
		key = f.key
	}
	jws, err := manifest.Sign(payload, key, manifest.TypManifest)
	if err != nil {
		f.t.Fatal(err)
	}
	return jws
}

// mutate decodes a manifest as generic JSON, applies fn and re-encodes it.
// exampleCertificate is examples/github/certificate-v1.4-to-v1.3.json
// valid from an hour ago for a day, so that tests do not depend on the
// example's own dates.
func exampleCertificate(t *testing.T) []byte {
	t.Helper()
	doc, err := os.ReadFile("../examples/github/certificate-v1.4-to-v1.3.json")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Second)
	return mutate(t, doc, func(m map[string]any) {
		m["issuedAt"], m["expiresAt"] = now.Add(-time.Hour).Format(time.RFC3339), now.Add(24*time.Hour).Format(time.RFC3339)
	})
}

func mutate(t *testing.T, data []byte, fn func(m map[string]any)) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	fn(m)
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestRegistryLifecycleOverHTTP(t *testing.T) {
	f := newFixture(t, 0)
	v13 := f.do("POST", "/v1/manifests", api.RoleRegistrar, f.sign(readExample(t, "v1.3"), nil))
	f.expect(v13, http.StatusCreated, "")
	v14 := f.do("POST", "/v1/manifests", api.RoleRegistrar, f.sign(readExample(t, "v1.4"), nil))
	f.expect(v14, http.StatusCreated, "")
	v14id := v14.Body["epoch"].(string)
	if v14.Header.Get("Location") != "/v1/epochs/"+v14id || v14.Body["state"] != "ACTIVE" {
		t.Fatalf("register reply: %s (Location %q)", v14.Raw, v14.Header.Get("Location"))
	}
	// The same manifest again: same epoch, 200. A fresh signature over the
	// same manifest is still the same epoch.
	again := f.do("POST", "/v1/manifests", api.RoleRegistrar, f.sign(readExample(t, "v1.4"), nil))
	f.expect(again, http.StatusOK, "")
	if again.Body["epoch"] != v14id {
		t.Fatalf("re-registration gave epoch %v, want %s", again.Body["epoch"], v14id)
	}

	list := f.do("GET", "/v1/epochs", api.RoleOperator, nil)
	f.expect(list, http.StatusOK, "")
	if eps := list.Body["epochs"].([]any); len(eps) != 2 {
		t.Fatalf("list: %s", list.Raw)
	}
	f.expect(f.do("GET", "/v1/epochs?state=ACTIVE&server=github", api.RoleHost, nil), http.StatusOK, "")

	snap := f.do("POST", "/v1/snapshots", api.RoleHost, []byte(`{"servers":["github"]}`))
	f.expect(snap, http.StatusCreated, "")
	snapID := snap.Body["id"].(string)
	for _, tool := range snap.Body["tools"].([]any) {
		tm := tool.(map[string]any)
		if tm["epoch"] != v14id || tm["summary"] == "" || tm["sideEffects"] == nil {
			t.Fatalf("snapshot entry %v not bound to v1.4 with a summary", tm)
		}
	}
	full := f.do("GET", "/v1/snapshots/"+snapID+"?view=full", api.RoleHost, nil)
	f.expect(full, http.StatusOK, "")
	tool := f.do("GET", "/v1/snapshots/"+snapID+"/tools/github/create_repository", api.RoleHost, nil)
	f.expect(tool, http.StatusOK, "")
	if d := tool.Body["descriptor"].(map[string]any); d["name"] != "create_repository" || d["inputSchema"] == nil {
		t.Fatalf("tool view: %s", tool.Raw)
	}
	f.expect(f.do("GET", "/v1/snapshots/"+snapID+"?view=everything", api.RoleHost, nil), http.StatusBadRequest, "invalid-parameter")
	f.expect(f.do("GET", "/v1/snapshots/"+snapID+"/tools/github/nope", api.RoleHost, nil), http.StatusNotFound, "tool-not-found")
	f.expect(f.do("GET", "/v1/snapshots/sha256:0000/tools/github/nope", api.RoleHost, nil), http.StatusNotFound, "snapshot-not-found")
	// Ids escaped as a URL path segment (JavaScript's encodeURIComponent
	// escapes the ":" of a digest) name the same resources.
	esc := func(id string) string { return strings.ReplaceAll(id, ":", "%3A") }
	if got := f.do("GET", "/v1/snapshots/"+esc(snapID), api.RoleHost, nil); got.Status != http.StatusOK || got.Body["id"] != snapID {
		t.Fatalf("the snapshot by its escaped id: %d %s", got.Status, got.Raw)
	}
	f.expect(f.do("GET", "/v1/snapshots/"+esc(snapID)+"/tools/github/create%5Frepository", api.RoleHost, nil), http.StatusOK, "")
	if got := f.do("GET", "/v1/epochs/"+esc(v14id), api.RoleOperator, nil); got.Status != http.StatusOK || got.Body["epoch"] != v14id && got.Body["id"] != v14id {
		t.Fatalf("the epoch by its escaped id: %d %s", got.Status, got.Raw)
	}
	f.expect(f.do("GET", "/v1/snapshots/"+esc("sha256:0000"), api.RoleHost, nil), http.StatusNotFound, "snapshot-not-found")

	// Lifecycle.
	f.expect(f.do("POST", "/v1/epochs/"+v14id+"/retire", api.RoleOperator, nil), http.StatusConflict, "epoch-state-conflict")
	drained := f.do("POST", "/v1/epochs/"+v14id+"/drain", api.RoleOperator, nil)
	f.expect(drained, http.StatusOK, "")
	if drained.Body["state"] != "DRAINING" {
		t.Fatalf("drain: %s", drained.Raw)
	}
	conflict := f.do("POST", "/v1/epochs/"+v14id+"/drain", api.RoleOperator, nil)
	f.expect(conflict, http.StatusConflict, "epoch-state-conflict")
	if conflict.Body["state"] != "DRAINING" {
		t.Fatalf("409 does not say the state: %s", conflict.Raw)
	}
	// Rollback: the next snapshot is v1.3's; the old snapshot is unchanged.
	rolled := f.do("POST", "/v1/snapshots", api.RoleHost, nil)
	f.expect(rolled, http.StatusCreated, "")
	if rolled.Body["id"] == snapID {
		t.Fatal("snapshot after drain kept the drained epoch")
	}
	if again := f.do("GET", "/v1/snapshots/"+snapID, api.RoleHost, nil); !bytes.Equal(again.Raw, f.do("GET", "/v1/snapshots/"+snapID, api.RoleHost, nil).Raw) || again.Status != 200 {
		t.Fatal("old snapshot not stable")
	}

	// Retire refused while a lease marker exists; ?wait= returns once it
	// goes. The marker is planted raw, as admission writes it, so that the
	// test can release it without a lease's life.
	marker := testPrefix + "markers/" + v14id + "/lease-1"
	f.member.PutRaw(t, marker, `{"state":"uncertain"}`)
	blocked := f.do("POST", "/v1/epochs/"+v14id+"/retire", api.RoleOperator, nil)
	f.expect(blocked, http.StatusConflict, "leases-outstanding")
	if blocked.Body["uncertainLeases"] != float64(1) || blocked.Body["activeLeases"] != float64(0) {
		t.Fatalf("409 counts: %s", blocked.Raw)
	}
	shown := f.do("GET", "/v1/epochs/"+v14id, api.RoleOperator, nil)
	if shown.Body["uncertainLeases"] != float64(1) || shown.Body["state"] != "DRAINING" {
		t.Fatalf("show: %s", shown.Raw)
	}
	f.expect(f.do("POST", "/v1/epochs/"+v14id+"/retire?wait=soon", api.RoleOperator, nil), http.StatusBadRequest, "invalid-parameter")
	f.expect(f.do("POST", "/v1/epochs/"+v14id+"/retire?wait=1h", api.RoleOperator, nil), http.StatusBadRequest, "invalid-parameter")

	// The marker goes once the retire is waiting, that is, watching the
	// markers: it read the marker at some revision, and its watch reports
	// the release after that revision. A wait that missed the release would
	// answer 409 leases-outstanding after 2m, not STALE.
	idle := etcdWatchers(t)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer f.member.DeleteRaw(t, marker) // even if the wait never shows: the retire must end
		for deadline := time.Now().Add(30 * time.Second); etcdWatchers(t) == idle; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Error("retire?wait= never watched the markers")
				return
			}
		}
	}()
	retired := f.do("POST", "/v1/epochs/"+v14id+"/retire?wait=2m", api.RoleOperator, nil)
	wg.Wait()
	f.expect(retired, http.StatusOK, "")
	if retired.Body["state"] != "STALE" {
		t.Fatalf("retire: %s", retired.Raw)
	}
	f.expect(f.do("GET", "/v1/epochs/sha256:nope", api.RoleOperator, nil), http.StatusNotFound, "epoch-not-found")
}

func TestManifestRefusals(t *testing.T) {
	f := newFixture(t, 0)
	good := readExample(t, "v1.4")
	stranger := manifesttest.NewSigner(t).Key
	tampered := func() []byte {
		jws := f.sign(good, nil)
		parts := bytes.Split(jws, []byte("."))
		// Re-encode a changed payload under the original signature.
		changed := bytes.Replace(good, []byte(`"v1.4.0"`), []byte(`"v1.4.1"`), 1)
		parts[1] = []byte(b64(changed))
		return bytes.Join(parts, []byte("."))
	}
	cases := []struct {
		note   string
		body   []byte
		status int
		slug   string
		check  func(r reply) bool
	}{
		{"not a JWS", []byte("hello"), 400, "malformed-document", nil},
		{"empty body", nil, 400, "malformed-document", nil},
		{"tampered payload", tampered(), 401, "bad-signature", func(r reply) bool { return r.Header.Get("WWW-Authenticate") == "" }},
		{"untrusted signer", f.sign(good, stranger), 403, "untrusted-signer", nil},
		{"unknown field in a signed manifest", f.sign(mutate(t, good, func(m map[string]any) { m["extra"] = true }), nil), 400, "malformed-document", nil},
		{"unknown field inside a tool", f.sign(mutate(t, good, func(m map[string]any) {
			m["tools"].([]any)[0].(map[string]any)["sideEffect"] = "read"
		}), nil), 400, "malformed-document", nil},
		{"structurally invalid", f.sign(mutate(t, good, func(m map[string]any) { m["pool"] = "" }), nil), 400, "invalid-manifest", nil},
		{"lint error", f.sign(mutate(t, good, func(m map[string]any) {
			for _, tl := range m["tools"].([]any) {
				tl.(map[string]any)["requiresApproval"] = false
			}
		}), nil), 422, "lint-failed", func(r reply) bool {
			fs, _ := r.Body["findings"].([]any)
			for _, x := range fs {
				if x.(map[string]any)["rule"] == "approval-required" && strings.HasPrefix(x.(map[string]any)["path"].(string), "/tools/") {
					return true
				}
			}
			return false
		}},
	}
	for _, tc := range cases {
		t.Run(tc.note, func(t *testing.T) {
			f.t = t
			r := f.do("POST", "/v1/manifests", api.RoleRegistrar, tc.body)
			f.expect(r, tc.status, tc.slug)
			if tc.check != nil && !tc.check(r) {
				t.Fatalf("body check failed: %s", r.Raw)
			}
		})
	}
	// Nothing refused was stored.
	f.t = t
	if list := f.do("GET", "/v1/epochs", api.RoleOperator, nil); len(list.Body["epochs"].([]any)) != 0 {
		t.Fatalf("refused manifests left epochs: %s", list.Raw)
	}
}

func TestBadRequestsAndCredentials(t *testing.T) {
	f := newFixture(t, 4096)
	big := bytes.Repeat([]byte("a"), 5000)
	cases := []struct {
		note         string
		method, path string
		role         api.Role
		header       string // raw Authorization header, overrides role
		body         []byte
		status       int
		slug         string
	}{
		{note: "malformed JSON", method: "POST", path: "/v1/snapshots", role: api.RoleHost, body: []byte(`{"servers":`), status: 400, slug: "malformed-json"},
		{note: "trailing data", method: "POST", path: "/v1/snapshots", role: api.RoleHost, body: []byte(`{} {}`), status: 400, slug: "malformed-json"},
		{note: "unknown field", method: "POST", path: "/v1/snapshots", role: api.RoleHost, body: []byte(`{"server":["x"]}`), status: 400, slug: "malformed-json"},
		{note: "oversized JSON", method: "POST", path: "/v1/snapshots", role: api.RoleHost, body: []byte(`{"servers":["` + string(big) + `"]}`), status: 413, slug: "body-too-large"},
		{note: "oversized manifest", method: "POST", path: "/v1/manifests", role: api.RoleRegistrar, body: big, status: 413, slug: "body-too-large"},
		{note: "no credential", method: "GET", path: "/v1/epochs", status: 401, slug: "unauthenticated"},
		{note: "unknown credential", method: "GET", path: "/v1/epochs", header: "Bearer fcd_operator_nottherealone", status: 401, slug: "unauthenticated"},
		{note: "wrong scheme", method: "GET", path: "/v1/epochs", header: "Basic b3BlcmF0b3I6eA==", status: 401, slug: "unauthenticated"},
		{note: "registrar may not list", method: "GET", path: "/v1/epochs", role: api.RoleRegistrar, status: 403, slug: "forbidden-role"},
		{note: "host may not drain", method: "POST", path: "/v1/epochs/sha256:x/drain", role: api.RoleHost, status: 403, slug: "forbidden-role"},
		{note: "operator may not register", method: "POST", path: "/v1/manifests", role: api.RoleOperator, body: []byte("x"), status: 403, slug: "forbidden-role"},
		{note: "backend may not snapshot", method: "POST", path: "/v1/snapshots", role: api.RoleBackend, status: 403, slug: "forbidden-role"},
		{note: "unknown route", method: "GET", path: "/v1/nothing", role: api.RoleOperator, status: 404, slug: "not-found"},
		{note: "wrong method", method: "DELETE", path: "/v1/epochs", role: api.RoleOperator, status: 405, slug: "method-not-allowed"},
		{note: "unknown state filter", method: "GET", path: "/v1/epochs?state=active", role: api.RoleOperator, status: 400, slug: "invalid-parameter"},
		{note: "healthz", method: "GET", path: "/healthz", status: 200},
		{note: "openapi", method: "GET", path: "/openapi.yaml", status: 200},
	}
	for _, tc := range cases {
		t.Run(tc.note, func(t *testing.T) {
			f.t = t
			var headers map[string]string
			switch {
			case tc.header != "":
				headers = map[string]string{"Authorization": tc.header}
			case tc.role != "":
				headers = map[string]string{"Authorization": "Bearer " + string(f.creds[tc.role])}
			}
			r := apitest.Do(t, tc.method, f.url+tc.path, "", headers, tc.body)
			f.expect(r, tc.status, tc.slug)
			if tc.status == 401 && !strings.HasPrefix(r.Header.Get("WWW-Authenticate"), "Bearer") {
				t.Fatalf("401 without a Bearer challenge")
			}
			if tc.status == 405 && r.Header.Get("Allow") != "GET" {
				t.Fatalf("405 Allow = %q, want GET", r.Header.Get("Allow"))
			}
		})
	}
}

func TestFailsClosedWhileEtcdIsDown(t *testing.T) {
	f := newFixture(t, 0)
	v13 := f.do("POST", "/v1/manifests", api.RoleRegistrar, f.sign(readExample(t, "v1.3"), nil))
	f.expect(v13, http.StatusCreated, "")
	id := v13.Body["epoch"].(string)
	f.waitPublished()
	f.expect(f.do("GET", "/readyz", "", nil), http.StatusOK, "")
	snap := f.do("POST", "/v1/snapshots", api.RoleHost, nil)
	f.expect(snap, http.StatusCreated, "")
	snapPath := "/v1/snapshots/" + snap.Body["id"].(string)
	f.expect(f.do("GET", snapPath, api.RoleHost, nil), http.StatusOK, "")

	f.member.Stop()
	// A snapshot is immutable: read once, this replica answers it from
	// memory with etcd down, and says it is immutable.
	if r := f.do("GET", snapPath, api.RoleHost, nil); r.Status != http.StatusOK ||
		!strings.Contains(r.Header.Get("Cache-Control"), "immutable") {
		t.Fatalf("a snapshot read with etcd down: %d %q %s", r.Status, r.Header.Get("Cache-Control"), r.Raw)
	}
	f.expect(f.do("GET", "/readyz", "", nil), http.StatusServiceUnavailable, "not-ready")
	writes := []struct {
		method, path string
		role         api.Role
		body         []byte
	}{
		{"POST", "/v1/manifests", api.RoleRegistrar, f.sign(readExample(t, "v1.4"), nil)},
		{"POST", "/v1/epochs/" + id + "/drain", api.RoleOperator, nil},
		{"POST", "/v1/epochs/" + id + "/retire", api.RoleOperator, nil},
		{"POST", "/v1/snapshots", api.RoleHost, nil},
		{"GET", "/v1/epochs", api.RoleOperator, nil},
	}
	for _, w := range writes {
		r := f.do(w.method, w.path, w.role, w.body)
		f.expect(r, http.StatusServiceUnavailable, "store-unavailable")
		if strings.Contains(string(r.Raw), "context deadline") || strings.Contains(string(r.Raw), "etcdserver") {
			t.Fatalf("%s %s leaks store internals: %s", w.method, w.path, r.Raw)
		}
		if r.Header.Get("Retry-After") == "" {
			t.Fatalf("%s %s: 503 without Retry-After", w.method, w.path)
		}
	}

	f.member.Restart()
	var ready reply
	testutil.EventuallyState(t, 30*time.Second, "/readyz to answer 200 once etcd is back", func() bool {
		ready = f.do("GET", "/readyz", "", nil)
		return ready.Status == http.StatusOK
	}, func() string { return fmt.Sprintf("%d %s", ready.Status, ready.Raw) })
	// Nothing lost, nothing half-done: v1.3 is still ACTIVE, v1.4 was
	// never registered, and both calls now work.
	shown := f.do("GET", "/v1/epochs/"+id, api.RoleOperator, nil)
	f.expect(shown, http.StatusOK, "")
	if shown.Body["state"] != "ACTIVE" {
		t.Fatalf("epoch after outage: %s", shown.Raw)
	}
	if list := f.do("GET", "/v1/epochs", api.RoleOperator, nil); len(list.Body["epochs"].([]any)) != 1 {
		t.Fatalf("epochs after outage: %s", list.Raw)
	}
	f.expect(f.do("POST", "/v1/manifests", api.RoleRegistrar, f.sign(readExample(t, "v1.4"), nil)), http.StatusCreated, "")
	f.expect(f.do("POST", "/v1/epochs/"+id+"/drain", api.RoleOperator, nil), http.StatusOK, "")
}

func TestConcurrentRegistrationsMakeOneEpoch(t *testing.T) {
	f := newFixture(t, 0)
	body := f.sign(readExample(t, "v1.4"), nil)
	const n = 12
	statuses := make(chan int, n)
	epochs := make(chan string, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(context.Background(), "POST", f.url+"/v1/manifests", bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+string(f.creds[api.RoleRegistrar]))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			var out map[string]any
			_ = json.NewDecoder(resp.Body).Decode(&out)
			statuses <- resp.StatusCode
			epochs <- out["epoch"].(string)
		}()
	}
	wg.Wait()
	close(statuses)
	close(epochs)
	created := 0
	for s := range statuses {
		if s == http.StatusCreated {
			created++
		} else if s != http.StatusOK {
			t.Fatalf("status %d", s)
		}
	}
	first := ""
	for e := range epochs {
		if first == "" {
			first = e
		} else if e != first {
			t.Fatalf("two epochs for one manifest: %s, %s", first, e)
		}
	}
	if created != 1 {
		t.Fatalf("%d registrations answered 201, want exactly 1", created)
	}
}
