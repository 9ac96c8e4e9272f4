package authz_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/audit"
	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/internal/authztest"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/record"
	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwk"
)

// TestTrailRecordsTheCallsLife: with a trail, a call's formation,
// admission, claim and outcome are recorded in that order, each with the
// etcd revision that ordered it — the admission with the token's
// fcd_revision, the claim and the outcome after it — and the trail verifies
// against the published key. The formation event carries the argument
// digest, never the arguments.
func TestTrailRecordsTheCallsLife(t *testing.T) {
	ae, tr, root := newTrailEnv(t)
	e, key := ae.env, ae.key

	f, a := ae.admitRead(t, "trail")
	req := ae.claimRequest(t, a, "cl_trail")
	if _, err := e.forms.Leases.Claim(testCtx(t), req); err != nil {
		t.Fatal(err)
	}
	if _, err := e.forms.Leases.Complete(testCtx(t), authz.CompleteRequest{Lease: a.Lease, Claim: "cl_trail", Outcome: record.OutcomeEffect}); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}

	events := readEvents(t, filepath.Join(root, "test"))
	var kinds []string
	for _, ev := range events {
		kinds = append(kinds, ev.Kind)
	}
	want := []string{authz.EventFormation, authz.EventAdmission, authz.EventClaim, authz.EventOutcome}
	if len(kinds) != len(want) {
		t.Fatalf("events %v, want %v", kinds, want)
	}
	for i := range want {
		if kinds[i] != want[i] {
			t.Fatalf("events %v, want %v", kinds, want)
		}
	}
	formed, admitted, claimed, reported := events[0], events[1], events[2], events[3]
	if admitted.Revision != req.Revision || claimed.Revision <= req.Revision || reported.Revision <= claimed.Revision {
		t.Errorf("admission, claim and outcome at revisions %d, %d and %d; the token's is %d", admitted.Revision, claimed.Revision, reported.Revision, req.Revision)
	}
	if formed.Revision <= 0 || formed.Revision >= admitted.Revision {
		t.Errorf("formation at revision %d, admission at %d", formed.Revision, admitted.Revision)
	}
	var fd map[string]any
	if err := json.Unmarshal(formed.Data, &fd); err != nil {
		t.Fatal(err)
	}
	if fd["id"] != f.ID || fd["argumentDigest"] != f.ArgumentDigest || fd["digest"] != f.Digest || fd["arguments"] != nil {
		t.Errorf("formation event %s", formed.Data)
	}
	var od map[string]any
	if err := json.Unmarshal(reported.Data, &od); err != nil {
		t.Fatal(err)
	}
	if od["lease"] != a.Lease || od["outcome"] != "effect" || od["by"] != "backend" || od["formation"] != f.ID {
		t.Errorf("outcome event %s", reported.Data)
	}

	pub, err := key.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	keys := jwk.NewSet()
	if err := keys.AddKey(pub); err != nil {
		t.Fatal(err)
	}
	r, err := audit.Verify(root, keys)
	if err != nil || !r.OK {
		t.Fatalf("verify: %v\n%s", err, r.Summary())
	}
}

// newTrailEnv is an admission env whose use cases record to a trail in
// root, signed with the issuer's key.
func newTrailEnv(t *testing.T) (*admitEnv, *followedTrail, string) {
	t.Helper()
	return newTrailEnvWith(t, "")
}

// newTrailEnvWith is newTrailEnv keeping arguments as args says.
func newTrailEnvWith(t *testing.T, args authz.TrailArguments) (*admitEnv, *followedTrail, string) {
	t.Helper()
	return newTrailEnvFollowing(t, nil, args)
}

// newTrailEnvConfig is newTrailEnv with its use cases' configuration
// edited.
func newTrailEnvConfig(t *testing.T, edit func(*authz.Config)) (*admitEnv, *followedTrail, string) {
	t.Helper()
	return newTrailEnvFollowing(t, edit, authz.TrailArgumentsNone)
}

func newTrailEnvFollowing(t *testing.T, edit func(*authz.Config), args authz.TrailArguments) (*admitEnv, *followedTrail, string) {
	t.Helper()
	e := newEnv(t, nil, nil)
	key, iss := newIssuer(t, e.store, jwa.EdDSA)
	root := t.TempDir()
	tr, err := audit.Open(audit.Config{Root: root, Replica: "test", Key: key})
	if err != nil {
		t.Fatal(err)
	}
	ft := followTrail(t, e.store, tr, args)
	cfg := authz.Config{Store: e.store, Decider: defaultSet(t), Now: e.clock.Now, Issuer: iss, Logger: quiet, Trail: ft.f}
	if edit != nil {
		edit(&cfg)
	}
	e.forms = authztest.New(t, cfg)
	return &admitEnv{env: e, key: key, iss: iss}, ft, root
}

// followedTrail is a trail kept by a Follower of the store, running until
// Close, which first waits until the trail holds everything the store
// committed.
type followedTrail struct {
	*audit.Trail
	f      *authz.Follower
	store  *lease.Store
	cancel context.CancelFunc
	done   chan error
	closed bool
}

func followTrail(t *testing.T, store *lease.Store, tr *audit.Trail, args authz.TrailArguments) *followedTrail {
	t.Helper()
	f := authz.NewFollower(authz.FollowerConfig{Store: store, Trail: authztest.TrailWriter{Trail: tr}, Arguments: args, Logger: quiet})
	ctx, cancel := context.WithCancel(context.Background())
	ft := &followedTrail{Trail: tr, f: f, store: store, cancel: cancel, done: make(chan error, 1)}
	go func() { ft.done <- f.Run(ctx) }()
	t.Cleanup(func() { _ = ft.Close() })
	return ft
}

func (ft *followedTrail) Close() error {
	if ft.closed {
		return nil
	}
	ft.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rev, err := ft.store.Revision(ctx)
	if err == nil {
		err = ft.f.WaitRecorded(ctx, rev)
	}
	ft.cancel()
	return errors.Join(err, <-ft.done, ft.Trail.Close())
}

// TestTrailKeepsArgumentsAsConfigured: with TrailArguments set, the
// formation event holds the arguments (masked as the mode says; the
// masking itself is TestTrailArguments') beside their digest.
func TestTrailKeepsArgumentsAsConfigured(t *testing.T) {
	ae, tr, root := newTrailEnvWith(t, authz.TrailArgumentsRedacted)
	f, _ := ae.admitRead(t, "kept")
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	events := readEvents(t, filepath.Join(root, "test"))
	if len(events) == 0 || events[0].Kind != authz.EventFormation {
		t.Fatalf("events %+v", events)
	}
	var fd struct {
		ID             string
		ArgumentDigest string
		Arguments      json.RawMessage
	}
	if err := json.Unmarshal(events[0].Data, &fd); err != nil {
		t.Fatal(err)
	}
	if fd.ID != f.ID || fd.ArgumentDigest != f.ArgumentDigest || string(fd.Arguments) != `{"owner":"o","repo":"kept"}` {
		t.Fatalf("formation event %s", events[0].Data)
	}
}

// readEvents reads a replica directory's events, in order, but for those
// of the environment's setup (registrations, snapshots, policy sets).
var setupEvent = map[string]bool{authz.EventManifest: true, authz.EventSnapshot: true, authz.EventCertificate: true,
	authz.EventPolicy: true, authz.EventPolicyRefused: true}

func readEvents(t *testing.T, dir string) []audit.Event {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "trail-*.jsonl"))
	var out []audit.Event
	for _, path := range files {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var ev audit.Event
			if json.Unmarshal(sc.Bytes(), &ev) == nil && ev.Kind != "" && !setupEvent[ev.Kind] {
				out = append(out, ev)
			}
		}
		f.Close()
	}
	return out
}

// TestTrailKeepsWhoResolved: an operator's resolution is recorded with the
// operator's credential id and reason.
func TestTrailKeepsWhoResolved(t *testing.T) {
	ae, tr, root := newTrailEnv(t)
	e := ae.env
	_, a := ae.admitRead(t, "resolved")
	if _, err := e.forms.Leases.Claim(testCtx(t), ae.claimRequest(t, a, "cl_r")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.forms.Leases.Complete(testCtx(t), authz.CompleteRequest{Lease: a.Lease, Claim: "cl_r", Outcome: record.OutcomeUncertain}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.forms.Leases.Resolve(testCtx(t), "ops-1", a.Lease, record.OutcomeNoEffect, "checked the backend"); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	events := readEvents(t, filepath.Join(root, "test"))
	last := events[len(events)-1]
	var d map[string]any
	if err := json.Unmarshal(last.Data, &d); err != nil {
		t.Fatal(err)
	}
	if last.Kind != authz.EventResolution || d["operator"] != "ops-1" || d["reason"] != "checked the backend" || d["outcome"] != "no_effect" {
		t.Fatalf("last event %s %s", last.Kind, last.Data)
	}
}
