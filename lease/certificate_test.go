package lease_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
)

func TestCertificatesBySourceAndTool(t *testing.T) {
	m := etcdtest.Start(t)
	s := m.Store(t, "/certs/")
	ctx := context.Background()
	src, dst := testManifest(t, "github", "v1.4.0", "private"), testManifest(t, "github", "v1.3.0", "public")
	cert := func(tool string, days int) *manifest.SignedCertificate {
		c := &manifest.Certificate{Source: src.Epoch, Target: dst.Epoch, Tool: tool,
			Envelope: json.RawMessage(`{"type":"object","required":["private"]}`), Effects: map[string]any{"visibility": "private"},
			Profile:  manifest.ProfileRef{ID: "p", Digest: src.Epoch},
			IssuedAt: time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC), ExpiresAt: time.Date(2026, 11, 30+days, 0, 0, 0, 0, time.UTC)}
		id, err := c.ID()
		if err != nil {
			t.Fatal(err)
		}
		return &manifest.SignedCertificate{Certificate: c, ID: id, KeyID: "issuer", JWS: "jws"}
	}
	a, b, other := cert("create_repository", 30), cert("create_repository", 60), cert("get_repository", 30)
	for _, c := range []*manifest.SignedCertificate{a, b, other, a} {
		if _, _, err := s.RegisterCertificate(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.CertificatesFor(ctx, src.Epoch, "create_repository")
	if err != nil || len(got) != 2 {
		t.Fatalf("certificates for create_repository: %d %v", len(got), err)
	}
	if got[0].ID > got[1].ID || got[0].Revision == 0 {
		t.Fatalf("not ordered by id or no revision: %+v", got)
	}
	before := got[0].Revision
	rev, err := s.RevokeCertificate(ctx, got[0].ID)
	if err != nil || !rev.Revoked || rev.Revision <= before {
		t.Fatalf("revoke: %+v %v", rev, err)
	}
	if _, err := s.RevokeCertificate(ctx, got[0].ID); !errors.Is(err, record.ErrCertificateRevoked) {
		t.Fatalf("second revoke: %v", err)
	}
	if none, _ := s.CertificatesFor(ctx, dst.Epoch, "create_repository"); len(none) != 0 {
		t.Fatalf("certificates under the target epoch: %d", len(none))
	}
}

// TestAdmitToSuccessorCompares: an admission to a formation's successor
// commits only if, in the same transaction, the source epoch is STALE and
// the certificate record is the one read (not revoked since); each failed
// condition is reported as such and writes nothing.
func TestAdmitToSuccessorCompares(t *testing.T) {
	m := etcdtest.Start(t)
	s := m.Store(t, "/succ/")
	ctx := context.Background()
	src, dst := testManifest(t, "github", "v1.4.0", "private"), testManifest(t, "github", "v1.3.0", "public")
	register(t, s, src)
	target := register(t, s, dst)
	c := &manifest.Certificate{Source: src.Epoch, Target: dst.Epoch, Tool: "create_repository",
		Envelope: json.RawMessage(`{"type":"object","required":["private"]}`), Effects: map[string]any{"visibility": "private"},
		Profile:  manifest.ProfileRef{ID: "p", Digest: src.Epoch},
		IssuedAt: time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC), ExpiresAt: time.Date(2026, 12, 30, 0, 0, 0, 0, time.UTC)}
	id, err := c.ID()
	if err != nil {
		t.Fatal(err)
	}
	cert, _, err := s.RegisterCertificate(ctx, &manifest.SignedCertificate{Certificate: c, ID: id, KeyID: "issuer", JWS: "jws"})
	if err != nil {
		t.Fatal(err)
	}

	fid, err := lease.NewFormationID()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	f := &record.Formation{Call: record.Call{ID: fid, Session: "s", Tool: "github/create_repository",
		CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, Status: record.StatusReady}
	rev, err := s.CreateFormation(ctx, f, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	succ := record.Target{Epoch: target.ID, Server: "github", Release: "v1.3.0", Pool: target.Pool}
	admit := func(cert *record.Certificate) error {
		lid, err := lease.NewLeaseID()
		if err != nil {
			t.Fatal(err)
		}
		rec, frev, err := s.GetFormationRevision(ctx, fid)
		if err != nil {
			t.Fatal(err)
		}
		if frev != rev {
			t.Fatalf("the formation was written by a failed admission (revision %d, want %d)", frev, rev)
		}
		return s.Admit(ctx, lease.AdmitRequest{Formation: rec, FormationRev: frev, StaleSource: src.Epoch, Certificate: cert,
			Lease: &record.Lease{ID: lid, Formation: fid, Session: "s", Tool: "github/create_repository", Target: succ,
				Certificate: id, AdmittedAt: now}})
	}

	var se *record.StateError
	if err := admit(cert); !errors.As(err, &se) || se.Epoch != src.Epoch || se.State != record.StateActive || se.Want != record.StateStale {
		t.Fatalf("admission while the source is ACTIVE: %v", err)
	}
	if _, err := s.Drain(ctx, src.Epoch); err != nil {
		t.Fatal(err)
	}
	if err := admit(cert); !errors.As(err, &se) || se.State != record.StateDraining {
		t.Fatalf("admission while the source is DRAINING: %v", err)
	}
	if st, err := s.Retire(ctx, src.Epoch, 0); err != nil || st != record.StateStale {
		t.Fatalf("retire: %s %v", st, err)
	}
	if err := admit(nil); err == nil {
		t.Fatal("a successor admission without its certificate was accepted")
	}
	stale := *cert
	stale.Revision--
	if err := admit(&stale); !errors.Is(err, lease.ErrCertificateChanged) {
		t.Fatalf("admission with a certificate read before a change: %v", err)
	}
	if err := admit(cert); err != nil {
		t.Fatalf("admission to the successor: %v", err)
	}
	leases, err := s.EpochLeases(ctx, target.ID)
	if err != nil || len(leases) != 1 || leases[0].Certificate != id || leases[0].Formation != fid {
		t.Fatalf("successor markers: %+v %v", leases, err)
	}
}
