package policy_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fcd-authz/fcd/authz/policy"
	"github.com/fcd-authz/fcd/internal/bundletest"
	tu "github.com/fcd-authz/fcd/internal/testutil"
	"github.com/fcd-authz/fcd/policies"
)

// denySet is a small policy set that allows every call but deletes, in
// both languages, with tests; failing makes its Rego test expect the
// opposite, so the set compiles and its tests fail.
func denySet(failing bool) fstest.MapFS {
	want := "not"
	if failing {
		want = ""
	}
	return fstest.MapFS{
		"p.rego": {Data: []byte(`package fcd.authz

allow contains {"rule": "allow-all", "reason": "bundle"}

deny contains {"rule": "deny-delete", "reason": "no deletes"} if input.tool.sideEffects == "delete"
`)},
		"p_test.rego": {Data: []byte(`package fcd.authz_test

import data.fcd.authz

test_delete_denied if {
	` + want + ` count(authz.deny) == 0 with input as {"tool": {"sideEffects": "delete"}}
}
`)},
		"p.cedar": {Data: []byte(`@id("allow-all") permit (principal, action, resource);
@id("deny-delete") @reason("no deletes") forbid (principal, action == Action::"delete", resource);
`)},
		"p.cases.json": {Data: []byte(`[
  {"name": "delete is denied", "input": {"tool": {"name": "x", "server": "s", "qualifiedName": "s/x", "sideEffects": "delete",
     "requiresApproval": true, "requires": [], "producesInputFor": [], "exclusiveWith": []}},
   "expect": {"verdict": "deny", "rules": ["deny-delete"]}}
]`)},
	}
}

// deleteCall is the input of a delete call.
func deleteCall(t *testing.T) *policy.Input {
	t.Helper()
	var in policy.Input
	if err := json.Unmarshal([]byte(`{"phase": "formation", "formation": {"id": "fm_1", "principal": {"id": "alice"},
		"tool": "s/x", "metadata": {"sideEffects": "delete", "requiresApproval": true}},
		"tool": {"name": "x", "server": "s", "qualifiedName": "s/x", "sideEffects": "delete", "requiresApproval": true,
		"requires": [], "producesInputFor": [], "exclusiveWith": []}}`), &in); err != nil {
		t.Fatal(err)
	}
	return &in
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func reloads(t *testing.T, m *policy.Manager, result string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m.Collector())
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "fcd_policy_reloads_total" {
			continue
		}
		for _, mt := range f.GetMetric() {
			if mt.GetLabel()[0].GetValue() == result {
				return mt.GetCounter().GetValue()
			}
		}
	}
	return -1
}

// recorder keeps the policy events a manager records.
type recorder struct {
	mu     sync.Mutex
	events []map[string]any
	kinds  []string
}

func (r *recorder) Record(_ context.Context, kind string, _ int64, data any) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kinds = append(r.kinds, kind)
	r.events = append(r.events, data.(map[string]any))
	return nil
}

func (r *recorder) last() (string, map[string]any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.kinds[len(r.kinds)-1], r.events[len(r.events)-1]
}

// TestBundleFromServer loads policy sets from OPA bundles built by OPA's
// own build (opa build -b) and signed by its signer, served over HTTP:
// the good one is put in force and decides; one with a bad signature, an
// unsigned one, one whose tests fail and a server that is down are
// refused and the set in force stays; an unchanged bundle is not
// downloaded (ETag) nor loaded again.
func TestBundleFromServer(t *testing.T) {
	ctx := context.Background()
	key, other := bundletest.NewKey(t), bundletest.NewKey(t)
	vc, err := policy.LoadBundleKeys(key.Public, "", "")
	if err != nil {
		t.Fatal(err)
	}
	good := bundletest.Build(t, denySet(false), "v1", key)
	srv := bundletest.NewServer(t, good)
	rec := &recorder{}
	src := &policy.BundleSource{Location: srv.BundleURL(), Verification: vc, MinDelay: 5 * time.Millisecond, MaxDelay: 10 * time.Millisecond}
	m, err := policy.NewManager(ctx, policy.Source{Bundle: src}, policy.ManagerConfig{Logger: quietLogger(), Trail: rec})
	if err != nil {
		t.Fatal(err)
	}
	// The digest names the files as the bundle holds them (opa build
	// formats Rego modules).
	inForce := m.Current().Digest()
	st := m.Status()
	if st.Digest != inForce || !strings.HasPrefix(inForce, "sha256:") || st.Revision != "v1" || st.Source != srv.BundleURL() || st.LastError != "" {
		t.Fatalf("status %+v, want revision v1", st)
	}
	if files := m.Current().Files(); strings.Join(files, ",") != "p.cases.json,p.cedar,p.rego,p_test.rego" {
		t.Errorf("files %v", files)
	}
	d := m.Decide(ctx, deleteCall(t))
	if d.Allowed() || d.PolicyRevision != "v1" || d.PolicyDigest != inForce {
		t.Fatalf("a delete under the bundle's policy: %+v", d)
	}
	for _, e := range d.Engines {
		if e.Verdict != "deny" || len(e.Rules) != 1 || e.Rules[0] != "deny-delete" {
			t.Errorf("%s: %+v", e.Engine, e)
		}
	}
	if kind, ev := rec.last(); kind != policy.EventLoaded || ev["revision"] != "v1" || ev["digest"] != inForce {
		t.Errorf("policy event %s %v", kind, ev)
	}

	watch, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); m.Watch(watch, 0) }()
	defer func() { stop(); <-done }()

	// Unchanged: polled, answered 304, not loaded again.
	loadedAt := st.LoadedAt
	tu.Eventually(t, 5*time.Second, "polls answered 304", func() bool { return srv.NotModified.Load() >= 3 })
	if n := srv.Downloads.Load(); n != 1 {
		t.Errorf("an unchanged bundle was downloaded %d times", n)
	}
	if st := m.Status(); !st.LoadedAt.Equal(loadedAt) || reloads(t, m, "loaded") != 1 {
		t.Errorf("an unchanged bundle was loaded again: %+v", st)
	}

	refused := []struct {
		note   string
		bundle []byte
		want   error
		result string
	}{
		{"signed with another key", bundletest.Build(t, denySet(false), "v2-forged", other), policy.ErrBundleSignature, "signature"},
		{"unsigned", bundletest.Build(t, denySet(false), "v2-unsigned", bundletest.Key{}), policy.ErrBundleSignature, "signature"},
		{"its tests fail", bundletest.Build(t, denySet(true), "v2-failing", key), policy.ErrTestsFailed, "tests_failed"},
		{"not a bundle", []byte("not gzip"), policy.ErrInvalidPolicy, "invalid"},
	}
	for _, tc := range refused {
		t.Run(tc.note, func(t *testing.T) {
			before := reloads(t, m, tc.result)
			srv.Set(tc.bundle)
			tu.Eventually(t, 5*time.Second, "the bundle refused", func() bool { return reloads(t, m, tc.result) == before+1 })
			st := m.Status()
			if st.Digest != inForce || st.Revision != "v1" || st.LastError == "" {
				t.Errorf("status after a refused bundle: %+v", st)
			}
			if d := m.Decide(ctx, deleteCall(t)); d.Allowed() || d.PolicyRevision != "v1" {
				t.Errorf("decided by %q after a refused bundle", d.PolicyRevision)
			}
			if kind, ev := rec.last(); kind != policy.EventRefused || ev["inForce"] != inForce {
				t.Errorf("policy event %s %v", kind, ev)
			}
			// Forced (SIGHUP), the same bundle is downloaded and refused,
			// with the error that says why.
			if err := m.Reload(ctx); !errors.Is(err, tc.want) {
				t.Errorf("Reload = %v, want %v", err, tc.want)
			}
			// Refused once, then left until it changes.
			n := srv.NotModified.Load()
			tu.Eventually(t, 5*time.Second, "polls answered 304", func() bool { return srv.NotModified.Load() >= n+2 })
			if got := reloads(t, m, tc.result); got != before+2 {
				t.Errorf("a refused bundle was loaded %v times, want twice (the poll, Reload)", got-before)
			}
		})
	}

	// A new good revision is put in force.
	srv.Set(bundletest.Build(t, policies.FS, "v3", key))
	tu.Eventually(t, 5*time.Second, "v3 in force", func() bool { return m.Status().Revision == "v3" })
	if st := m.Status(); st.LastError != "" || st.Digest == inForce {
		t.Errorf("status after v3: %+v", st)
	}
	if kind, ev := rec.last(); kind != policy.EventLoaded || ev["revision"] != "v3" {
		t.Errorf("policy event %s %v", kind, ev)
	}

	// The server goes down: the set in force stays, the error shows.
	srv.Close()
	tu.Eventually(t, 5*time.Second, "the download failure reported", func() bool { return reloads(t, m, "unavailable") == 1 })
	if st := m.Status(); st.Revision != "v3" || !strings.Contains(st.LastError, "unavailable") {
		t.Errorf("status with the server down: %+v", st)
	}
	if err := m.Reload(ctx); !errors.Is(err, policy.ErrBundleUnavailable) {
		t.Errorf("Reload with the server down = %v", err)
	}
	if m.Current().Revision() != "v3" {
		t.Errorf("the set in force is %q", m.Current().Revision())
	}
}

// TestBundleFile loads a bundle file, and refuses at start a bundle whose
// signature does not verify, whose tests fail, or whose data holds more
// than the Cedar files.
func TestBundleFile(t *testing.T) {
	ctx := context.Background()
	key := bundletest.NewKey(t)
	vc, err := policy.LoadBundleKeys(key.Public, "", "")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "bundle.tar.gz")
	load := func(data []byte, vc *bundle.VerificationConfig) (*policy.Manager, error) {
		if err := os.WriteFile(file, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return policy.NewManager(ctx, policy.Source{Bundle: &policy.BundleSource{Location: file, Verification: vc}},
			policy.ManagerConfig{Logger: quietLogger()})
	}
	m, err := load(bundletest.Build(t, policies.FS, "r1", key), vc)
	if err != nil {
		t.Fatal(err)
	}
	if st := m.Status(); st.Revision != "r1" || st.Source != file || st.Digest != m.Current().Digest() {
		t.Errorf("status %+v", st)
	}
	// Unsigned and no keys: accepted, as OPA does.
	if _, err := load(bundletest.Build(t, policies.FS, "r2", bundletest.Key{}), nil); err != nil {
		t.Errorf("an unsigned bundle without keys: %v", err)
	}
	// Signed and no keys: refused.
	if _, err := load(bundletest.Build(t, policies.FS, "r2", key), nil); !errors.Is(err, policy.ErrBundleSignature) {
		t.Errorf("a signed bundle without keys: %v", err)
	}
	if _, err := load(bundletest.Build(t, denySet(true), "r3", key), vc); !errors.Is(err, policy.ErrTestsFailed) {
		t.Errorf("a bundle whose tests fail: %v", err)
	}
	extra := denySet(false)
	extra["facts/data.json"] = &fstest.MapFile{Data: []byte(`{"admins": ["alice"]}`)}
	if _, err := load(bundletest.Build(t, extra, "r4", key), vc); !errors.Is(err, policy.ErrInvalidPolicy) ||
		!strings.Contains(err.Error(), "data.facts") {
		t.Errorf("a bundle with data besides the Cedar files: %v", err)
	}
	if _, err := load(bundletest.Build(t, fstest.MapFS{"p.rego": denySet(false)["p.rego"]}, "r5", key), vc); !errors.Is(err, policy.ErrInvalidPolicy) {
		t.Errorf("a bundle without Cedar: %v", err)
	}
}

// TestLoadBundleKeys reads the key forms OPA's keys configuration allows.
func TestLoadBundleKeys(t *testing.T) {
	dir := t.TempDir()
	key := bundletest.NewKey(t)
	pub, err := os.ReadFile(key.Public)
	if err != nil {
		t.Fatal(err)
	}
	file := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		note, file, keyID, alg string
		wantKID, wantAlg       string
		wantErr                bool
	}{
		{note: "a PEM public key", file: key.Public, wantKID: "default", wantAlg: "RS256"},
		{note: "a PEM public key, named and PS256", file: key.Public, keyID: "k1", alg: "PS256", wantKID: "k1", wantAlg: "PS256"},
		{note: "an HMAC secret", file: file("secret", "s3cret"), wantKID: "default", wantAlg: "HS256"},
		{note: "OPA's keys object", file: file("keys.json", `{"k2": {"key": `+quote(string(pub))+`, "algorithm": "RS512"}}`),
			keyID: "k2", wantKID: "k2", wantAlg: "RS512"},
		{note: "OPA's keys object, an unknown key id", file: file("keys2.json", `{"k2": {"key": "x"}}`), keyID: "k9", wantErr: true},
		{note: "a private key", file: key.Private, wantErr: true},
		{note: "an unsupported algorithm", file: key.Public, alg: "EdDSA", wantErr: true},
		{note: "no file", file: filepath.Join(dir, "missing"), wantErr: true},
	} {
		t.Run(tc.note, func(t *testing.T) {
			vc, err := policy.LoadBundleKeys(tc.file, tc.keyID, tc.alg)
			if tc.wantErr {
				if err == nil {
					t.Fatal("no error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			kc, err := vc.GetPublicKey(tc.wantKID)
			if err != nil || kc.Algorithm != tc.wantAlg || vc.KeyID != tc.wantKID {
				t.Errorf("keys %+v (%v), want %s %s", vc, err, tc.wantKID, tc.wantAlg)
			}
		})
	}
}

func quote(s string) string {
	return `"` + strings.ReplaceAll(strings.ReplaceAll(s, "\n", `\n`), `"`, `\"`) + `"`
}
