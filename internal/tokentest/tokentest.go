// Package tokentest signs dispatch tokens for tests the way authzd's
// token issuer does, with real Ed25519 (EdDSA) or P-256 (ES256) keys, and
// gives the JWKS that a fencecheck verifier trusts those keys by. The
// claims are the test's: a fencecheck.Claims, or anything else that
// marshals to the claim set a test needs (a malformed one included).
package tokentest

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"testing"

	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwk"
	"github.com/lestrrat-go/jwx/v2/jws"
)

// Key is a private JWK with its kid, the algorithm it signs with and its
// public half.
type Key struct {
	Alg  jwa.SignatureAlgorithm
	Priv jwk.Key
	Pub  jwk.Key
}

// NewKey generates a real Ed25519 (EdDSA) or P-256 (ES256) key.
func NewKey(t testing.TB, alg jwa.SignatureAlgorithm, kid string) *Key {
	t.Helper()
	var raw any
	switch alg {
	case jwa.EdDSA:
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		raw = priv
	case jwa.ES256:
		priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		raw = priv
	default:
		t.Fatalf("no test keys for %s", alg)
	}
	priv, err := jwk.FromRaw(raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := priv.Set(jwk.KeyIDKey, kid); err != nil {
		t.Fatal(err)
	}
	if err := priv.Set(jwk.AlgorithmKey, alg); err != nil {
		t.Fatal(err)
	}
	pub, err := priv.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return &Key{Alg: alg, Priv: priv, Pub: pub}
}

// PublicSet is the JWKS of the keys' public halves.
func PublicSet(t testing.TB, keys ...*Key) jwk.Set {
	t.Helper()
	set := jwk.NewSet()
	for _, k := range keys {
		if err := set.AddKey(k.Pub); err != nil {
			t.Fatal(err)
		}
	}
	return set
}

// JWKS is the JWKS document of the keys' public halves.
func JWKS(t testing.TB, keys ...*Key) []byte {
	t.Helper()
	data, err := json.Marshal(PublicSet(t, keys...))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// Issue signs claims (a fencecheck.Claims, or a map for malformed claim
// sets) the way authzd's issuer does: the JSON of the claims as a compact
// JWS with the protected header {alg, typ: fcd-dispatch+jwt, kid}.
func (k *Key) Issue(t testing.TB, claims any) string {
	t.Helper()
	return SignJWS(t, k.Alg, k.Priv, map[string]any{jws.TypeKey: fencecheck.TokenType, jws.KeyIDKey: k.Priv.KeyID()}, claims)
}

// SignJWS signs claims (or, as []byte, a payload as it is) with any
// algorithm, key and protected header members (alg is added by jwx). A
// JWK is used as its raw key, since jwx would otherwise write the JWK's
// own kid over the one in hdr.
func SignJWS(t testing.TB, alg jwa.SignatureAlgorithm, key any, hdr map[string]any, claims any) string {
	t.Helper()
	if k, ok := key.(jwk.Key); ok {
		var raw any
		if err := k.Raw(&raw); err != nil {
			t.Fatal(err)
		}
		key = raw
	}
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
