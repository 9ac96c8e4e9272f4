// Package fencechecktest stands in for authzd's token issuer in the tests
// of a backend that embeds fencecheck, as net/http/httptest stands in for
// a server: it signs dispatch tokens the way authzd does, with real
// Ed25519 (EdDSA) or P-256 (ES256) keys, and gives — as a key map, a JWKS
// document or a JWKS endpoint — the keys a [fencecheck.Verifier] trusts
// them by. The claims are the test's: a [fencecheck.Claims], or anything
// else that marshals to the claim set a test needs (a malformed one
// included).
//
// It uses the standard library only, so a token it signs is also a check
// of the verifier against a second implementation of JWS.
package fencechecktest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"

	"github.com/fcd-authz/fcd/fencecheck"
)

// The algorithms authzd signs dispatch tokens with.
const (
	EdDSA = "EdDSA" // Ed25519
	ES256 = "ES256" // ECDSA on P-256 with SHA-256
)

// Key is a token-signing key: its kid, the algorithm it signs with and the
// private key (an ed25519.PrivateKey or a P-256 *ecdsa.PrivateKey).
type Key struct {
	KID     string
	Alg     string
	Private crypto.Signer
}

// NewKey generates a real key for alg, [EdDSA] or [ES256] (it panics on
// any other), under kid.
func NewKey(alg, kid string) *Key {
	k := &Key{KID: kid, Alg: alg}
	var err error
	switch alg {
	case EdDSA:
		_, k.Private, err = ed25519.GenerateKey(rand.Reader)
	case ES256:
		k.Private, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	default:
		panic(fmt.Sprintf("fencechecktest: no keys for algorithm %q (EdDSA or ES256)", alg))
	}
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return k
}

// Public is the key's public half, as [fencecheck.Verifier.Keys] holds it.
func (k *Key) Public() crypto.PublicKey { return k.Private.Public() }

// Issue signs claims the way authzd's issuer does: the JSON of the claims
// (a []byte is the payload as it is) as a compact JWS with the protected
// header {"alg", "typ": "fcd-dispatch+jwt", "kid"}. It panics if claims
// do not marshal.
func (k *Key) Issue(claims any) string {
	return k.Sign(map[string]any{"typ": fencecheck.TokenType, "kid": k.KID}, claims)
}

// Sign signs claims (a []byte is the payload as it is) as a compact JWS
// whose protected header is header plus the key's alg, unless header has
// an alg of its own: a test writes whatever header it needs, one the
// verifier must refuse included. It panics if header or claims do not
// marshal.
func (k *Key) Sign(header map[string]any, claims any) string {
	h := map[string]any{"alg": k.Alg}
	maps.Copy(h, header)
	hdr, err := json.Marshal(h)
	if err != nil {
		panic(fmt.Sprintf("fencechecktest: the header: %v", err))
	}
	payload, ok := claims.([]byte)
	if !ok {
		if payload, err = json.Marshal(claims); err != nil {
			panic(fmt.Sprintf("fencechecktest: the claims: %v", err))
		}
	}
	b64 := base64.RawURLEncoding.EncodeToString
	input := b64(hdr) + "." + b64(payload)
	var sig []byte
	switch priv := k.Private.(type) {
	case ed25519.PrivateKey:
		sig = ed25519.Sign(priv, []byte(input))
	case *ecdsa.PrivateKey:
		sum := sha256.Sum256([]byte(input))
		r, s, err := ecdsa.Sign(rand.Reader, priv, sum[:])
		if err != nil {
			panic(err) // a P-256 key and crypto/rand do not fail
		}
		// JWS writes r and s as two fixed-size big-endian integers.
		sig = make([]byte, 64)
		r.FillBytes(sig[:32])
		s.FillBytes(sig[32:])
	default:
		panic(fmt.Sprintf("fencechecktest: cannot sign with a %T", k.Private))
	}
	return input + "." + b64(sig)
}

// Keys are the keys' public halves by kid, for [fencecheck.Verifier.Keys].
func Keys(keys ...*Key) map[string]crypto.PublicKey {
	m := make(map[string]crypto.PublicKey, len(keys))
	for _, k := range keys {
		m[k.KID] = k.Public()
	}
	return m
}

// JWKS is the JWKS document of the keys' public halves, as authzd serves
// it at /.well-known/jwks.json and authzd keys new writes it (each key
// with its kid, its alg and "use": "sig").
func JWKS(keys ...*Key) []byte {
	type jwk struct {
		Kty string `json:"kty"`
		Crv string `json:"crv"`
		X   string `json:"x"`
		Y   string `json:"y,omitempty"`
		KID string `json:"kid"`
		Alg string `json:"alg"`
		Use string `json:"use"`
	}
	b64 := base64.RawURLEncoding.EncodeToString
	set := struct {
		Keys []jwk `json:"keys"`
	}{Keys: []jwk{}}
	for _, k := range keys {
		switch pub := k.Public().(type) {
		case ed25519.PublicKey:
			set.Keys = append(set.Keys, jwk{Kty: "OKP", Crv: "Ed25519", X: b64(pub), KID: k.KID, Alg: k.Alg, Use: "sig"})
		case *ecdsa.PublicKey:
			var x, y [32]byte
			pub.X.FillBytes(x[:])
			pub.Y.FillBytes(y[:])
			set.Keys = append(set.Keys, jwk{Kty: "EC", Crv: "P-256", X: b64(x[:]), Y: b64(y[:]), KID: k.KID, Alg: k.Alg, Use: "sig"})
		}
	}
	data, err := json.Marshal(set)
	if err != nil {
		panic(err) // strings only
	}
	return data
}

// JWKSPath is where authzd, and a JWKSServer, serve the JWKS.
const JWKSPath = "/.well-known/jwks.json"

// JWKSServer is a real HTTP server publishing a JWKS at [JWKSPath], for a
// Verifier's JWKSURL: a test changes what it publishes, makes it fail or
// hold its answers, and counts the fetches it served. Close it when done.
type JWKSServer struct {
	*httptest.Server
	doc     atomic.Pointer[[]byte]
	fetches atomic.Int64
	status  atomic.Int64

	mu   sync.Mutex
	hold chan struct{} // when not nil, each fetch waits until it is closed
}

// NewJWKSServer starts a server publishing the JWKS of keys.
func NewJWKSServer(keys ...*Key) *JWKSServer {
	s := &JWKSServer{}
	s.Publish(keys...)
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

func (s *JWKSServer) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != JWKSPath {
		http.NotFound(w, r)
		return
	}
	s.fetches.Add(1)
	s.mu.Lock()
	hold := s.hold
	s.mu.Unlock()
	if hold != nil {
		<-hold
	}
	if code := s.status.Load(); code != 0 {
		http.Error(w, "unavailable", int(code))
		return
	}
	w.Header().Set("Content-Type", "application/jwk-set+json")
	_, _ = w.Write(*s.doc.Load())
}

// JWKSURL is the URL of the JWKS, for [fencecheck.Verifier.JWKSURL].
func (s *JWKSServer) JWKSURL() string { return s.URL + JWKSPath }

// Publish serves the JWKS of keys from now on (a rotation, a withdrawal).
func (s *JWKSServer) Publish(keys ...*Key) { s.PublishDocument(JWKS(keys...)) }

// PublishDocument serves doc as it is from now on: a JWKS of keys this
// package does not make, or a document that is no JWKS at all.
func (s *JWKSServer) PublishDocument(doc []byte) { s.doc.Store(&doc) }

// Fail answers every fetch with the HTTP status code instead of the
// document; 0 serves the document again.
func (s *JWKSServer) Fail(code int) { s.status.Store(int64(code)) }

// Hold makes every fetch from now on wait before it answers, until
// release is called (at most once), so that a test can act while
// fetches are under way.
func (s *JWKSServer) Hold() (release func()) {
	hold := make(chan struct{})
	s.mu.Lock()
	s.hold = hold
	s.mu.Unlock()
	return sync.OnceFunc(func() {
		s.mu.Lock()
		s.hold = nil
		s.mu.Unlock()
		close(hold)
	})
}

// Fetches is the number of JWKS fetches the server has received.
func (s *JWKSServer) Fetches() int64 { return s.fetches.Load() }
