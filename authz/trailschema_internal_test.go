package authz

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/audit"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
	"github.com/gowebpki/jcs"
	"github.com/lestrrat-go/jwx/v2/jwk"
)

// update rewrites the golden files of the trail's events (testdata/trail)
// from what the follower writes now: go test ./authz -run TrailEventsGolden -update.
var update = flag.Bool("update", false, "rewrite testdata/trail from the events the follower writes")

// goldenTime is the clock of the golden history.
var goldenTime = time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)

// goldenKey is a fixed Ed25519 key (a seed of zeros and its kid): the
// signed resolution of the golden history, and the checkpoints of the
// trail fixture written from it, are the same on every run.
func goldenKey(t testing.TB, kid string) jwk.Key {
	t.Helper()
	seed := make([]byte, ed25519.SeedSize)
	copy(seed, kid)
	key, err := jwk.FromRaw(ed25519.NewKeyFromSeed(seed))
	if err != nil {
		t.Fatal(err)
	}
	if err := key.Set(jwk.KeyIDKey, kid); err != nil {
		t.Fatal(err)
	}
	return key
}

// goldenHistory is a store history with a change of every kind the
// follower records, coherent enough for every property audit.Verify
// checks: two epochs of one server and a certificate between them, a
// snapshot, a policy set in force; a call approved, admitted, admitted
// again, claimed and completed; one resolved by a signed resolution, one
// released by a newer pool generation; the drain and retirement of the
// source, a successor admission, a revocation, a refused policy set, and
// a set from an OPA bundle on another replica.
// Every member the events carry is set somewhere.
func goldenHistory(t testing.TB) []lease.Commit {
	t.Helper()
	at := func(min int) time.Time { return goldenTime.Add(time.Duration(min) * time.Minute) }
	const (
		epA    = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
		epB    = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
		cert   = "sha256:cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"
		policy = "sha256:dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"
		digest = "sha256:eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee"
		desc   = "sha256:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff"
		args   = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
		config = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
		image  = "sha256:3333333333333333333333333333333333333333333333333333333333333333"
		prof   = "sha256:4444444444444444444444444444444444444444444444444444444444444444"
	)
	artifact := manifest.Artifact{Image: "ghcr.io/example/github-mcp:1.2.0", Digest: image}
	epoch := func(id, release string) *record.Epoch {
		return &record.Epoch{ID: id, Server: "github", Release: release, Pool: "github-" + release, Artifact: artifact,
			ConfigDigest: config, SignerKeyID: "registrar-1", RegisteredAt: at(0), State: record.StateActive,
			Tools: []record.EpochTool{{Name: "create_repository", Digest: desc, SideEffects: manifest.SideEffectWrite}}}
	}
	a, b := epoch(epA, "1.2.0"), epoch(epB, "1.3.0")
	source, target := a.Target(), b.Target()
	successor := &record.Successor{Target: target, Certificate: cert, Issuer: "issuer-1",
		Effects: map[string]any{"visibility": "private"}, Profile: manifest.ProfileRef{ID: "github-repos", Digest: prof},
		ExpiresAt: at(24 * 60)}
	decision := record.Decision{Verdict: record.VerdictAllow, Approvals: 1, PolicyDigest: policy,
		Engines: []record.EngineDecision{
			{Engine: "rego", Verdict: record.VerdictAllow, Approvals: 1, Rules: []string{"allow_write"}, Reasons: []string{"writes need one approver"},
				Successor: &record.SuccessorVerdict{Verdict: record.VerdictAllow, Rules: []string{}, Reasons: []string{}}},
			{Engine: "cedar", Verdict: record.VerdictAllow, Rules: []string{"policy0"}, Reasons: []string{"permit"}, Error: "",
				Successor: &record.SuccessorVerdict{Verdict: record.VerdictAllow, Rules: []string{"policy1"}, Reasons: []string{"substitute"}, Error: "none"}},
		},
		Successor: &record.SuccessorDecision{Certificate: cert, Epoch: epB, Verdict: record.VerdictAllow}, DecidedAt: at(3)}
	formation := func(id string, minute int, succ *record.Successor, rec *record.Recovery) *record.Formation {
		return &record.Formation{
			Call: record.Call{ID: id, Session: "ses-1", Snapshot: "sn_golden",
				Principal: record.Principal{ID: "alice", Attributes: map[string]any{"department": "platform"}, Host: "host-1"},
				Tool:      "github/create_repository", DescriptorDigest: desc, Arguments: json.RawMessage(`{"name":"payroll"}`),
				ArgumentDigest: args, Source: source, Successor: succ,
				Metadata:  record.Metadata{Summary: "Create a repository", SideEffects: manifest.SideEffectWrite, RequiresApproval: true},
				CreatedAt: at(minute), ExpiresAt: at(minute + 15), Recovery: rec},
			Digest: digest, Decision: decision, Status: record.StatusPendingApproval, ApprovalsRequired: 1, UpdatedAt: at(minute),
		}
	}
	admitted := func(id, formation string, tgt record.Target, minute int, certificate, recoveryOf string) *record.Lease {
		return &record.Lease{ID: id, State: record.LeaseAdmitted, Formation: formation, Session: "ses-1",
			Tool: "github/create_repository", ArgumentDigest: args, Target: tgt, Generation: 3, AdmittedAt: at(minute),
			Certificate: certificate, RecoveryOf: recoveryOf}
	}
	res, err := manifest.SignResolution(&manifest.Resolution{Lease: "ls_two", Outcome: "no_effect",
		Reason: "the backend's log shows no request", Operator: "carol@example.com", IssuedAt: at(40)}, goldenKey(t, "operator-1"))
	if err != nil {
		t.Fatal(err)
	}
	failureMode := &manifest.FailureMode{Error: "rate_limited", Description: "too many calls", Recovery: "retry", MaxAttempts: 3}
	commits := []lease.Commit{
		{Revision: 2, Changes: []lease.Change{lease.EpochRegistered{Epoch: a}}},
		{Revision: 3, Changes: []lease.Change{lease.EpochRegistered{Epoch: b}}},
		{Revision: 4, Changes: []lease.Change{lease.CertificateRegistered{Certificate: &record.Certificate{ID: cert,
			Certificate: &manifest.Certificate{Source: epA, Target: epB, Tool: "create_repository",
				Envelope: json.RawMessage(`{"type":"object"}`), Effects: map[string]any{"visibility": "private"},
				Profile: manifest.ProfileRef{ID: "github-repos", Digest: prof}, IssuedAt: at(1), ExpiresAt: at(24 * 60)},
			KeyID: "issuer-1", JWS: "eyJ.golden.jws", RegisteredAt: at(1)}}}},
		{Revision: 5, Changes: []lease.Change{lease.SnapshotCreated{Snapshot: &record.Snapshot{ID: "sn_golden", Tools: []record.SnapshotTool{
			{Name: "github/create_repository", Epoch: epA, DescriptorDigest: desc, SideEffects: manifest.SideEffectWrite},
			{Name: "gitlab/create_project", Epoch: epB, DescriptorDigest: desc, SideEffects: manifest.SideEffectWrite},
		}}}}},
		{Revision: 6, Changes: []lease.Change{lease.PolicyRecorded{Replica: "r1", Kind: EventPolicy,
			Data: json.RawMessage(`{"digest":"` + policy + `","files":["fcd.rego","fcd.cedar"],"source":"dir:/etc/fcd/policies"}`)}}},
		{Revision: 7, Changes: []lease.Change{lease.FormationCreated{Formation: formation("fm_one", 3, successor, nil)}}},
		{Revision: 8, Changes: []lease.Change{lease.FormationApproved{Formation: "fm_one", Status: record.StatusReady,
			Approval: record.Approval{Approver: "bob", Decision: record.Approve, Digest: digest, Reason: "looks right", At: at(4)}}}},
		{Revision: 9, Changes: []lease.Change{lease.LeaseAdmitted{Lease: admitted("ls_one", "fm_one", source, 5, "", "")}}},
		{Revision: 10, Changes: []lease.Change{lease.LeaseReadmitted{Lease: "ls_one", Formation: "fm_one", At: at(6), Expires: at(7)}}},
		{Revision: 11, Changes: []lease.Change{lease.LeaseClaimed{Lease: "ls_one", Claim: "cl_one", Epoch: epA, Admission: 9, At: at(6)}}},
		{Revision: 12, Changes: []lease.Change{lease.LeaseClosed{Formation: "fm_one", Outcome: record.OutcomeEffect, Lease: "ls_one",
			Claim: "cl_one", By: "backend", At: at(7)}}},
		{Revision: 13, Changes: []lease.Change{
			lease.FormationCreated{Formation: formation("fm_two", 10, nil, &record.Recovery{Of: "fm_one", Root: "fm_one", Attempt: 2,
				Outcome: record.OutcomeFailed, FailureMode: failureMode})},
			lease.FormationApproved{Formation: "fm_two", Status: record.StatusReady,
				Approval: record.Approval{Approver: "bob", Decision: record.Approve, Digest: digest, At: at(11)}},
		}},
		{Revision: 14, Changes: []lease.Change{lease.LeaseAdmitted{Lease: admitted("ls_two", "fm_two", source, 12, "", "fm_one"),
			Requires: []string{"github/create_repository"}, Excludes: []string{"github/delete_repository"}}}},
		{Revision: 15, Changes: []lease.Change{lease.LeaseClosed{Formation: "fm_two", Outcome: record.OutcomeUncertain, Lease: "ls_two",
			By: "sweep", At: at(20)}}},
		{Revision: 16, Changes: []lease.Change{lease.LeaseClosed{Formation: "fm_two", Outcome: record.OutcomeNoEffect, Lease: "ls_two",
			By: "operator", Operator: "op-1", Reason: "the backend's log shows no request", Resolution: string(res), At: at(41)}}},
		{Revision: 17, Changes: []lease.Change{
			lease.FormationCreated{Formation: formation("fm_three", 42, nil, nil)},
			lease.FormationApproved{Formation: "fm_three", Status: record.StatusReady,
				Approval: record.Approval{Approver: "bob", Decision: record.Approve, Digest: digest, At: at(42)}},
		}},
		{Revision: 18, Changes: []lease.Change{lease.LeaseAdmitted{Lease: admitted("ls_three", "fm_three", source, 43, "", "")}}},
		{Revision: 19, Changes: []lease.Change{lease.LeaseClaimed{Lease: "ls_three", Claim: "cl_three", Epoch: epA, Admission: 18, At: at(43)},
			lease.LeaseClosed{Formation: "fm_three", Outcome: record.OutcomeUncertain, Lease: "ls_three", Claim: "cl_three", By: "sweep", At: at(50)}}},
		{Revision: 20, Changes: []lease.Change{lease.GenerationSet{Pool: "github-1.2.0", Generation: 4, By: "deployer"},
			lease.LeaseClosed{Formation: "fm_three", Outcome: record.OutcomeReleased, Lease: "ls_three", By: "generation", Generation: 4, At: at(51)}}},
		{Revision: 21, Changes: []lease.Change{lease.FormationCreated{Formation: formation("fm_four", 52, successor, nil)},
			lease.FormationApproved{Formation: "fm_four", Status: record.StatusReady,
				Approval: record.Approval{Approver: "bob", Decision: record.Approve, Digest: digest, At: at(52)}}}},
		{Revision: 22, Changes: []lease.Change{lease.EpochChanged{Epoch: epA, State: record.StateDraining, By: "op-1"}}},
		{Revision: 23, Changes: []lease.Change{lease.EpochChanged{Epoch: epA, State: record.StateStale, By: "op-1"}}},
		{Revision: 24, Changes: []lease.Change{lease.LeaseAdmitted{Lease: admitted("ls_four", "fm_four", target, 55, cert, "")}}},
		{Revision: 25, Changes: []lease.Change{lease.CertificateRevoked{Certificate: cert, By: "op-1"}}},
		{Revision: 26, Changes: []lease.Change{lease.PolicyRecorded{Replica: "r1", Kind: EventPolicyRefused,
			Data: json.RawMessage(`{"error":"fcd.rego:3: rego_parse_error","inForce":"` + policy + `","source":"dir:/etc/fcd/policies"}`)},
			// A replica whose set came from an OPA bundle: its revision too.
			lease.PolicyRecorded{Replica: "r2", Kind: EventPolicy,
				Data: json.RawMessage(`{"digest":"` + policy + `","files":["fcd.rego","fcd.cedar"],"revision":"2026.03.01-1","source":"https://bundles.example.com/fcd.tar.gz"}`)}}},
	}
	return commits
}

// goldenEvents are the events the follower writes of goldenHistory, one
// formation's with its arguments kept, and a gap and a restore (the
// events of a compacted history) after them.
func goldenEvents(t testing.TB) []TrailEvent {
	t.Helper()
	f := &Follower{cfg: FollowerConfig{Arguments: TrailArgumentsNone}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	var out []TrailEvent
	for _, c := range goldenHistory(t) {
		out = append(out, f.events(context.Background(), c)...)
	}
	for i, ev := range out {
		// The arguments, as Config.TrailArguments keeps them (what it
		// keeps is TestTrailArguments').
		if fe, ok := ev.Data.(formationEvent); ok && fe.ID == "fm_two" {
			fe.Arguments = json.RawMessage(`{"name":"payroll","token":"sha256:5555"}`)
			out[i].Data = fe
		}
	}
	return append(out, compactionEvents()...)
}

// compactionEvents are a gap and a restore, as Follower.compacted writes
// them.
func compactionEvents() []TrailEvent {
	return []TrailEvent{
		{Kind: EventGap, Schema: TrailSchema, Revision: 40, Data: gapEvent{From: 27, To: 40}},
		{Kind: EventRestore, Schema: TrailSchema, Revision: 99, Data: restoreEvent{SnapshotRevision: 40, RevisionBump: 50, From: 41, To: 99}},
	}
}

// TestTrailEventsGolden: the data of every event the follower writes, in
// the canonical form (RFC 8785) the trail keeps, is byte for byte the
// golden testdata/trail/<kind>.jsonl (one line per event of the kind):
// the trail's schema changes only on purpose, and -update shows how.
func TestTrailEventsGolden(t *testing.T) {
	byKind := map[string][]byte{}
	var kinds []string
	for _, ev := range goldenEvents(t) {
		raw, err := json.Marshal(ev.Data)
		if err != nil {
			t.Fatal(err)
		}
		canon, err := jcs.Transform(raw)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := byKind[ev.Kind]; !ok {
			kinds = append(kinds, ev.Kind)
		}
		byKind[ev.Kind] = append(append(byKind[ev.Kind], canon...), '\n')
	}
	want := []string{EventManifest, EventCertificate, EventSnapshot, EventPolicy, EventFormation, EventApproval,
		EventAdmission, EventReadmission, EventClaim, EventOutcome, EventResolution, EventGeneration, EventDrain,
		EventRetire, EventRevocation, EventPolicyRefused, EventGap, EventRestore}
	if !slices.Equal(kinds, want) {
		t.Fatalf("kinds %v, want %v", kinds, want)
	}
	dir := filepath.Join("testdata", "trail")
	if *update {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, kind := range kinds {
		path := filepath.Join(dir, kind+".jsonl")
		if *update {
			if err := os.WriteFile(path, byKind[kind], 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		golden, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (go test ./authz -run TrailEventsGolden -update writes it)", err)
		}
		if !bytes.Equal(byKind[kind], golden) {
			t.Errorf("%s events changed:\n got %s\nwant %s", kind, byKind[kind], golden)
		}
	}
}

// writeFixture writes the golden history's events, but for the gap (a
// gap fails a property), as replica r1's trail under root, signed with
// the fixed key "trail-1" on a fixed clock.
func writeFixture(t *testing.T, root string) {
	t.Helper()
	now := goldenTime.Add(2 * time.Hour)
	tr, err := audit.Open(audit.Config{Root: root, Replica: "r1", Key: goldenKey(t, "trail-1"), Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	var entries []audit.Entry
	for _, ev := range goldenEvents(t) {
		if ev.Kind != EventGap {
			entries = append(entries, audit.Entry{Kind: ev.Kind, Schema: ev.Schema, Revision: ev.Revision, Time: ev.Time, Data: ev.Data})
		}
	}
	if err := tr.Append(context.Background(), entries); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestGoldenTrailVerifies: the golden history written as a trail today
// verifies — chains, checkpoints, every property, the signed resolution
// against the operator key — every event states TrailSchema, and that
// version is one audit's verifier reads. (audit/testdata/trail-v1 was
// written so at fff2fa8, before events stated a version; audit's tests
// keep it verifying.)
func TestGoldenTrailVerifies(t *testing.T) {
	root := t.TempDir()
	writeFixture(t, root)
	keys, err := manifest.PublicSet(goldenKey(t, "trail-1"))
	if err != nil {
		t.Fatal(err)
	}
	ops, err := manifest.PublicSet(goldenKey(t, "operator-1"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := audit.VerifyConfig{Keys: keys, OperatorKeys: ops}.Verify(root)
	if err != nil || !r.OK {
		t.Fatalf("verify: %v\n%s", err, r.Summary())
	}
	tr, err := audit.Open(audit.Config{Root: root, Replica: "r1", Key: goldenKey(t, "trail-1")})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	events, _, err := tr.Page(0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range events {
		if ev.Schema != TrailSchema {
			t.Errorf("event %d (%s) states schema %d, want %d", ev.Seq, ev.Kind, ev.Schema, TrailSchema)
		}
	}
	if TrailSchema < audit.SchemaV1 || TrailSchema > audit.LatestSchema {
		t.Errorf("authz writes schema %d; audit reads %d to %d", TrailSchema, audit.SchemaV1, audit.LatestSchema)
	}
}
