package fencecheck_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/fencecheck/fencechecktest"
	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwk"
	"github.com/lestrrat-go/jwx/v2/jws"
)

// newJWKSServer publishes the JWKS of keys until the test ends.
func newJWKSServer(t *testing.T, keys ...*fencechecktest.Key) *fencechecktest.JWKSServer {
	t.Helper()
	srv := fencechecktest.NewJWKSServer(keys...)
	t.Cleanup(srv.Close)
	return srv
}

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
func tokenWithKID(t *testing.T, key *fencechecktest.Key, kid string) string {
	return signJWS(t, jwa.SignatureAlgorithm(key.Alg), key.Private, map[string]any{jws.TypeKey: fencecheck.TokenType, jws.KeyIDKey: kid}, validClaims(t))
}

// TestJWKSRotation: a kid that appears at the URL is fetched on its first
// use, once the refresh interval allows a fetch.
func TestJWKSRotation(t *testing.T) {
	k1 := fencechecktest.NewKey(fencechecktest.EdDSA, "authzd-1")
	k2 := fencechecktest.NewKey(fencechecktest.ES256, "authzd-2")
	srv := newJWKSServer(t, k1)
	clk := newClock()
	v := jwksVerifier(srv.JWKSURL(), clk)

	if r := verifyWith(t, v, k1.Issue(validClaims(t))); r != "" {
		t.Fatalf("k1: %s", r)
	}
	if r := verifyWith(t, v, k1.Issue(validClaims(t))); r != "" {
		t.Fatalf("k1 again: %s", r)
	}
	if n := srv.Fetches(); n != 1 {
		t.Fatalf("fetches = %d, want 1 (cached)", n)
	}

	// authzd rotates: k2 is published next to k1.
	srv.Publish(k1, k2)
	clk.Advance(fencecheck.DefaultMinRefreshInterval)
	if r := verifyWith(t, v, k2.Issue(validClaims(t))); r != "" {
		t.Fatalf("k2 after rotation: %s", r)
	}
	if n := srv.Fetches(); n != 2 {
		t.Fatalf("fetches = %d, want 2", n)
	}
	// Both keys stay usable without further fetches.
	for _, k := range []*fencechecktest.Key{k1, k2} {
		if r := verifyWith(t, v, k.Issue(validClaims(t))); r != "" {
			t.Fatalf("%s: %s", k.KID, r)
		}
	}
	if n := srv.Fetches(); n != 2 {
		t.Fatalf("fetches = %d, want 2", n)
	}
}

// TestJWKSRefreshRateLimited: a flood of unknown kids, concurrent and
// sequential, costs at most one fetch per MinRefreshInterval.
func TestJWKSRefreshRateLimited(t *testing.T) {
	k1 := fencechecktest.NewKey(fencechecktest.EdDSA, "authzd-1")
	srv := newJWKSServer(t, k1)
	clk := newClock()
	v := jwksVerifier(srv.JWKSURL(), clk)
	if r := verifyWith(t, v, k1.Issue(validClaims(t))); r != "" {
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
	if n := srv.Fetches(); n != 1 {
		t.Fatalf("fetches = %d, want 1", n)
	}
	clk.Advance(fencecheck.DefaultMinRefreshInterval)
	flood() // one fetch for the whole flood
	if n := srv.Fetches(); n != 2 {
		t.Fatalf("fetches = %d, want 2", n)
	}
	// Known kids never wait for the rate limit.
	if r := verifyWith(t, v, k1.Issue(validClaims(t))); r != "" {
		t.Fatal(r)
	}
}

// TestJWKSConcurrentMissesShareOneFetch: callers that need keys while a
// fetch is under way wait for it instead of fetching, and all succeed.
func TestJWKSConcurrentMissesShareOneFetch(t *testing.T) {
	k1 := fencechecktest.NewKey(fencechecktest.EdDSA, "authzd-1")
	srv := newJWKSServer(t, k1)
	release := srv.Hold()
	// A caller without keys reads the clock once, as it asks for a fetch
	// (to lead it, join the one under way, or be rate-limited), and not
	// again before that fetch ends: the count of clock reads is the count
	// of callers that have asked.
	clk := newClock()
	var asked atomic.Int64
	v := jwksVerifier(srv.JWKSURL(), clk)
	v.Now = func() time.Time { asked.Add(1); return clk.Now() }

	const n = 20
	tokens := make([]string, n)
	for i := range tokens {
		tokens[i] = k1.Issue(validClaims(t))
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
	for deadline := time.Now().Add(30 * time.Second); srv.Fetches() == 0 || asked.Load() < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			release()
			t.Fatalf("after 30s: %d fetches, %d of %d callers asked for keys", srv.Fetches(), asked.Load(), n)
		}
	}
	release()
	wg.Wait()
	for i, r := range results {
		if r != "" {
			t.Errorf("caller %d: %s", i, r)
		}
	}
	if got := srv.Fetches(); got != 1 {
		t.Fatalf("fetches = %d, want 1", got)
	}
}

// TestJWKSUnavailableFailsClosed: without keys, every token is refused
// with ReasonKeySource — never accepted, never blamed on the token.
func TestJWKSUnavailableFailsClosed(t *testing.T) {
	k1 := fencechecktest.NewKey(fencechecktest.EdDSA, "authzd-1")

	t.Run("server down", func(t *testing.T) {
		srv := newJWKSServer(t, k1)
		url := srv.JWKSURL()
		srv.Close()
		v := jwksVerifier(url, newClock())
		if r := verifyWith(t, v, k1.Issue(validClaims(t))); r != fencecheck.ReasonKeySource {
			t.Fatalf("reason = %q, want %s", r, fencecheck.ReasonKeySource)
		}
	})
	t.Run("error status", func(t *testing.T) {
		srv := newJWKSServer(t, k1)
		srv.Fail(http.StatusServiceUnavailable)
		clk := newClock()
		v := jwksVerifier(srv.JWKSURL(), clk)
		if r := verifyWith(t, v, k1.Issue(validClaims(t))); r != fencecheck.ReasonKeySource {
			t.Fatalf("reason = %q, want %s", r, fencecheck.ReasonKeySource)
		}
		// Within the interval the failure is remembered, not refetched.
		if r := verifyWith(t, v, k1.Issue(validClaims(t))); r != fencecheck.ReasonKeySource {
			t.Fatalf("reason = %q, want %s", r, fencecheck.ReasonKeySource)
		}
		if n := srv.Fetches(); n != 1 {
			t.Fatalf("fetches = %d, want 1", n)
		}
		// Recovery after the interval.
		srv.Fail(0)
		clk.Advance(fencecheck.DefaultMinRefreshInterval)
		if r := verifyWith(t, v, k1.Issue(validClaims(t))); r != "" {
			t.Fatalf("after recovery: %s", r)
		}
	})
	t.Run("not a JWKS", func(t *testing.T) {
		srv := newJWKSServer(t)
		srv.PublishDocument([]byte(`<html>login</html>`))
		v := jwksVerifier(srv.JWKSURL(), newClock())
		if r := verifyWith(t, v, k1.Issue(validClaims(t))); r != fencecheck.ReasonKeySource {
			t.Fatalf("reason = %q, want %s", r, fencecheck.ReasonKeySource)
		}
	})
	t.Run("keys too old and server down", func(t *testing.T) {
		srv := newJWKSServer(t, k1)
		clk := newClock()
		v := jwksVerifier(srv.JWKSURL(), clk)
		if r := verifyWith(t, v, k1.Issue(validClaims(t))); r != "" {
			t.Fatal(r)
		}
		srv.Fail(http.StatusBadGateway)
		// Within MaxKeyAge the cached keys serve.
		clk.Advance(fencecheck.DefaultMaxKeyAge / 2)
		if r := verifyWith(t, v, k1.Issue(freshClaims(t, clk))); r != "" {
			t.Fatalf("within MaxKeyAge: %s", r)
		}
		clk.Advance(fencecheck.DefaultMaxKeyAge)
		if r := verifyWith(t, v, k1.Issue(freshClaims(t, clk))); r != fencecheck.ReasonKeySource {
			t.Fatalf("past MaxKeyAge: reason = %q, want %s", r, fencecheck.ReasonKeySource)
		}
	})
}

// TestJWKSRemovedKeyStopsBeingTrusted: a key authzd withdrew is refused
// once the cached set is older than MaxKeyAge.
func TestJWKSRemovedKeyStopsBeingTrusted(t *testing.T) {
	k1 := fencechecktest.NewKey(fencechecktest.EdDSA, "authzd-1")
	k2 := fencechecktest.NewKey(fencechecktest.EdDSA, "authzd-2")
	srv := newJWKSServer(t, k1, k2)
	clk := newClock()
	v := jwksVerifier(srv.JWKSURL(), clk)
	if r := verifyWith(t, v, k1.Issue(validClaims(t))); r != "" {
		t.Fatal(r)
	}
	srv.Publish(k2)
	clk.Advance(fencecheck.DefaultMaxKeyAge + time.Second)
	if r := verifyWith(t, v, k1.Issue(freshClaims(t, clk))); r != fencecheck.ReasonUnknownKey {
		t.Fatalf("reason = %q, want %s", r, fencecheck.ReasonUnknownKey)
	}
	if r := verifyWith(t, v, k2.Issue(freshClaims(t, clk))); r != "" {
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

// TestParseJWKS: a JWKS document gives the keys a fetched JWKS would, by
// kid: Ed25519 and P-256 signing keys, nothing else; a kid twice is an
// error.
func TestParseJWKS(t *testing.T) {
	ed := fencechecktest.NewKey(fencechecktest.EdDSA, "ed")
	ec := fencechecktest.NewKey(fencechecktest.ES256, "ec")
	jwkOf := func(raw any, members map[string]any) map[string]any {
		k, err := jwk.FromRaw(raw)
		if err != nil {
			t.Fatal(err)
		}
		for name, v := range members {
			if err := k.Set(name, v); err != nil {
				t.Fatal(err)
			}
		}
		data, _ := json.Marshal(k)
		var m map[string]any
		if err := json.Unmarshal(data, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	doc := func(keys ...map[string]any) []byte {
		data, _ := json.Marshal(map[string]any{"keys": keys})
		return data
	}
	usable := []map[string]any{
		jwkOf(ed.Public(), map[string]any{"kid": "ed", "alg": "EdDSA", "use": "sig"}),
		jwkOf(ec.Public(), map[string]any{"kid": "ec"}),
	}
	skipped := []map[string]any{
		jwkOf(fencechecktest.NewKey(fencechecktest.EdDSA, "x").Public(), nil),                                        // no kid
		jwkOf(fencechecktest.NewKey(fencechecktest.EdDSA, "x").Public(), map[string]any{"kid": "enc", "use": "enc"}), // not for signatures
		jwkOf(fencechecktest.NewKey(fencechecktest.EdDSA, "x").Public(), map[string]any{"kid": "alg", "alg": "ES256"}),
		jwkOf(&p384.PublicKey, map[string]any{"kid": "p384"}),
		jwkOf(&rsaKey.PublicKey, map[string]any{"kid": "rsa"}),
	}
	keys, err := fencecheck.ParseJWKS(doc(append(usable, skipped...)...))
	if err != nil {
		t.Fatal(err)
	}
	want := fencechecktest.Keys(ed, ec)
	if len(keys) != len(want) {
		t.Fatalf("ParseJWKS gave kids %v, want ed and ec", slices.Collect(maps.Keys(keys)))
	}
	for kid, pub := range want {
		if got, ok := keys[kid].(interface{ Equal(crypto.PublicKey) bool }); !ok || !got.Equal(pub) {
			t.Fatalf("key %q = %v, want %v", kid, keys[kid], pub)
		}
	}
	// The keys verify the tokens of their issuer.
	v := newVerifier(keys)
	for _, k := range []*fencechecktest.Key{ed, ec} {
		if _, err := v.Verify(context.Background(), k.Issue(validClaims(t)), testTool, json.RawMessage(testArgs)); err != nil {
			t.Fatalf("%s: %v", k.KID, err)
		}
	}

	if _, err := fencecheck.ParseJWKS(doc(usable[0], jwkOf(ec.Public(), map[string]any{"kid": "ed"}))); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("a kid twice: %v, want an error", err)
	}
	if _, err := fencecheck.ParseJWKS([]byte(`<html>login</html>`)); err == nil {
		t.Fatal("not a JWKS: no error")
	}
}
