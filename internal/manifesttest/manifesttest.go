// Package manifesttest makes the signing keys of registrars and
// compatibility-certificate issuers for tests, failing the test instead of
// returning an error, so that a test's trust setup stays one line.
package manifesttest

import (
	"testing"

	"github.com/fcd-authz/fcd/manifest"
	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwk"
)

// Signer is a fresh Ed25519 private key, the JWKS of its public half and
// a verifier trusting that set: a registrar signing manifests, or an
// issuer signing certificates, and what authzd trusts them by.
type Signer struct {
	Key      jwk.Key
	Set      jwk.Set
	Verifier *manifest.Verifier
}

// NewSigner generates a Signer, failing t on error.
func NewSigner(t testing.TB) *Signer {
	t.Helper()
	key, err := manifest.GenerateKey(jwa.EdDSA)
	if err != nil {
		t.Fatal(err)
	}
	set, err := manifest.PublicSet(key)
	if err != nil {
		t.Fatal(err)
	}
	v, err := manifest.NewVerifier(set)
	if err != nil {
		t.Fatal(err)
	}
	return &Signer{Key: key, Set: set, Verifier: v}
}
