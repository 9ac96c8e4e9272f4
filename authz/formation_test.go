package authz_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/authz/policy"
	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/internal/authztest"
	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/internal/testutil"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/policies"
	"github.com/fcd-authz/fcd/record"
)

const prefix = "/authztest/"

// quiet drops the use cases' logs in tests.
var quiet = slog.New(slog.DiscardHandler)

// clock is an injectable test clock: time in these tests must move on
// command (formation expiry), never by sleeping.
type clock struct{ now atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.now.Store(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *clock) Now() time.Time          { return time.Unix(0, c.now.Load()).UTC() }
func (c *clock) Advance(d time.Duration) { c.now.Add(int64(d)) }

type env struct {
	member   *etcdtest.Member
	store    *lease.Store
	forms    *authz.UseCases
	clock    *clock
	snapshot string
}

// newEnv registers the example github v1.4 (optionally edited), freezes a
// snapshot and returns formations decided by the given policy set (the
// embedded defaults when nil).
func newEnv(t testing.TB, set *policy.Set, edit func(m *manifest.Manifest)) *env {
	t.Helper()
	ctx := context.Background()
	member := etcdtest.Start(t)
	store := member.Store(t, prefix)
	registerExample(t, store, "v1.4", edit)
	snap, _, err := store.CreateSnapshot(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if set == nil {
		set = defaultSet(t)
	}
	c := newClock()
	return &env{member: member, store: store, clock: c, snapshot: snap.ID,
		forms: authztest.New(t, authz.Config{Store: store, Decider: set, TTL: 15 * time.Minute, Now: c.Now, Logger: quiet})}
}

// registerExample registers examples/github/manifest-<release>.json,
// edited, and returns its epoch id. It goes straight to the store: some
// tests register descriptors that lint would refuse, to prove the
// code-level invariants do not rely on lint.
func registerExample(t testing.TB, store *lease.Store, release string, edit func(m *manifest.Manifest)) string {
	t.Helper()
	data, err := os.ReadFile("../examples/github/manifest-" + release + ".json")
	if err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(m)
	}
	id, err := m.EpochID()
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.RegisterEpoch(context.Background(), &manifest.Signed{Manifest: m, Epoch: id, KeyID: "test", JWS: "test"}); err != nil {
		t.Fatal(err)
	}
	return id
}

// policyDir returns a policy directory and a function that writes one
// Rego and one Cedar file into it (atomically, as an editor would), for
// tests of reloads.
func policyDir(t testing.TB) (dir string, write func(rego, cedar string)) {
	dir = t.TempDir()
	return dir, func(rego, cedar string) {
		t.Helper()
		for name, body := range map[string]string{"p.rego": rego, "p.cedar": cedar} {
			if err := writeFileAtomic(dir, name, body); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// Minimal policy sets for reload tests.
const (
	allowAllRego  = "package fcd.authz\n\nallow contains {\"rule\": \"all\", \"reason\": \"all\"}\n"
	allowAllCedar = "@id(\"all\")\npermit (principal, action, resource);\n"
)

func defaultSet(t testing.TB) *policy.Set {
	t.Helper()
	set, err := policy.Load(context.Background(), policies.FS)
	if err != nil {
		t.Fatalf("default policies: %v", err)
	}
	return set
}

func (e *env) form(t *testing.T, session, tool, args, principal string, attrs map[string]any) (*record.Formation, error) {
	t.Helper()
	return e.forms.Formations.Form(context.Background(), authz.FormRequest{
		Snapshot: e.snapshot, Session: session, Tool: tool, Arguments: json.RawMessage(args),
		PrincipalID: principal, Attributes: attrs, Host: "host-1",
	})
}

// completed plants "tool completed in session" in the session ledger as
// completion records it, without a call's admission and outcome: the
// formation tests need only the ledger.
func (e *env) completed(t *testing.T, session, tool string) {
	t.Helper()
	e.member.PutRaw(t, prefix+"sessions/"+session+"/completed/"+tool, tool)
}

var admins = map[string]any{"groups": []any{"repo-admins"}}

func TestFormDecidesOverTheRecord(t *testing.T) {
	e := newEnv(t, nil, nil)
	e.completed(t, "s-met", "github/get_repository")
	cases := []struct {
		note      string
		session   string
		tool      string
		args      string
		attrs     map[string]any
		status    record.Status
		approvals int
	}{
		{"read is ready", "s1", "github/get_repository", `{"owner":"octo","repo":"demo"}`, nil, record.StatusReady, 0},
		{"write waits for one approval", "s1", "github/create_repository", `{"name":"demo"}`, nil, record.StatusPendingApproval, 1},
		{"delete without the attribute is denied", "s-met", "github/delete_repository", `{"owner":"octo","repo":"demo"}`, nil, record.StatusDenied, 0},
		{"delete with an unmet requires is denied", "s2", "github/delete_repository", `{"owner":"octo","repo":"demo"}`, admins, record.StatusDenied, 0},
		{"delete by an admin after get_repository waits for two", "s-met", "github/delete_repository", `{"owner":"octo","repo":"demo"}`, admins, record.StatusPendingApproval, 2},
	}
	for _, tc := range cases {
		t.Run(tc.note, func(t *testing.T) {
			f, err := e.form(t, tc.session, tc.tool, tc.args, "alice", tc.attrs)
			if err != nil {
				t.Fatal(err)
			}
			if f.Status != tc.status {
				t.Fatalf("status %s, want %s; decision %+v", f.Status, tc.status, f.Decision)
			}
			if tc.status != record.StatusDenied && f.ApprovalsRequired != tc.approvals {
				t.Fatalf("approvals %d, want %d", f.ApprovalsRequired, tc.approvals)
			}
			if f.Decision.PolicyDigest == "" || len(f.Decision.Engines) != 2 {
				t.Fatalf("decision lacks policy digest or engines: %+v", f.Decision)
			}
			for _, ed := range f.Decision.Engines {
				if len(ed.Rules) == 0 {
					t.Fatalf("engine %s decided without naming rules: %+v", ed.Engine, ed)
				}
			}
			want, _ := fencecheck.ArgumentDigest(tc.tool, json.RawMessage(tc.args))
			if f.ArgumentDigest != want {
				t.Fatalf("argument digest %s, want %s", f.ArgumentDigest, want)
			}
			if d, _ := f.Call.Digest(); d != f.Digest {
				t.Fatal("record digest does not cover the call")
			}
			if f.Principal.ID != "alice" || f.Principal.Host != "host-1" || f.Source.Pool != "github-v1-4" || f.Snapshot != e.snapshot {
				t.Fatalf("provenance: %+v %+v", f.Principal, f.Source)
			}
			// Every formation is stored, denied ones too (audit).
			got, err := e.forms.Formations.Get(context.Background(), f.ID)
			if err != nil || got.Status != tc.status || got.Digest != f.Digest {
				t.Fatalf("stored: %+v %v", got, err)
			}
		})
	}
}

func TestFormRefusesBadInput(t *testing.T) {
	e := newEnv(t, nil, nil)
	var argErr *manifest.ArgumentError
	cases := []struct {
		note  string
		req   authz.FormRequest
		check func(error) bool
	}{
		{"missing required argument", authz.FormRequest{Tool: "github/create_repository", Arguments: json.RawMessage(`{}`)},
			func(err error) bool { return errors.As(err, &argErr) && len(argErr.Violations) > 0 }},
		{"wrong type at a path", authz.FormRequest{Tool: "github/create_repository", Arguments: json.RawMessage(`{"name":"x","private":"yes"}`)},
			func(err error) bool {
				return errors.As(err, &argErr) && argErr.Violations[0].InstancePath == "/private"
			}},
		{"unknown tool", authz.FormRequest{Tool: "github/fork_repository"}, is(authz.ErrBadReference)},
		{"unknown snapshot", authz.FormRequest{Snapshot: "sha256:00", Tool: "github/get_repository"}, is(authz.ErrBadReference)},
		{"tool not server/tool", authz.FormRequest{Tool: "get_repository"}, is(authz.ErrBadRequest)},
		{"arguments not an object", authz.FormRequest{Tool: "github/get_repository", Arguments: json.RawMessage(`[1]`)}, is(authz.ErrBadRequest)},
		{"no session", authz.FormRequest{Tool: "github/get_repository", Session: "-"}, is(authz.ErrBadRequest)},
	}
	for _, tc := range cases {
		t.Run(tc.note, func(t *testing.T) {
			req := tc.req
			if req.Snapshot == "" {
				req.Snapshot = e.snapshot
			}
			switch req.Session {
			case "":
				req.Session = "s"
			case "-":
				req.Session = ""
			}
			req.Host = "host-1"
			f, err := e.forms.Formations.Form(context.Background(), req)
			if !tc.check(err) {
				t.Fatalf("Form = %+v, %v", f, err)
			}
		})
	}
	if page, err := e.forms.Formations.List(context.Background(), authz.ListRequest{}); err != nil || len(page.Formations) != 0 {
		t.Fatalf("refused formations were stored: %+v, %v", page, err)
	}
}

func is(target error) func(error) bool { return func(err error) bool { return errors.Is(err, target) } }

func approve(e *env, f *record.Formation, approver string, d record.ApprovalDecision) (*record.Formation, error) {
	return e.forms.Formations.Approve(context.Background(), f.ID, authz.ApprovalRequest{Approver: approver, Decision: d, Digest: f.Digest, Reason: "looked at it"})
}

func TestApprovals(t *testing.T) {
	e := newEnv(t, nil, nil)
	e.completed(t, "s", "github/get_repository")
	ctx := context.Background()

	write, err := e.form(t, "s", "github/create_repository", `{"name":"demo"}`, "alice", nil)
	if err != nil || write.Status != record.StatusPendingApproval {
		t.Fatalf("write: %+v %v", write, err)
	}
	if _, err := e.forms.Formations.Approve(ctx, write.ID, authz.ApprovalRequest{Approver: "bob", Decision: "approve", Digest: "sha256:other"}); !errors.Is(err, authz.ErrDigestMismatch) {
		t.Fatalf("digest mismatch: %v", err)
	}
	if _, err := approve(e, write, "alice", "approve"); !errors.Is(err, authz.ErrSelfApproval) {
		t.Fatalf("self approval: %v", err)
	}
	if _, err := e.forms.Formations.Approve(ctx, write.ID, authz.ApprovalRequest{Approver: "bob", Decision: "maybe", Digest: write.Digest}); !errors.Is(err, authz.ErrBadRequest) {
		t.Fatalf("bad decision: %v", err)
	}
	got, err := approve(e, write, "bob", "approve")
	if err != nil || got.Status != record.StatusReady || len(got.Approvals) != 1 {
		t.Fatalf("approve: %+v %v", got, err)
	}
	if _, err := approve(e, write, "carol", "approve"); !errors.Is(err, authz.ErrNotPending) {
		t.Fatalf("approve a ready formation: %v", err)
	}

	del, err := e.form(t, "s", "github/delete_repository", `{"owner":"octo","repo":"demo"}`, "alice", admins)
	if err != nil || del.ApprovalsRequired != 2 {
		t.Fatalf("delete: %+v %v", del, err)
	}
	if got, err := approve(e, del, "bob", "approve"); err != nil || got.Status != record.StatusPendingApproval {
		t.Fatalf("first of two: %+v %v", got, err)
	}
	if _, err := approve(e, del, "bob", "approve"); !errors.Is(err, authz.ErrDuplicateApprover) {
		t.Fatalf("same approver twice: %v", err)
	}
	if got, err := approve(e, del, "carol", "approve"); err != nil || got.Status != record.StatusReady {
		t.Fatalf("second of two: %+v %v", got, err)
	}

	denied, _ := e.form(t, "s", "github/create_repository", `{"name":"other"}`, "alice", nil)
	if got, err := approve(e, denied, "bob", "deny"); err != nil || got.Status != record.StatusDenied {
		t.Fatalf("deny: %+v %v", got, err)
	}
	if _, err := approve(e, denied, "carol", "approve"); !errors.Is(err, authz.ErrNotPending) {
		t.Fatalf("approve after a deny: %v", err)
	}
	if _, err := e.forms.Formations.Approve(ctx, "fm_nope", authz.ApprovalRequest{Approver: "bob", Decision: "approve", Digest: "x"}); !errors.Is(err, record.ErrFormationNotFound) {
		t.Fatalf("unknown formation: %v", err)
	}
	pending, err := e.forms.Formations.List(ctx, authz.ListRequest{Status: record.StatusPendingApproval})
	if err != nil || len(pending.Formations) != 0 {
		t.Fatalf("pending list: %+v %v", pending, err)
	}
}

func TestApprovalAfterExpiry(t *testing.T) {
	e := newEnv(t, nil, nil)
	f, err := e.form(t, "s", "github/create_repository", `{"name":"demo"}`, "alice", nil)
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(15*time.Minute + time.Second)
	if got, _ := e.forms.Formations.Get(context.Background(), f.ID); got.Status != record.StatusExpired {
		t.Fatalf("status after expiry: %s", got.Status)
	}
	if _, err := approve(e, f, "bob", "approve"); !errors.Is(err, authz.ErrExpired) {
		t.Fatalf("approve after expiry: %v", err)
	}
	// The expiry is now stored, not only computed.
	stored, err := e.store.GetFormation(context.Background(), f.ID)
	if err != nil || stored.Status != record.StatusExpired || len(stored.Approvals) != 0 {
		t.Fatalf("stored after refused approval: %+v %v", stored, err)
	}
	if _, err := approve(e, f, "carol", "approve"); !errors.Is(err, authz.ErrExpired) {
		t.Fatalf("second approval after expiry: %v", err)
	}
}

func TestConcurrentApprovalsAreOrderedAndNoneLost(t *testing.T) {
	e := newEnv(t, nil, nil)
	e.completed(t, "s", "github/get_repository")
	for round := range 8 {
		f, err := e.form(t, "s", "github/delete_repository", `{"owner":"octo","repo":"r`+fmt.Sprint(round)+`"}`, "alice", admins)
		if err != nil || f.ApprovalsRequired != 2 {
			t.Fatalf("form: %+v %v", f, err)
		}
		// Two distinct approvers at once, and a third racing them with the
		// same identity as the second: both distinct approvals must land,
		// the duplicate must be refused.
		var wg sync.WaitGroup
		errs := make([]error, 3)
		for i, who := range []string{"bob", "carol", "carol"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = approve(e, f, who, "approve")
			}()
		}
		wg.Wait()
		if errs[0] != nil {
			t.Fatalf("bob: %v", errs[0])
		}
		okCarol := 0
		for _, err := range errs[1:] {
			switch {
			case err == nil:
				okCarol++
			case !errors.Is(err, authz.ErrDuplicateApprover) && !errors.Is(err, authz.ErrNotPending):
				t.Fatalf("carol: %v", err)
			}
		}
		got, _ := e.forms.Formations.Get(context.Background(), f.ID)
		if okCarol != 1 || got.Status != record.StatusReady || len(got.Approvals) != 2 {
			t.Fatalf("round %d: carol ok %d, status %s, approvals %+v", round, okCarol, got.Status, got.Approvals)
		}
	}
}

// allowAll is a policy set that allows every call with no approval.
func allowAll(t *testing.T) *policy.Set {
	t.Helper()
	set, err := policy.Load(context.Background(), fstest.MapFS{
		"all.rego":  {Data: []byte("package fcd.authz\n\nallow contains {\"rule\": \"allow_all\", \"reason\": \"test\"}\n")},
		"all.cedar": {Data: []byte("@id(\"allow-all\")\npermit (principal, action, resource);\n")},
	})
	if err != nil {
		t.Fatalf("allow-all policies: %v", err)
	}
	return set
}

// TestMutatingCallsNeverReadyWithoutApproval proves the MCP+ invariant in
// code: with a policy that allows everything and descriptors that claim no
// approval is needed, a write or delete still waits for one approval.
func TestMutatingCallsNeverReadyWithoutApproval(t *testing.T) {
	e := newEnv(t, allowAll(t), func(m *manifest.Manifest) {
		for i := range m.Tools {
			m.Tools[i].RequiresApproval = false
			m.Tools[i].Dependencies = nil
		}
	})
	for _, tc := range []struct {
		tool, args string
		want       record.Status
	}{
		{"github/get_repository", `{"owner":"o","repo":"r"}`, record.StatusReady},
		{"github/create_repository", `{"name":"n"}`, record.StatusPendingApproval},
		{"github/delete_repository", `{"owner":"o","repo":"r"}`, record.StatusPendingApproval},
	} {
		f, err := e.form(t, "s", tc.tool, tc.args, "alice", nil)
		if err != nil {
			t.Fatal(err)
		}
		if f.Decision.Approvals != 0 || f.Decision.Verdict != record.VerdictAllow {
			t.Fatalf("%s: the allow-all policy did not allow with zero approvals: %+v", tc.tool, f.Decision)
		}
		if f.Status != tc.want {
			t.Fatalf("%s: status %s, want %s", tc.tool, f.Status, tc.want)
		}
		if tc.want == record.StatusPendingApproval {
			if f.ApprovalsRequired != 1 {
				t.Fatalf("%s: approvals required %d, want 1", tc.tool, f.ApprovalsRequired)
			}
			got, err := approve(e, f, "bob", "approve")
			if err != nil || got.Status != record.StatusReady {
				t.Fatalf("%s: after one approval: %+v %v", tc.tool, got, err)
			}
		}
	}
}

// writePolicies writes a complete policy set into dir: the default set,
// with a comment naming version, so that two versions differ in digest
// (and in nothing they decide).
func writePolicies(t *testing.T, dir, version string) {
	t.Helper()
	entries, err := fs.ReadDir(policies.FS, ".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".rego") && !strings.HasSuffix(name, ".cedar") && !strings.HasSuffix(name, ".json") {
			continue
		}
		data, err := fs.ReadFile(policies.FS, name)
		if err != nil {
			t.Fatal(err)
		}
		if name == "fcd.rego" {
			data = append(data, "\n# policy version "+version+"\n"...)
		}
		tmp := filepath.Join(dir, "."+name+".tmp")
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPolicyReloadRacesFormations forms calls from several goroutines while
// the policy set is reloaded back and forth between two versions. Every
// formation must be decided by one whole version: it records the digest of
// one of them and the decision both give. Run with -race.
func TestPolicyReloadRacesFormations(t *testing.T) {
	ctx := context.Background()
	live := t.TempDir()
	writePolicies(t, live, "(v1)")
	pm, err := policy.NewManager(ctx, policy.Source{Dir: live}, policy.ManagerConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	digest := map[string]string{pm.Status().Digest: "(v1)"}
	writePolicies(t, live, "(v2)")
	if err := pm.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	digest[pm.Status().Digest] = "(v2)"
	if len(digest) != 2 {
		t.Fatal("the two versions have the same digest")
	}
	e := newEnv(t, nil, nil)
	forms := authztest.New(t, authz.Config{Store: e.store, Decider: pm, Logger: quiet})

	stop := make(chan struct{})
	var reloads atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			writePolicies(t, live, []string{"(v1)", "(v2)"}[i%2])
			if err := pm.Reload(ctx); err != nil {
				t.Errorf("reload: %v", err)
				return
			}
			reloads.Add(1)
		}
	}()
	const workers, each = 4, 10
	results := make(chan *record.Formation, workers*each)
	var formers sync.WaitGroup
	for w := range workers {
		formers.Add(1)
		go func() {
			defer formers.Done()
			for i := range each {
				f, err := forms.Formations.Form(ctx, authz.FormRequest{Snapshot: e.snapshot, Session: fmt.Sprintf("w%d", w), Tool: "github/create_repository",
					Arguments: json.RawMessage(fmt.Sprintf(`{"name":"r%d"}`, i)), PrincipalID: "alice", Host: "host-1"})
				if err != nil {
					t.Error(err)
					return
				}
				results <- f
			}
		}()
	}
	formers.Wait()
	close(stop)
	wg.Wait()
	close(results)
	seen := map[string]int{}
	for f := range results {
		version, ok := digest[f.Decision.PolicyDigest]
		if !ok {
			t.Fatalf("formation decided by unknown policy %s", f.Decision.PolicyDigest)
		}
		seen[version]++
		if len(f.Decision.Engines) != 2 || !f.Decision.Allowed() || f.Status != record.StatusPendingApproval || f.ApprovalsRequired != 1 {
			t.Fatalf("formation %+v", f)
		}
	}
	if reloads.Load() < 2 {
		t.Fatalf("only %d reloads raced the formations", reloads.Load())
	}
	t.Logf("%d reloads; formations per version: %v", reloads.Load(), seen)
}

func writeFileAtomic(dir, name, body string) error {
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, name))
}

// TestFormRefusesArgumentsCanonicalJSONCannotCarry: a number beyond a
// double's precision would be rounded by canonical JSON, so the approver
// would see another call than the one sent; it is refused.
func TestFormRefusesArgumentsCanonicalJSONCannotCarry(t *testing.T) {
	e := newEnv(t, nil, allowNumbers)
	_, err := e.form(t, "s", "github/get_repository", `{"owner":"o","repo":"r","id":9007199254740993}`, "alice", nil)
	if !errors.Is(err, authz.ErrBadRequest) {
		t.Fatalf("inexact number: %v", err)
	}
	if f, err := e.form(t, "s", "github/get_repository", `{"owner":"o","repo":"r","id":9007199254740992}`, "alice", nil); err != nil || string(f.Arguments) != `{"id":9007199254740992,"owner":"o","repo":"r"}` {
		t.Fatalf("exact number: %v %s", err, f.Arguments)
	}
}

// allowNumbers lets get_repository take an extra integer argument.
func allowNumbers(m *manifest.Manifest) {
	m.Tool("get_repository").InputSchema = json.RawMessage(`{"type":"object","properties":{"owner":{"type":"string"},"repo":{"type":"string"},"id":{"type":"integer"}}}`)
}

// TestFormationsFailClosedWithoutEtcd: with etcd stopped, forming and
// approving answer ErrUnavailable and record nothing; afterwards both work.
func TestFormationsFailClosedWithoutEtcd(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := context.Background()
	w, err := e.form(t, "s", "github/create_repository", `{"name":"n"}`, "alice", nil)
	if err != nil {
		t.Fatal(err)
	}
	e.member.Stop()
	if _, err := e.form(t, "s", "github/get_repository", `{"owner":"o","repo":"r"}`, "alice", nil); !errors.Is(err, record.ErrUnavailable) {
		t.Fatalf("form with etcd down: %v", err)
	}
	if _, err := approve(e, w, "bob", "approve"); !errors.Is(err, record.ErrUnavailable) {
		t.Fatalf("approve with etcd down: %v", err)
	}
	e.member.Restart()
	got := testutil.Await(t, 30*time.Second, "the approval once etcd is back", func() (*record.Formation, error) { return approve(e, w, "bob", "approve") })
	if got.Status != record.StatusReady || len(got.Approvals) != 1 {
		t.Fatalf("approval after the outage: %+v", got)
	}
	if all, err := e.forms.Formations.List(ctx, authz.ListRequest{}); err != nil || len(all.Formations) != 1 {
		t.Fatalf("%+v, %v after the outage, want 1 formation (nothing recorded while down)", all, err)
	}
}

// TestListPages pages through formations by status as callers see it
// (an unadmitted formation past its expiry lists as expired, not as what
// is stored), and refuses page parameters out of range.
func TestListPages(t *testing.T) {
	e := newEnv(t, nil, nil)
	ctx := context.Background()
	var pending, ready []string
	for i := range 7 {
		f, err := e.form(t, "s", "github/create_repository", `{"name":"demo"}`, "alice", nil)
		if err != nil {
			t.Fatal(err)
		}
		pending = append(pending, f.ID)
		if i < 3 {
			r, err := e.form(t, "s", "github/get_repository", `{"owner":"o","repo":"r"}`, "alice", nil)
			if err != nil || r.Status != record.StatusReady {
				t.Fatalf("read formation: %+v %v", r, err)
			}
			ready = append(ready, r.ID)
		}
	}
	slices.Sort(pending)
	slices.Sort(ready)
	walk := func(t *testing.T, req authz.ListRequest) []string {
		t.Helper()
		var ids []string
		for range 100 {
			page, err := e.forms.Formations.List(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if req.Limit > 0 && len(page.Formations) > req.Limit {
				t.Fatalf("page of %d, limit %d", len(page.Formations), req.Limit)
			}
			for _, f := range page.Formations {
				if req.Status != "" && f.Status != req.Status {
					t.Fatalf("%s listed with status %s, asked for %s", f.ID, f.Status, req.Status)
				}
				ids = append(ids, f.ID)
			}
			if page.Next == "" {
				return ids
			}
			req.After = page.Next
		}
		t.Fatal("paging does not end")
		return nil
	}
	all := slices.Sorted(slices.Values(append(slices.Clone(pending), ready...)))
	cases := []struct {
		note  string
		req   authz.ListRequest
		after time.Duration // the clock moves on this much first
		want  []string
	}{
		{note: "all, default limit", want: all},
		{note: "all, pages of 3", req: authz.ListRequest{Limit: 3}, want: all},
		{note: "pending, pages of 2", req: authz.ListRequest{Status: record.StatusPendingApproval, Limit: 2}, want: pending},
		{note: "ready, pages of 1", req: authz.ListRequest{Status: record.StatusReady, Limit: 1}, want: ready},
		{note: "expired: none yet", req: authz.ListRequest{Status: record.StatusExpired}},
		{note: "pending after expiry: none", req: authz.ListRequest{Status: record.StatusPendingApproval}, after: 16 * time.Minute},
		{note: "expired after expiry: all, as shown", req: authz.ListRequest{Status: record.StatusExpired, Limit: 4}, want: all},
	}
	for _, tc := range cases {
		t.Run(tc.note, func(t *testing.T) {
			e.clock.Advance(tc.after)
			if got := walk(t, tc.req); !slices.Equal(got, tc.want) {
				t.Fatalf("listed %v, want %v", got, tc.want)
			}
		})
	}

	bad := []struct {
		note string
		req  authz.ListRequest
		want error
	}{
		{"negative limit", authz.ListRequest{Limit: -1}, authz.ErrBadPage},
		{"limit over the maximum", authz.ListRequest{Limit: authz.MaxListLimit + 1}, authz.ErrBadPage},
		{"after with a control character", authz.ListRequest{After: "fm_\n"}, authz.ErrBadPage},
		{"after too long", authz.ListRequest{After: strings.Repeat("a", 257)}, authz.ErrBadPage},
		{"unknown status", authz.ListRequest{Status: "waiting"}, authz.ErrBadRequest},
	}
	for _, tc := range bad {
		t.Run(tc.note, func(t *testing.T) {
			if _, err := e.forms.Formations.List(ctx, tc.req); !errors.Is(err, tc.want) {
				t.Fatalf("List(%+v) = %v, want %v", tc.req, err, tc.want)
			}
		})
	}
	if page, err := e.forms.Formations.List(ctx, authz.ListRequest{Limit: authz.MaxListLimit}); err != nil || len(page.Formations) != len(all) {
		t.Fatalf("the maximum limit: %+v, %v", page, err)
	}
}
