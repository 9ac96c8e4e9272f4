package authz_test

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/audit"
	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/internal/manifesttest"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
	"github.com/lestrrat-go/jwx/v2/jwk"
)

// uncertainLease admits a call, claims its lease and reports it
// uncertain, as a fence does when the backend's answer was lost.
func (e *admitEnv) uncertainLease(t *testing.T, session string) (*record.Formation, *authz.Grant) {
	t.Helper()
	f, a := e.admitRead(t, session)
	if _, err := e.forms.Leases.Claim(testCtx(t), e.claimRequest(t, a, "cl_"+session)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.forms.Leases.Complete(testCtx(t), authz.CompleteRequest{Lease: a.Lease, Claim: "cl_" + session, Outcome: record.OutcomeUncertain}); err != nil {
		t.Fatal(err)
	}
	return f, a
}

// signResolution signs a resolution of lease with key, issued at the
// env's clock plus at.
func (e *admitEnv) signResolution(t *testing.T, key jwk.Key, lease, outcome string, at time.Duration) []byte {
	t.Helper()
	jws, err := manifest.SignResolution(&manifest.Resolution{Lease: lease, Outcome: outcome, Reason: "checked the backend's log",
		Operator: "dana@example.com", IssuedAt: e.clock.Now().Add(at)}, key)
	if err != nil {
		t.Fatal(err)
	}
	return jws
}

// TestSignedResolution: with operator keys, an uncertain lease is
// resolved only by a signed resolution of that lease, issued within the
// window, by a trusted operator key; every refusal leaves it uncertain;
// the one that closes it is kept with it and recorded in the trail with
// its signer, its operator and its digest, and the trail verifies.
func TestSignedResolution(t *testing.T) {
	operators, stranger := manifesttest.NewSigner(t), manifesttest.NewSigner(t)
	ae, tr, root := newTrailEnvConfig(t, func(c *authz.Config) { c.Operators = operators.Verifier })
	ctx := testCtx(t)
	ls := ae.forms.Leases
	f, a := ae.uncertainLease(t, "resolved")
	_, other := ae.uncertainLease(t, "other")

	stillUncertain := func(what string) {
		t.Helper()
		l, err := ae.store.OpenLease(ctx, a.Lease)
		if err != nil || l.State != record.LeaseUncertain {
			t.Fatalf("after %s: lease %+v, %v; want it uncertain", what, l, err)
		}
		if _, err := ls.Resolution(ctx, a.Lease); !errors.Is(err, authz.ErrResolutionNotFound) {
			t.Fatalf("after %s: a resolution is kept (%v)", what, err)
		}
	}

	if _, err := ls.Resolve(ctx, "ops-1", a.Lease, record.OutcomeNoEffect, "unsigned"); !errors.Is(err, authz.ErrResolutionUnsigned) {
		t.Fatalf("unsigned resolution: %v", err)
	}
	stillUncertain("an unsigned resolution")
	for _, tc := range []struct {
		name string
		jws  []byte
		also error
	}{
		{"another lease's document", ae.signResolution(t, operators.Key, other.Lease, manifest.ResolutionNoEffect, 0), nil},
		{"an untrusted key", ae.signResolution(t, stranger.Key, a.Lease, manifest.ResolutionNoEffect, 0), manifest.ErrUntrustedSigner},
		{"issued too long ago", ae.signResolution(t, operators.Key, a.Lease, manifest.ResolutionNoEffect, -manifest.ResolutionMaxAge-time.Minute), manifest.ErrResolutionTime},
		{"issued ahead", ae.signResolution(t, operators.Key, a.Lease, manifest.ResolutionNoEffect, 10*time.Minute), manifest.ErrResolutionTime},
		{"a manifest's typ", func() []byte {
			payload, _ := manifest.Canonical(&manifest.Resolution{Lease: a.Lease, Outcome: "no_effect", Reason: "r", Operator: "o", IssuedAt: ae.clock.Now()})
			jws, err := manifest.Sign(payload, operators.Key, manifest.TypManifest)
			if err != nil {
				t.Fatal(err)
			}
			return jws
		}(), manifest.ErrBadSignature},
		{"not a JWS", []byte(`{"outcome":"no_effect"}`), manifest.ErrMalformed},
	} {
		l, sr, err := ls.ResolveSigned(ctx, "ops-1", a.Lease, tc.jws)
		if !errors.Is(err, authz.ErrResolutionInvalid) || (tc.also != nil && !errors.Is(err, tc.also)) || l != nil || sr != nil {
			t.Fatalf("%s: %v, want %v (and %v)", tc.name, err, authz.ErrResolutionInvalid, tc.also)
		}
		stillUncertain(tc.name)
	}

	good := ae.signResolution(t, operators.Key, a.Lease, manifest.ResolutionNoEffect, -time.Minute)
	l, sr, err := ls.ResolveSigned(ctx, "ops-1", a.Lease, good)
	if err != nil || l.Formation != f.ID || sr.KeyID != operators.Key.KeyID() {
		t.Fatalf("signed resolution: %v %+v %+v", err, l, sr)
	}
	if got, err := ae.forms.Formations.Get(ctx, f.ID); err != nil || got.Status != record.StatusRejected {
		t.Fatalf("formation after no_effect: %v %v", got.Status, err)
	}
	kept, err := ls.Resolution(ctx, a.Lease)
	if err != nil || kept.JWS != string(good) || kept.Digest != sr.Digest || kept.KeyID != sr.KeyID || kept.Resolution.Operator != "dana@example.com" {
		t.Fatalf("kept resolution: %v %+v", err, kept)
	}
	// Replayed: on its own lease it is closed; on another it names the wrong lease.
	if _, _, err := ls.ResolveSigned(ctx, "ops-1", a.Lease, good); !errors.Is(err, record.ErrLeaseClosed) {
		t.Fatalf("replayed on its lease: %v", err)
	}
	if _, _, err := ls.ResolveSigned(ctx, "ops-1", other.Lease, good); !errors.Is(err, authz.ErrResolutionInvalid) {
		t.Fatalf("replayed on another lease: %v", err)
	}
	if _, err := ls.Resolution(ctx, other.Lease); !errors.Is(err, authz.ErrResolutionNotFound) {
		t.Fatalf("the other lease: %v", err)
	}

	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	events := readEvents(t, filepath.Join(root, "test"))
	last := events[len(events)-1]
	var d struct {
		Lease, Formation, Outcome, By, Operator, Reason string
		Signed                                          *struct {
			Kid, Operator, Digest, JWS string
			IssuedAt                   time.Time
		}
	}
	if err := json.Unmarshal(last.Data, &d); err != nil {
		t.Fatal(err)
	}
	if last.Kind != authz.EventResolution || d.Lease != a.Lease || d.Formation != f.ID || d.Outcome != "no_effect" || d.By != "operator" ||
		d.Operator != "ops-1" || d.Reason != "checked the backend's log" || d.Signed == nil {
		t.Fatalf("last event %s %s", last.Kind, last.Data)
	}
	if d.Signed.Kid != operators.Key.KeyID() || d.Signed.Operator != "dana@example.com" || d.Signed.Digest != sr.Digest ||
		d.Signed.JWS != string(good) || !d.Signed.IssuedAt.Equal(ae.clock.Now().Add(-time.Minute)) {
		t.Fatalf("signed resolution in the trail: %s", last.Data)
	}
	// What the trail keeps verifies again against the operator keys.
	if _, err := operators.Verifier.VerifyResolution([]byte(d.Signed.JWS), ae.clock.Now()); err != nil {
		t.Fatalf("the trail's document: %v", err)
	}
	pub, _ := ae.key.PublicKey()
	keys := jwk.NewSet()
	_ = keys.AddKey(pub)
	if r, err := audit.Verify(root, keys); err != nil || !r.OK {
		t.Fatalf("verify: %v\n%s", err, r.Summary())
	}
}

// TestSignedResolutionNeedsOperatorKeys: without operator keys the
// bearer credential resolves alone (no document is kept), and a signed
// document cannot be verified, so it is refused.
func TestSignedResolutionNeedsOperatorKeys(t *testing.T) {
	ae := newAdmitEnv(t, nil)
	ctx := testCtx(t)
	operator := manifesttest.NewSigner(t)
	_, a := ae.uncertainLease(t, "signed")
	if _, _, err := ae.forms.Leases.ResolveSigned(ctx, "ops-1", a.Lease, ae.signResolution(t, operator.Key, a.Lease, "effect", 0)); !errors.Is(err, authz.ErrResolutionInvalid) {
		t.Fatalf("signed without operator keys: %v", err)
	}
	if _, err := ae.forms.Leases.Resolve(ctx, "ops-1", a.Lease, record.OutcomeEffect, "checked"); err != nil {
		t.Fatal(err)
	}
	if _, err := ae.forms.Leases.Resolution(ctx, a.Lease); !errors.Is(err, authz.ErrResolutionNotFound) {
		t.Fatalf("unsigned resolution kept a document: %v", err)
	}
}
