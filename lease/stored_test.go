package lease_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
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
const goldenVersion = "v2"

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

// loadStored puts the golden files of version dir straight into etcd
// under prefix, in one transaction (one revision), and returns the
// scenario's ids as the files hold them and the revision.
func loadStored(t *testing.T, raw *clientv3.Client, prefix, dir string) (storedIDs, int64) {
	t.Helper()
	dir = filepath.Join("testdata", "stored", dir)
	idOf := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		var v struct{ ID string }
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatal(err)
		}
		return v.ID
	}
	ids := storedIDs{epoch: idOf("epochs~EPOCH"), target: idOf("epochs~TARGET"), snapshot: idOf("snapshots~SNAPSHOT"),
		cert: idOf("certificates~EPOCH~create_repository~CERT"), revoked: idOf("certificates~EPOCH~get_repository~REVOKED")}
	keys := strings.NewReplacer("~", "/", "EPOCH", ids.epoch, "TARGET", ids.target, "SNAPSHOT", ids.snapshot,
		"CERT", ids.cert, "REVOKED", ids.revoked)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var ops []clientv3.Op
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(e.Name(), "certificate-ids~") {
			// The index holds the certificate's whole key, prefix and all.
			b = []byte(prefix + strings.TrimPrefix(string(b), "/golden/"))
		}
		ops = append(ops, clientv3.OpPut(prefix+keys.Replace(e.Name()), string(b)))
	}
	resp, err := raw.Txn(testCtx(t)).Then(ops...).Commit()
	if err != nil {
		t.Fatal(err)
	}
	return ids, resp.Header.Revision
}

// storedReads is everything the store's API reads of the scenario's
// values, revisions cleared (two stores loaded at different revisions
// compare equal).
type storedReads struct {
	Epoch, Target *record.Epoch
	Snapshot      *record.Snapshot
	Certs         []*record.Certificate
	Formations    []*record.Formation
	Pending       []*record.Formation
	Open          *record.Lease
	Leases        []*record.Lease
	Session       *record.SessionHistory
	Generation    int64
	Cursor        int64
	Floor         int64
	Restores      []lease.RestoreResult
	Resolution    string
	Changes       []lease.Change
}

func readStored(t *testing.T, s *lease.Store, ids storedIDs, rev int64) storedReads {
	t.Helper()
	ctx := testCtx(t)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	var r storedReads
	var err error
	r.Epoch, err = s.GetEpoch(ctx, ids.epoch)
	must(err)
	r.Target, err = s.GetEpoch(ctx, ids.target)
	must(err)
	r.Snapshot, err = s.GetSnapshot(ctx, ids.snapshot)
	must(err)
	for _, id := range []string{ids.cert, ids.revoked} {
		c, err := s.GetCertificate(ctx, id)
		must(err)
		r.Certs = append(r.Certs, c)
	}
	r.Formations, _, err = s.ListFormations(ctx, lease.FormationPage{}, nil)
	must(err)
	r.Pending, _, err = s.PendingApproval(ctx, lease.FormationPage{})
	must(err)
	r.Open, err = s.OpenLease(ctx, "ls_open")
	must(err)
	r.Leases, err = s.EpochLeases(ctx, ids.epoch)
	must(err)
	r.Session, err = s.SessionHistory(ctx, "session-1")
	must(err)
	r.Generation, err = s.PoolGeneration(ctx, "gitlab-v2.0.0")
	must(err)
	r.Cursor, _, err = s.TrailCursor(ctx, "replica-a")
	must(err)
	r.Floor, _, err = s.TrailFloor(ctx, 100*365*24*time.Hour)
	must(err)
	r.Restores, err = s.Restores(ctx)
	must(err)
	r.Resolution, err = s.Resolution(ctx, "ls_resolved")
	must(err)
	// The follower's view of the revision that wrote them all.
	fctx, cancel := context.WithCancel(ctx)
	err = s.Follow(fctx, rev, func(c lease.Commit) error {
		if c.Revision == rev {
			r.Changes = c.Changes
			cancel()
		}
		return nil
	}, nil)
	if r.Changes == nil {
		t.Fatalf("follow: no changes at revision %d: %v", rev, err)
	}
	// Revisions differ between two loads.
	for _, e := range []*record.Epoch{r.Epoch, r.Target} {
		e.Revision, e.StateRevision = 0, 0
	}
	for _, c := range r.Certs {
		c.Revision = 0
	}
	for _, l := range append([]*record.Lease{r.Open}, r.Leases...) {
		l.Revision = 0
		if l.Claim != nil {
			l.Claim.Revision = 0
		}
	}
	for i, c := range r.Changes {
		switch c := c.(type) {
		case lease.EpochRegistered:
			c.Epoch.Revision = 0
			r.Changes[i] = c
		case lease.CertificateRegistered:
			c.Certificate.Revision = 0
			r.Changes[i] = c
		case lease.LeaseAdmitted:
			c.Lease.Revision = 0
			r.Changes[i] = c
		}
	}
	return r
}

// TestStoredVersion1IsRead puts the values main wrote before the stored
// format was versioned (testdata/stored/v1, no "v") straight into etcd,
// and reads them through the store's API and its follower: every field of
// every record equals what the same values read in version 2
// (testdata/stored/v2) give, and the fields the scenario set are there.
func TestStoredVersion1IsRead(t *testing.T) {
	s, raw := openStoredStore(t, "/v1/")
	ids1, rev1 := loadStored(t, raw, "/v1/", "v1")
	s2, err := lease.Open(context.Background(), lease.Config{Endpoints: raw.Endpoints(), Prefix: "/v2/",
		Logger: slog.New(slog.DiscardHandler), Now: func() time.Time { return storedClock }})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	ids2, rev2 := loadStored(t, raw, "/v2/", "v2")
	v1, v2 := readStored(t, s, ids1, rev1), readStored(t, s2, ids2, rev2)
	if ids1 != ids2 {
		t.Fatalf("the versions' scenarios differ: %+v, %+v", ids1, ids2)
	}
	a, _ := json.MarshalIndent(v1, "", " ")
	b, _ := json.MarshalIndent(v2, "", " ")
	if !reflect.DeepEqual(v1, v2) {
		t.Fatalf("version 1 reads\n%s\nversion 2 reads\n%s", a, b)
	}

	// What the scenario wrote, as version 1 holds it.
	byID := map[string]*record.Formation{}
	for _, f := range v1.Formations {
		byID[f.ID] = f
	}
	full, rec := byID["fm_full"], byID["fm_recovery"]
	switch {
	case len(v1.Formations) != 6 || len(v1.Pending) != 1 || v1.Pending[0].ID != "fm_pending":
		t.Errorf("formations %d, pending %v", len(v1.Formations), v1.Pending)
	case full.Status != record.StatusFailed || full.Lease != "ls_failed" || full.Outcome != record.OutcomeFailed ||
		full.Failure == nil || full.Failure.Code != -32000 || len(full.Approvals) != 1 || full.Approvals[0].Approver != "bob" ||
		full.Principal.Attributes["team"] != "infra" || string(full.Arguments) != `{"name":"fcd","private":true}` ||
		full.Metadata.Dependencies == nil || full.Decision.Engines[0].Successor == nil || full.Decision.Successor == nil ||
		full.Digest != "sha256:record-fm_full" || full.ApprovalsRequired != 1 || !full.UpdatedAt.Equal(storedClock):
		t.Errorf("fm_full: %+v", full)
	case rec.Recovery == nil || rec.Recovery.Of != "fm_full" || rec.Recovery.FailureMode == nil || rec.Successor == nil ||
		rec.Successor.Epoch != ids1.target || rec.Successor.Certificate != ids1.cert || rec.Status != record.StatusUncertain:
		t.Errorf("fm_recovery: %+v", rec)
	case v1.Open.State != record.LeaseRunning || v1.Open.ClaimID() != "claim/2" || v1.Open.Target.Epoch != ids1.epoch ||
		v1.Open.Formation != "fm_open" || v1.Open.ArgumentDigest != "sha256:arguments" || !v1.Open.AdmittedAt.Equal(storedClock):
		t.Errorf("ls_open: %+v", v1.Open)
	case len(v1.Leases) != 2 || v1.Epoch.UncertainLeases != 1 || v1.Epoch.ActiveLeases != 1 || v1.Target.State != record.StateDraining:
		t.Errorf("epoch leases %v, counts %d/%d, target %s", v1.Leases, v1.Epoch.ActiveLeases, v1.Epoch.UncertainLeases, v1.Target.State)
	case !v1.Certs[1].Revoked || v1.Certs[1].RevokedAt == nil || v1.Certs[0].Certificate.Tool != "create_repository" || v1.Certs[0].KeyID != "issuer-1":
		t.Errorf("certificates: %+v", v1.Certs)
	case v1.Generation != 3 || v1.Cursor != 42 || v1.Floor != 43 || len(v1.Restores) != 1 || v1.Restores[0].Bump != 1000 ||
		v1.Resolution != "eyJhbGciOiJFZERTQSJ9.resolution.signature":
		t.Errorf("generation %d, cursor %d, floor %d, restores %v, resolution %q", v1.Generation, v1.Cursor, v1.Floor, v1.Restores, v1.Resolution)
	case !slices.Equal(v1.Session.Completed, []string{"github/get_repository"}) || !slices.Equal(v1.Session.Admitted, []string{"github/create_repository"}):
		t.Errorf("session: %+v", v1.Session)
	}
	kinds := map[string]int{}
	for _, c := range v1.Changes {
		kinds[strings.TrimPrefix(reflect.TypeOf(c).String(), "lease.")]++
	}
	want := map[string]int{"EpochRegistered": 2, "SnapshotCreated": 1, "CertificateRegistered": 2, "CertificateRevoked": 1,
		"FormationCreated": 6, "LeaseAdmitted": 2, "LeaseClaimed": 1, "LeaseClosed": 4, "LeaseReadmitted": 1,
		"GenerationSet": 1, "PolicyRecorded": 1, "EpochChanged": 1}
	if !reflect.DeepEqual(kinds, want) {
		t.Errorf("the follower's changes: %v, want %v", kinds, want)
	}
}

// TestStoredValuesRefused: a value of a format version the store does not
// read, a version 2 value with a member its type does not have, and a
// value that is not a JSON object are refused as record.ErrCorrupt naming
// the key, never read as empty or as far as they go.
func TestStoredValuesRefused(t *testing.T) {
	s, raw := openStoredStore(t, "/refused/")
	ctx := testCtx(t)
	ids, _ := loadStored(t, raw, "/refused/", "v2")
	put := func(key, value string) {
		t.Helper()
		if _, err := raw.Put(ctx, "/refused/"+key, value); err != nil {
			t.Fatal(err)
		}
	}
	refused := func(what string, err error, version int) {
		t.Helper()
		var ve *lease.VersionError
		switch {
		case !errors.Is(err, record.ErrCorrupt):
			t.Errorf("%s: %v, want ErrCorrupt", what, err)
		case version != 0 && (!errors.As(err, &ve) || ve.Version != version):
			t.Errorf("%s: %v, want a VersionError of version %d", what, err, version)
		case !strings.Contains(err.Error(), "/refused/"):
			t.Errorf("%s: %v does not name the key", what, err)
		}
	}
	put("formation-states/fm_full", `{"v":3,"status":"ready","approvals":[],"updatedAt":"2026-11-30T12:00:00Z"}`)
	_, err := s.GetFormation(ctx, "fm_full")
	refused("a newer version", err, 3)
	put("formation-states/fm_full", `{"v":7,"state":"a member of version 7"}`)
	_, err = s.GetFormation(ctx, "fm_full")
	refused("a newer version with other members", err, 7)
	put("markers/"+ids.epoch+"/ls_open", `{"v":2,"id":"ls_open","state":"admitted","extra":true}`)
	_, err = s.OpenLease(ctx, "ls_open")
	refused("a member version 2 does not have", err, 0)
	put("snapshots/"+ids.snapshot, `null`)
	_, err = s.GetSnapshot(ctx, ids.snapshot)
	refused("null", err, 0)
	put("trail-cursors/replica-a", `{"v":2,"revision":42,"at":"2026-11-30T12:00:00Z"} {}`)
	_, _, err = s.TrailFloor(ctx, 0)
	refused("data after the value", err, 0)
	put("claims/ls_open/claim%2F2", `[]`)
	_, err = s.EpochLeases(ctx, ids.epoch)
	refused("not an object", err, 0)
}
