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
	if _, err := s.RevokeCertificate(ctx, got[0].ID); !errors.Is(err, lease.ErrCertificateRevoked) {
		t.Fatalf("second revoke: %v", err)
	}
	if none, _ := s.CertificatesFor(ctx, dst.Epoch, "create_repository"); len(none) != 0 {
		t.Fatalf("certificates under the target epoch: %d", len(none))
	}
}
