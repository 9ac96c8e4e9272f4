package fencecheck_test

import (
	"crypto"
	"encoding/json"
	"fmt"
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

// The backend every test verifier stands for.
const (
	testIssuer   = "https://authzd.test"
	testPool     = "github-prod"
	testArtifact = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	testConfig   = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	testGen      = 7
	testTool     = "github/create_repository"
	testArgs     = `{"name":"payroll-exports","private":true,"topics":["finance","exports"]}`
)

// testEpoch is a fixed clock: a verifier in a test sees this as now.
var testEpoch = time.Unix(1_800_000_000, 0)

// testStarted is when the test backend's process started: an hour before
// testEpoch, so that an offline verifier accepts the leases admitted at
// testEpoch (fcd_admitted) and refuses those admitted before it.
var testStarted = testEpoch.Add(-time.Hour)

var jtiSeq atomic.Int64

// newJTI returns a lease id no other token in this test binary has.
func newJTI() string { return fmt.Sprintf("lease-%06d", jtiSeq.Add(1)) }

// validClaims are claims this package's test verifier accepts at
// testEpoch for testTool with testArgs.
func validClaims(t testing.TB) fencecheck.Claims {
	t.Helper()
	return claimsFor(t, testTool, testArgs)
}

func claimsFor(t testing.TB, tool, args string) fencecheck.Claims {
	t.Helper()
	digest, err := fencecheck.ArgumentDigest(tool, json.RawMessage(args))
	if err != nil {
		t.Fatal(err)
	}
	now := testEpoch.Unix()
	return fencecheck.Claims{
		Issuer: testIssuer, Audience: testPool, Subject: "session-1", ID: newJTI(),
		IssuedAt: now, NotBefore: now, Expiry: now + 30,
		Formation: "formation-1", Tool: tool, ArgumentDigest: digest,
		Epoch:    "sha256:3333333333333333333333333333333333333333333333333333333333333333",
		Artifact: testArtifact, Config: testConfig, Generation: testGen,
		Revision: 42, Cluster: "cdf818194e3a8c32", Admitted: testEpoch.UnixMilli(),
	}
}

// claimsMap is c as a JSON object, to add, drop or rename claims.
func claimsMap(t testing.TB, c fencecheck.Claims) map[string]any {
	t.Helper()
	data, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// clock is a settable test clock, safe for concurrent use.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: testEpoch} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// newVerifier is the test backend's verifier, trusting set, at testEpoch:
// offline mode (no Claimer), its process started at testStarted.
func newVerifier(set map[string]crypto.PublicKey) *fencecheck.Verifier {
	return &fencecheck.Verifier{
		Pool: testPool, Artifact: testArtifact, Config: testConfig, Generation: testGen,
		Issuer: testIssuer, Keys: set, Now: func() time.Time { return testEpoch }, Started: testStarted,
	}
}

// signJWS signs claims (or, as []byte, a payload as it is) with jwx, for
// tokens no issuer makes: any algorithm (HMAC and a key of the wrong kind
// included), any raw key and any protected header members (alg is added
// by jwx).
func signJWS(t testing.TB, alg jwa.SignatureAlgorithm, key any, hdr map[string]any, claims any) string {
	t.Helper()
	payload, ok := claims.([]byte)
	if !ok {
		var err error
		if payload, err = json.Marshal(claims); err != nil {
			t.Fatal(err)
		}
	}
	h := jws.NewHeaders()
	for name, v := range hdr {
		if err := h.Set(name, v); err != nil {
			t.Fatal(err)
		}
	}
	out, err := jws.Sign(payload, jws.WithKey(alg, key, jws.WithProtectedHeaders(h)))
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// privateJWK is key as the private JWK authzd signs with (jwx, as
// manifest.Sign), its kid set.
func privateJWK(t testing.TB, key *fencechecktest.Key) jwk.Key {
	t.Helper()
	priv, err := jwk.FromRaw(key.Private)
	if err != nil {
		t.Fatal(err)
	}
	if err := priv.Set(jwk.KeyIDKey, key.KID); err != nil {
		t.Fatal(err)
	}
	return priv
}
