package main

import (
	"path/filepath"

	"github.com/fcd-authz/fcd/manifest"
	"github.com/lestrrat-go/jwx/v2/jwa"
)

// keyPair is a key generated into a data directory: the private JWK and,
// when written, the JWKS of its public half.
type keyPair struct {
	private, public string
}

// generateKey makes a new alg key named kind under dir/keys, as `serve
// --dev` and `authzd init` both lay them out: the private JWK in
// keys/<kind>.jwk (mode 0600) and, when withPublic, its public JWKS in
// keys/<kind>-jwks.json (0644), for verifiers to trust.
func generateKey(dir, kind string, alg jwa.SignatureAlgorithm, withPublic bool) (keyPair, error) {
	key, err := manifest.GenerateKey(alg)
	if err != nil {
		return keyPair{}, err
	}
	kp := keyPair{private: filepath.Join(dir, "keys", kind+".jwk")}
	if err := writeJSONFile(kp.private, key, 0o600); err != nil {
		return keyPair{}, err
	}
	if !withPublic {
		return kp, nil
	}
	pub, err := manifest.PublicSet(key)
	if err != nil {
		return keyPair{}, err
	}
	kp.public = filepath.Join(dir, "keys", kind+"-jwks.json")
	if err := writeJSONFile(kp.public, pub, 0o644); err != nil {
		return keyPair{}, err
	}
	return kp, nil
}
