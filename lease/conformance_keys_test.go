package lease_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
)

// publisher runs KeepPublished for one key and records what it reports.
type publisher struct {
	events chan bool
	cancel context.CancelFunc
	done   chan struct{}
}

func publish(t *testing.T, s *lease.Store, kid string, value []byte, ttl time.Duration) *publisher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &publisher{events: make(chan bool, 64), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		s.KeepPublished(ctx, kid, value, ttl, func(ok bool) {
			select {
			case p.events <- ok:
			default:
				t.Errorf("publisher of %s: events not read", kid)
			}
		})
	}()
	t.Cleanup(p.stop)
	return p
}

// next waits for the publisher's next report, which must be want.
func (p *publisher) next(t *testing.T, want bool) {
	t.Helper()
	select {
	case got := <-p.events:
		if got != want {
			t.Fatalf("published(%v), want published(%v)", got, want)
		}
	case <-time.After(time.Minute):
		t.Fatalf("no published(%v) within a minute", want)
	}
}

// stop cancels the publisher and waits until KeepPublished returned.
func (p *publisher) stop() {
	p.cancel()
	<-p.done
}

// jwksPublished: a published key is listed, as stored, bound to an etcd
// lease that outlives ttl; a lost lease is granted again; a stopped
// publisher leaves the key until its lease ends, then it goes.
func jwksPublished(t *testing.T, x *fixture) {
	ctx := testCtx(t)
	listed := func() [][]byte {
		t.Helper()
		keys, err := x.s.PublishedKeys(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}
	if keys := listed(); len(keys) != 0 {
		t.Fatalf("%d keys published before any was", len(keys))
	}
	// k1 lives long; k2's lease is short, so the client renews it every
	// two seconds and soon notices when it is lost.
	const long, short = time.Hour, 5 * time.Second
	v1, v2 := []byte(`{"kty":"OKP","crv":"Ed25519","kid":"k1","x":"AAAA"}`), []byte(`{"kty":"OKP","crv":"Ed25519","kid":"k2","x":"BBBB"}`)
	p1 := publish(t, x.s, "k1", v1, long)
	p1.next(t, true)
	p2 := publish(t, x.s, "k2", v2, short)
	p2.next(t, true)
	both := [][]byte{v1, v2}
	if keys := listed(); !slices.EqualFunc(keys, both, bytes.Equal) {
		t.Fatalf("published keys %q, want k1 and k2 as stored", keys)
	}
	// Another replica (store) lists them too.
	if keys, err := x.open(t, x.prefix).PublishedKeys(ctx); err != nil || !slices.EqualFunc(keys, both, bytes.Equal) {
		t.Fatalf("another store lists %q, %v", keys, err)
	}
	k1 := x.rawValue(t, v1)
	if k1.Lease == 0 {
		t.Fatal("the published key is not bound to an etcd lease: it would never expire")
	}
	if got := x.grantedTTL(t, k1.Lease); got < long {
		t.Fatalf("the key's lease was granted %s, want at least the ttl %s", got, long)
	}

	// k2's lease is lost (etcd away for longer than its TTL): the key
	// goes, the publisher says so and publishes it again on a new lease.
	k2 := x.rawValue(t, v2)
	x.revoke(t, k2.Lease)
	p2.next(t, false)
	p2.next(t, true)
	if again := x.rawValue(t, v2); again.Lease == 0 || again.Lease == k2.Lease {
		t.Fatalf("republished on lease %x (was %x)", again.Lease, k2.Lease)
	}
	if keys := listed(); !slices.EqualFunc(keys, both, bytes.Equal) {
		t.Fatalf("after the republication, keys %q", keys)
	}

	// k1's replica stops: the key stays (the tokens it signed still
	// verify) until its lease ends.
	p1.stop()
	p1.next(t, false)
	if keys := listed(); !slices.EqualFunc(keys, both, bytes.Equal) {
		t.Fatalf("right after its publisher stopped, keys %q; want k1 still", keys)
	}
	x.revoke(t, k1.Lease)
	if keys := listed(); !slices.EqualFunc(keys, [][]byte{v2}, bytes.Equal) {
		t.Fatalf("after k1's lease ended, keys %q; want k2 only", keys)
	}
	select {
	case ok := <-p1.events:
		t.Fatalf("a stopped publisher reported published(%v)", ok)
	default:
	}
	p2.stop()
}

// certificateRegisterGet: a certificate registers once under its id and
// reads back as registered; revocation is read back with its revision.
func certificateRegisterGet(t *testing.T, x *fixture) {
	ctx := testCtx(t)
	src, dst := testManifest(t, "github", "v1.4.0", "private"), testManifest(t, "github", "v1.3.0", "public")
	c := &manifest.Certificate{Source: src.Epoch, Target: dst.Epoch, Tool: "create_repository",
		Envelope: json.RawMessage(`{"type":"object","required":["private"]}`), Effects: map[string]any{"visibility": "private"},
		Profile:  manifest.ProfileRef{ID: "p", Digest: src.Epoch},
		IssuedAt: x.t0, ExpiresAt: x.t0.Add(30 * 24 * time.Hour)}
	id, err := c.ID()
	if err != nil {
		t.Fatal(err)
	}
	sc := &manifest.SignedCertificate{Certificate: c, ID: id, KeyID: "issuer", JWS: "jws"}
	reg, created, err := x.s.RegisterCertificate(ctx, sc)
	if err != nil || !created || reg.ID != id || reg.Revision <= 0 || reg.Revoked {
		t.Fatalf("register: %+v created %v, %v", reg, created, err)
	}
	again, created, err := x.s.RegisterCertificate(ctx, sc)
	if err != nil || created || again.Revision != reg.Revision || !again.RegisteredAt.Equal(reg.RegisteredAt) {
		t.Fatalf("register again: %+v created %v, %v; want the first record", again, created, err)
	}
	got, err := x.s.GetCertificate(ctx, id)
	if err != nil || got.Revision != reg.Revision || got.KeyID != "issuer" || got.JWS != "jws" || !sameJSON(t, got.Certificate, c) {
		t.Fatalf("read back: %+v, %v", got, err)
	}
	rev, err := x.s.RevokeCertificate(ctx, id)
	if err != nil || !rev.Revoked || rev.RevokedAt == nil || rev.Revision <= reg.Revision {
		t.Fatalf("revoke: %+v, %v", rev, err)
	}
	if got, err := x.s.GetCertificate(ctx, id); err != nil || !got.Revoked || got.Revision != rev.Revision {
		t.Fatalf("revoked, read back: %+v, %v", got, err)
	}
	if list, err := x.s.CertificatesFor(ctx, "", ""); err != nil || len(list) != 1 || list[0].ID != id || !list[0].Revoked {
		t.Fatalf("all certificates: %+v, %v", list, err)
	}
	for name, op := range map[string]func() error{
		"get":    func() error { _, err := x.s.GetCertificate(ctx, "sha256:unknown"); return err },
		"revoke": func() error { _, err := x.s.RevokeCertificate(ctx, "sha256:unknown"); return err },
	} {
		if err := op(); !errors.Is(err, record.ErrCertificateNotFound) {
			t.Fatalf("%s of an unknown certificate: %v", name, err)
		}
	}
}
