package lease_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// update rewrites the golden files of the stored values:
// go test -run TestStoredValuesGolden ./lease -update
var update = flag.Bool("update", false, "rewrite lease/testdata/stored/v2 from what the store writes")

// storedClock is the fixed clock of the stored-values scenario.
var storedClock = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// goldenVersion is the stored format TestStoredValuesGolden pins.
const goldenVersion = "v1"

// storedIDs are the ids the scenario writes under, by a name that the
// golden files are named by.
type storedIDs struct {
	epoch, target, snapshot, cert, revoked string
}

// storedScenario writes, through the store's API, one value of every kind
// the store keeps: an epoch (and a second one, drained), a snapshot, two
// certificates (one revoked), formations through their lives (formed with
// every member set, approved, admitted with session dependencies,
// reissued, claimed, closed as failed or with an effect, swept to
// uncertain, resolved with a signed resolution), a pool generation, a
// trail cursor, a policy event and a recorded restore.
func storedScenario(t *testing.T, s *lease.Store) storedIDs {
	t.Helper()
	ctx := lease.WithActor(testCtx(t), "op-alice")
	src, dst := testManifest(t, "github", "v1.4.0", "private"), testManifest(t, "gitlab", "v2.0.0", "public")
	ep, tgt := register(t, s, src), register(t, s, dst)
	snap, _, err := s.CreateSnapshot(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	cert := func(tool string) *record.Certificate {
		c := &manifest.Certificate{Source: src.Epoch, Target: dst.Epoch, Tool: tool,
			Envelope: json.RawMessage(`{"type":"object","required":["private"]}`), Effects: map[string]any{"visibility": "private"},
			Profile:  manifest.ProfileRef{ID: "profile-1", Digest: src.Epoch},
			IssuedAt: storedClock.Add(-time.Hour), ExpiresAt: storedClock.Add(30 * 24 * time.Hour)}
		id, err := c.ID()
		if err != nil {
			t.Fatal(err)
		}
		rec, _, err := s.RegisterCertificate(ctx, &manifest.SignedCertificate{Certificate: c, ID: id, KeyID: "issuer-1", JWS: "jws-of-" + tool})
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	kept, revoked := cert("create_repository"), cert("get_repository")
	if _, err := s.RevokeCertificate(ctx, revoked.ID); err != nil {
		t.Fatal(err)
	}

	source := record.Target{Epoch: ep.ID, Server: ep.Server, Release: ep.Release, Pool: ep.Pool,
		Artifact: ep.Artifact, ConfigDigest: ep.ConfigDigest}
	form := func(id, tool string, status record.Status, with ...func(*record.Formation)) *record.Formation {
		f := &record.Formation{
			Call: record.Call{ID: id, Session: "session-1", Tool: "github/" + tool, Snapshot: snap.ID,
				Principal:        record.Principal{ID: "alice", Attributes: map[string]any{"team": "infra"}, Host: "host-1"},
				DescriptorDigest: "sha256:descriptor", Arguments: json.RawMessage(`{"name":"fcd","private":true}`),
				ArgumentDigest: "sha256:arguments", Source: source,
				Metadata: record.Metadata{Summary: "Create a repository.", SideEffects: manifest.SideEffectWrite, RequiresApproval: true,
					FailureModes: []manifest.FailureMode{{Error: "conflict", Description: "exists", Recovery: "retry", MaxAttempts: 2}},
					Dependencies: &manifest.Dependencies{Requires: []string{"github/get_repository"}, ExclusiveWith: []string{"github/delete_repository"}}},
				CreatedAt: storedClock, ExpiresAt: storedClock.Add(time.Hour),
			},
			Digest: "sha256:record-" + id,
			Decision: record.Decision{Verdict: record.VerdictAllow, Approvals: 1, PolicyDigest: "sha256:policy", DecidedAt: storedClock,
				Engines: []record.EngineDecision{
					{Engine: "rego", Verdict: record.VerdictAllow, Approvals: 1, Rules: []string{"data.fcd.allow"}, Reasons: []string{"write needs approval"},
						Successor: &record.SuccessorVerdict{Verdict: record.VerdictAllow, Rules: []string{"data.fcd.successor"}, Reasons: []string{}}},
					{Engine: "cedar", Verdict: record.VerdictAllow, Rules: []string{"policy0"}, Reasons: []string{}, Error: ""},
				},
				Successor: &record.SuccessorDecision{Certificate: "cert", Epoch: "target", Verdict: record.VerdictAllow}},
			Status:            status,
			ApprovalsRequired: 1,
			Approvals:         []record.Approval{},
			UpdatedAt:         storedClock,
		}
		for _, w := range with {
			w(f)
		}
		if _, err := s.CreateFormation(ctx, f, time.Hour); err != nil {
			t.Fatalf("create formation %s: %v", id, err)
		}
		return f
	}
	admit := func(f *record.Formation, lid string, requires, exclusive []string) *record.Lease {
		got, rev, err := s.GetFormationRevision(ctx, f.ID)
		if err != nil {
			t.Fatal(err)
		}
		l := &record.Lease{ID: lid, Formation: f.ID, Session: f.Session, Tool: f.Tool, ArgumentDigest: f.ArgumentDigest,
			Target: source, AdmittedAt: storedClock}
		if err := s.Admit(ctx, lease.AdmitRequest{Formation: got, FormationRev: rev, Lease: l, Requires: requires, Exclusive: exclusive}); err != nil {
			t.Fatalf("admit %s: %v", lid, err)
		}
		return l
	}

	// An effect, so that the session records a completed tool.
	read := admit(form("fm_effect", "get_repository", record.StatusReady), "ls_effect", nil, nil)
	if _, err := s.ClaimLease(ctx, lease.ClaimRequest{Lease: read.ID, Epoch: ep.ID, Revision: read.Revision, Claim: "claim-0", At: storedClock}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CloseLease(ctx, lease.CloseRequest{Lease: read.ID, Claim: "claim-0", Outcome: record.OutcomeEffect, Keep: time.Hour}); err != nil {
		t.Fatal(err)
	}

	// Formed with every member, approved, admitted with dependencies,
	// reissued, claimed, closed as failed.
	full := form("fm_full", "create_repository", record.StatusPendingApproval)
	if _, _, err := s.UpdateFormation(ctx, full.ID, func(f *record.Formation) error {
		f.Approvals = append(f.Approvals, record.Approval{Approver: "bob", Decision: record.Approve, Digest: f.Digest, Reason: "fine", At: storedClock})
		f.Status, f.UpdatedAt = record.StatusReady, storedClock
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	l := admit(full, "ls_failed", nil, []string{"github/delete_repository"})
	if err := s.RecordReissue(ctx, l, storedClock.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ClaimLease(ctx, lease.ClaimRequest{Lease: l.ID, Epoch: ep.ID, Revision: l.Revision, Claim: "claim-1", At: storedClock}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CloseLease(ctx, lease.CloseRequest{Lease: l.ID, Claim: "claim-1", Outcome: record.OutcomeFailed,
		Failure: &record.Failure{Code: -32000, Error: "conflict", Message: "exists"}, Keep: time.Hour}); err != nil {
		t.Fatal(err)
	}

	// A recovery of the failed call, with a successor, admitted with a
	// requirement and swept to uncertain (its marker stays).
	recovery := form("fm_recovery", "create_repository", record.StatusReady, func(f *record.Formation) {
		f.Recovery = &record.Recovery{Of: full.ID, Root: full.ID, Attempt: 1, Outcome: record.OutcomeFailed,
			FailureMode: &manifest.FailureMode{Error: "conflict", Recovery: "retry", MaxAttempts: 2}}
		f.Successor = &record.Successor{Target: record.Target{Epoch: tgt.ID, Server: tgt.Server, Release: tgt.Release, Pool: tgt.Pool,
			Artifact: tgt.Artifact, ConfigDigest: tgt.ConfigDigest}, Certificate: kept.ID, Issuer: "issuer-1",
			Effects: map[string]any{"visibility": "private"}, Profile: manifest.ProfileRef{ID: "profile-1", Digest: src.Epoch},
			ExpiresAt: storedClock.Add(30 * 24 * time.Hour)}
	})
	admit(recovery, "ls_uncertain", []string{"github/get_repository"}, nil)
	if _, err := s.MarkLeaseUnreported(ctx, "ls_uncertain", storedClock.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	// A call swept to uncertain and resolved with a signed resolution.
	res := form("fm_resolved", "get_repository", record.StatusReady)
	admit(res, "ls_resolved", nil, nil)
	if _, err := s.MarkLeaseUnreported(ctx, "ls_resolved", storedClock.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CloseLease(ctx, lease.CloseRequest{Lease: "ls_resolved", Outcome: record.OutcomeNoEffect, Resolve: true,
		Resolution: "eyJhbGciOiJFZERTQSJ9.resolution.signature", Operator: "op-alice", Reason: "checked the backend", Keep: time.Hour}); err != nil {
		t.Fatal(err)
	}

	// An open lease: admitted with dependencies, its token issued again,
	// claimed; and a formation that waits for approval.
	open := admit(form("fm_open", "create_repository", record.StatusReady), "ls_open",
		[]string{"github/get_repository"}, []string{"github/delete_repository"})
	if err := s.RecordReissue(ctx, open, storedClock.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ClaimLease(ctx, lease.ClaimRequest{Lease: open.ID, Epoch: ep.ID, Revision: open.Revision, Claim: "claim/2", At: storedClock}, nil); err != nil {
		t.Fatal(err)
	}
	form("fm_pending", "create_repository", record.StatusPendingApproval)

	if _, err := s.Drain(ctx, tgt.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetGeneration(ctx, tgt.Pool, 3, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetTrailCursor(ctx, "replica-a", 42); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordPolicy(ctx, "replica-a", "policy.loaded", map[string]any{"digest": "sha256:policy"}); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordRestore(ctx, lease.RestoreResult{Revision: 7, Bump: 1000}); err != nil {
		t.Fatal(err)
	}
	return storedIDs{epoch: ep.ID, target: tgt.ID, snapshot: snap.ID, cert: kept.ID, revoked: revoked.ID}
}

// openStoredStore opens a store on a fresh member whose clock is
// storedClock, and a raw client of the member.
func openStoredStore(t *testing.T, prefix string) (*lease.Store, *clientv3.Client) {
	t.Helper()
	m := etcdtest.Start(t)
	s, err := lease.Open(context.Background(), lease.Config{Endpoints: m.Endpoints(), Prefix: prefix,
		Logger: slog.New(slog.DiscardHandler), Now: func() time.Time { return storedClock }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	raw, err := clientv3.New(clientv3.Config{Endpoints: m.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	return s, raw
}

// storedFiles are the values under prefix, by the name of their golden
// file: the key without the prefix, the scenario's digest ids replaced by
// their names and slashes by "~".
func storedFiles(t *testing.T, raw *clientv3.Client, prefix string, ids storedIDs) map[string][]byte {
	t.Helper()
	resp, err := raw.Get(testCtx(t), prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	names := strings.NewReplacer(ids.epoch, "EPOCH", ids.target, "TARGET", ids.snapshot, "SNAPSHOT",
		ids.cert, "CERT", ids.revoked, "REVOKED", "/", "~", ":", "_")
	out := map[string][]byte{}
	for _, kv := range resp.Kvs {
		out[names.Replace(strings.TrimPrefix(string(kv.Key), prefix))] = kv.Value
	}
	return out
}

// TestStoredValuesGolden writes one value of every kind through the store
// and compares the bytes etcd holds, key by key, with
// testdata/stored/v2 (-update rewrites it): a change of what the store
// writes is a change of its stored format, to be made on purpose (a new
// version, read beside the old one), never by the way.
func TestStoredValuesGolden(t *testing.T) {
	const prefix = "/golden/"
	s, raw := openStoredStore(t, prefix)
	got := storedFiles(t, raw, prefix, storedScenario(t, s))
	dir := filepath.Join("testdata", "stored", goldenVersion)
	if *update {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, v := range got {
			if err := os.WriteFile(filepath.Join(dir, name), v, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, e := range entries {
		want = append(want, e.Name())
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[e.Name()], b) {
			t.Errorf("%s:\n got %s\nwant %s", e.Name(), got[e.Name()], b)
		}
	}
	var keys []string
	for k := range got {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if !slices.Equal(keys, want) {
		t.Errorf("keys written:\n%s\nwant (the golden files):\n%s", strings.Join(keys, "\n"), strings.Join(want, "\n"))
	}
}
