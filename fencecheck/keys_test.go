package fencecheck_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/internal/tokentest"
	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jws"
)

// jwksServer is a real HTTP server publishing a JWKS that a test can
// change, counting the fetches it serves.
type jwksServer struct {
	*httptest.Server
	doc     atomic.Pointer[[]byte]
	fetches atomic.Int64
	status  atomic.Int64  // answered instead of the document when not 0
	gate    chan struct{} // when not nil, each fetch waits for it to close
}

func newJWKSServer(t *testing.T, gate chan struct{}, doc []byte) *jwksServer {
	t.Helper()
	s := &jwksServer{gate: gate}
	s.doc.Store(&doc)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/.well-known/jwks.json" {
			http.NotFound(w, r)
			return
		}
		s.fetches.Add(1)
		if s.gate != nil {
			<-s.gate
		}
		if code := s.status.Load(); code != 0 {
			http.Error(w, "unavailable", int(code))
			return
		}
		w.Header().Set("Content-Type", "application/jwk-set+json")
		_, _ = w.Write(*s.doc.Load())
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *jwksServer) publish(doc []byte) { s.doc.Store(&doc) }

func (s *jwksServer) jwksURL() string { return s.URL + "/.well-known/jwks.json" }

// jwksVerifier is the test backend's verifier fetching keys from url.
func jwksVerifier(url string, clk *clock) *fencecheck.Verifier {
	return &fencecheck.Verifier{
		Pool: testPool, Artifact: testArtifact, Config: testConfig, Generation: testGen,
		Issuer: testIssuer, JWKSURL: url, Now: clk.Now, Started: testStarted,
	}
}

func verifyWith(t *testing.T, v *fencecheck.Verifier, token string) fencecheck.Reason {
	t.Helper()
	_, err := v.Verify(context.Background(), token, testTool, json.RawMessage(testArgs))
	if err != nil && fencecheck.ReasonOf(err) == "" {
		t.Fatalf("error without a reason: %v", err)
	}
	return fencecheck.ReasonOf(err)
}

// tokenWithKID is a token signed by key but naming kid.
func tokenWithKID(t *testing.T, key *tokentest.Key, kid string) string {
	return tokentest.SignJWS(t, key.Alg, key.Priv, map[string]any{jws.TypeKey: fencecheck.TokenType, jws.KeyIDKey: kid}, validClaims(t))
}

// TestJWKSRotation: a kid that appears at the URL is fetched on its first
// use, once the refresh interval allows a fetch.
func TestJWKSRotation(t *testing.T) {
	k1 := tokentest.NewKey(t, jwa.EdDSA, "authzd-1")
	k2 := tokentest.NewKey(t, jwa.ES256, "authzd-2")
	srv := newJWKSServer(t, nil, tokentest.JWKS(t, k1))
	clk := newClock()
	v := jwksVerifier(srv.jwksURL(), clk)

	if r := verifyWith(t, v, k1.Issue(t, validClaims(t))); r != "" {
		t.Fatalf("k1: %s", r)
	}
	if r := verifyWith(t, v, k1.Issue(t, validClaims(t))); r != "" {
		t.Fatalf("k1 again: %s", r)
	}
	if n := srv.fetches.Load(); n != 1 {
		t.Fatalf("fetches = %d, want 1 (cached)", n)
	}

	// authzd rotates: k2 is published next to k1.
	srv.publish(tokentest.JWKS(t, k1, k2))
	clk.Advance(fencecheck.DefaultMinRefreshInterval)
	if r := verifyWith(t, v, k2.Issue(t, validClaims(t))); r != "" {
		t.Fatalf("k2 after rotation: %s", r)
	}
	if n := srv.fetches.Load(); n != 2 {
		t.Fatalf("fetches = %d, want 2", n)
	}
	// Both keys stay usable without further fetches.
	for _, k := range []*tokentest.Key{k1, k2} {
		if r := verifyWith(t, v, k.Issue(t, validClaims(t))); r != "" {
			t.Fatalf("%s: %s", k.Priv.KeyID(), r)
		}
	}
	if n := srv.fetches.Load(); n != 2 {
		t.Fatalf("fetches = %d, want 2", n)
	}
}

// TestJWKSRefreshRateLimited: a flood of unknown kids, concurrent and
// sequential, costs at most one fetch per MinRefreshInterval.
func TestJWKSRefreshRateLimited(t *testing.T) {
	k1 := tokentest.NewKey(t, jwa.EdDSA, "authzd-1")
	srv := newJWKSServer(t, nil, tokentest.JWKS(t, k1))
	clk := newClock()
	v := jwksVerifier(srv.jwksURL(), clk)
	if r := verifyWith(t, v, k1.Issue(t, validClaims(t))); r != "" {
		t.Fatal(r)
	}

	flood := func() {
		var wg sync.WaitGroup
		for i := range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if r := verifyWith(t, v, tokenWithKID(t, k1, fmt.Sprintf("made-up-%d", i))); r != fencecheck.ReasonUnknownKey {
					t.Errorf("reason = %q, want %s", r, fencecheck.ReasonUnknownKey)
				}
			}()
		}
		wg.Wait()
		for i := range 50 {
			if r := verifyWith(t, v, tokenWithKID(t, k1, fmt.Sprintf("made-up-seq-%d", i))); r != fencecheck.ReasonUnknownKey {
				t.Fatalf("reason = %q, want %s", r, fencecheck.ReasonUnknownKey)
			}
		}
	}

	flood() // within the interval of the first fetch: no fetch at all
	if n := srv.fetches.Load(); n != 1 {
		t.Fatalf("fetches = %d, want 1", n)
	}
	clk.Advance(fencecheck.DefaultMinRefreshInterval)
	flood() // one fetch for the whole flood
	if n := srv.fetches.Load(); n != 2 {
		t.Fatalf("fetches = %d, want 2", n)
	}
	// Known kids never wait for the rate limit.
	if r := verifyWith(t, v, k1.Issue(t, validClaims(t))); r != "" {
		t.Fatal(r)
	}
}

// TestJWKSConcurrentMissesShareOneFetch: callers that need keys while a
// fetch is under way wait for it instead of fetching, and all succeed.
func TestJWKSConcurrentMissesShareOneFetch(t *testing.T) {
	k1 := tokentest.NewKey(t, jwa.EdDSA, "authzd-1")
	gate := make(chan struct{})
	srv := newJWKSServer(t, gate, tokentest.JWKS(t, k1))
	// A caller without keys reads the clock once, as it asks for a fetch
	// (to lead it, join the one under way, or be rate-limited), and not
	// again before that fetch ends: the count of clock reads is the count
	// of callers that have asked.
	clk := newClock()
	var asked atomic.Int64
	v := jwksVerifier(srv.jwksURL(), clk)
	v.Now = func() time.Time { asked.Add(1); return clk.Now() }

	const n = 20
	tokens := make([]string, n)
	for i := range tokens {
		tokens[i] = k1.Issue(t, validClaims(t))
	}
	var wg sync.WaitGroup
	results := make([]fencecheck.Reason, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = verifyWith(t, v, tokens[i])
		}()
	}
	// Let the fetch complete only once it has started and every caller
	// has asked for keys while it was under way.
	for deadline := time.Now().Add(30 * time.Second); srv.fetches.Load() == 0 || asked.Load() < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			close(gate)
			t.Fatalf("after 30s: %d fetches, %d of %d callers asked for keys", srv.fetches.Load(), asked.Load(), n)
		}
	}
	close(gate)
	wg.Wait()
	for i, r := range results {
		if r != "" {
			t.Errorf("caller %d: %s", i, r)
		}
	}
	if got := srv.fetches.Load(); got != 1 {
		t.Fatalf("fetches = %d, want 1", got)
	}
}

// TestJWKSUnavailableFailsClosed: without keys, every token is refused
// with ReasonKeySource — never accepted, never blamed on the token.
func TestJWKSUnavailableFailsClosed(t *testing.T) {
	k1 := tokentest.NewKey(t, jwa.EdDSA, "authzd-1")

	t.Run("server down", func(t *testing.T) {
		srv := newJWKSServer(t, nil, tokentest.JWKS(t, k1))
		url := srv.jwksURL()
		srv.Close()
		v := jwksVerifier(url, newClock())
		if r := verifyWith(t, v, k1.Issue(t, validClaims(t))); r != fencecheck.ReasonKeySource {
			t.Fatalf("reason = %q, want %s", r, fencecheck.ReasonKeySource)
		}
	})
	t.Run("error status", func(t *testing.T) {
		srv := newJWKSServer(t, nil, tokentest.JWKS(t, k1))
		srv.status.Store(http.StatusServiceUnavailable)
		clk := newClock()
		v := jwksVerifier(srv.jwksURL(), clk)
		if r := verifyWith(t, v, k1.Issue(t, validClaims(t))); r != fencecheck.ReasonKeySource {
			t.Fatalf("reason = %q, want %s", r, fencecheck.ReasonKeySource)
		}
		// Within the interval the failure is remembered, not refetched.
		if r := verifyWith(t, v, k1.Issue(t, validClaims(t))); r != fencecheck.ReasonKeySource {
			t.Fatalf("reason = %q, want %s", r, fencecheck.ReasonKeySource)
		}
		if n := srv.fetches.Load(); n != 1 {
			t.Fatalf("fetches = %d, want 1", n)
		}
		// Recovery after the interval.
		srv.status.Store(0)
		clk.Advance(fencecheck.DefaultMinRefreshInterval)
		if r := verifyWith(t, v, k1.Issue(t, validClaims(t))); r != "" {
			t.Fatalf("after recovery: %s", r)
		}
	})
	t.Run("not a JWKS", func(t *testing.T) {
		srv := newJWKSServer(t, nil, []byte(`<html>login</html>`))
		v := jwksVerifier(srv.jwksURL(), newClock())
		if r := verifyWith(t, v, k1.Issue(t, validClaims(t))); r != fencecheck.ReasonKeySource {
			t.Fatalf("reason = %q, want %s", r, fencecheck.ReasonKeySource)
		}
	})
	t.Run("keys too old and server down", func(t *testing.T) {
		srv := newJWKSServer(t, nil, tokentest.JWKS(t, k1))
		clk := newClock()
		v := jwksVerifier(srv.jwksURL(), clk)
		if r := verifyWith(t, v, k1.Issue(t, validClaims(t))); r != "" {
			t.Fatal(r)
		}
		srv.status.Store(http.StatusBadGateway)
		// Within MaxKeyAge the cached keys serve.
		clk.Advance(fencecheck.DefaultMaxKeyAge / 2)
		if r := verifyWith(t, v, k1.Issue(t, freshClaims(t, clk))); r != "" {
			t.Fatalf("within MaxKeyAge: %s", r)
		}
		clk.Advance(fencecheck.DefaultMaxKeyAge)
		if r := verifyWith(t, v, k1.Issue(t, freshClaims(t, clk))); r != fencecheck.ReasonKeySource {
			t.Fatalf("past MaxKeyAge: reason = %q, want %s", r, fencecheck.ReasonKeySource)
		}
	})
}

// TestJWKSRemovedKeyStopsBeingTrusted: a key authzd withdrew is refused
// once the cached set is older than MaxKeyAge.
func TestJWKSRemovedKeyStopsBeingTrusted(t *testing.T) {
	k1 := tokentest.NewKey(t, jwa.EdDSA, "authzd-1")
	k2 := tokentest.NewKey(t, jwa.EdDSA, "authzd-2")
	srv := newJWKSServer(t, nil, tokentest.JWKS(t, k1, k2))
	clk := newClock()
	v := jwksVerifier(srv.jwksURL(), clk)
	if r := verifyWith(t, v, k1.Issue(t, validClaims(t))); r != "" {
		t.Fatal(r)
	}
	srv.publish(tokentest.JWKS(t, k2))
	clk.Advance(fencecheck.DefaultMaxKeyAge + time.Second)
	if r := verifyWith(t, v, k1.Issue(t, freshClaims(t, clk))); r != fencecheck.ReasonUnknownKey {
		t.Fatalf("reason = %q, want %s", r, fencecheck.ReasonUnknownKey)
	}
	if r := verifyWith(t, v, k2.Issue(t, freshClaims(t, clk))); r != "" {
		t.Fatal(r)
	}
}

// freshClaims are valid claims issued at the clock's now.
func freshClaims(t *testing.T, clk *clock) fencecheck.Claims {
	c := validClaims(t)
	d := clk.Now().Unix() - testEpoch.Unix()
	c.IssuedAt += d
	c.NotBefore += d
	c.Expiry += d
	return c
}
