package authz

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/internal/public"
	"github.com/fcd-authz/fcd/lease"
	"github.com/lestrrat-go/jwx/v2/jwk"
)

// MaxTokenLifetime bounds the dispatch-token lifetime: tokens are meant to
// live seconds, just long enough to reach the backend.
const MaxTokenLifetime = 5 * time.Minute

// ErrSigningKeyUnpublished: this replica's signing key is not (or no
// longer) published in etcd, so a backend could not verify its tokens;
// it issues none until it is.
var ErrSigningKeyUnpublished = public.New("authz", "signing key not published")

// TokenIssuer signs dispatch tokens with one private key (EdDSA or ES256)
// and publishes its public half so backends can verify them.
type TokenIssuer struct {
	key jwk.Key
	// header is the base64url protected header {alg, kid, typ}, the same
	// for every token; signer signs a JWS signing input with the raw key.
	header    string
	signer    func(input []byte) ([]byte, error)
	public    []byte
	issuer    string
	lifetime  time.Duration
	grace     time.Duration
	published atomic.Bool
}

// DefaultTokenLifetime is how long a dispatch token is valid by default.
const DefaultTokenLifetime = 30 * time.Second

// TokenIssuerConfig configures a [TokenIssuer]; zero fields are defaults.
type TokenIssuerConfig struct {
	// Key is the private signing JWK (Ed25519 or P-256) with a kid.
	Key jwk.Key
	// Issuer is the iss claim; "" means "fcd".
	Issuer string
	// Lifetime of tokens; zero means DefaultTokenLifetime; at most
	// MaxTokenLifetime.
	Lifetime time.Duration
	// Grace is how long the public key stays published after this issuer
	// stops (rotation, shutdown, crash), beyond the token lifetime; zero
	// means one minute. Every token it signed stays verifiable until it
	// expires.
	Grace time.Duration
}

// NewTokenIssuer returns an issuer configured by cfg.
func NewTokenIssuer(cfg TokenIssuerConfig) (*TokenIssuer, error) {
	key, issuer, lifetime := cfg.Key, cfg.Issuer, cfg.Lifetime
	if key == nil {
		return nil, errors.New("authz: no signing key")
	}
	if issuer == "" {
		issuer = "fcd"
	}
	if lifetime == 0 {
		lifetime = DefaultTokenLifetime
	}
	if lifetime < time.Second || lifetime > MaxTokenLifetime {
		return nil, fmt.Errorf("authz: token lifetime %s out of [1s, %s]", lifetime, MaxTokenLifetime)
	}
	if key.KeyID() == "" {
		return nil, errors.New("authz: signing key has no kid")
	}
	pub, err := key.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("authz: signing key: %w", err)
	}
	if !isPrivate(key) {
		return nil, errors.New("authz: signing key is a public key")
	}
	pj, err := json.Marshal(pub)
	if err != nil {
		return nil, fmt.Errorf("authz: signing key: %w", err)
	}
	grace := cfg.Grace
	if grace <= 0 {
		grace = time.Minute
	}
	alg, signer, err := rawSigner(key)
	if err != nil {
		return nil, err
	}
	hdr, err := json.Marshal(map[string]string{"alg": alg, "kid": key.KeyID(), "typ": fencecheck.TokenType})
	if err != nil {
		return nil, fmt.Errorf("authz: token header: %w", err)
	}
	return &TokenIssuer{key: key, header: base64.RawURLEncoding.EncodeToString(hdr), signer: signer,
		public: pj, issuer: issuer, lifetime: lifetime, grace: grace}, nil
}

func isPrivate(k jwk.Key) bool { ok, err := jwk.IsPrivateKey(k); return err == nil && ok }

// KeyID names the signing key.
func (t *TokenIssuer) KeyID() string { return t.key.KeyID() }

// Lifetime is how long tokens live.
func (t *TokenIssuer) Lifetime() time.Duration { return t.lifetime }

// Publish keeps the public key published in store until ctx ends. Run it
// in its own goroutine; tokens are issued only while it is published.
func (t *TokenIssuer) Publish(ctx context.Context, store *lease.Store) {
	// Keep the key past the longest-lived token it signed.
	store.KeepPublished(ctx, t.key.KeyID(), t.public, t.lifetime+t.grace, t.published.Store)
}

// Published reports whether the public key is currently published, which
// is when tokens are issued.
func (t *TokenIssuer) Published() bool { return t.published.Load() }

// sign returns a signed dispatch token for claims, stamping iss, iat, nbf
// and exp from now.
func (t *TokenIssuer) sign(c fencecheck.Claims, now time.Time) (string, time.Time, error) {
	if !t.published.Load() {
		return "", time.Time{}, ErrSigningKeyUnpublished
	}
	exp := now.Add(t.lifetime)
	c.Issuer, c.IssuedAt, c.NotBefore, c.Expiry = t.issuer, now.Unix(), now.Unix(), exp.Unix()
	if err := c.Validate(); err != nil {
		return "", time.Time{}, fmt.Errorf("authz: token: %w", err)
	}
	payload, err := json.Marshal(c)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("authz: token: %w", err)
	}
	// A compact JWS (RFC 7515 §7.1), built directly: the header never
	// changes, and signing with the raw key avoids converting the JWK on
	// every admission. fencecheck and jwx verify it like any other.
	enc := base64.RawURLEncoding
	input := make([]byte, 0, len(t.header)+1+enc.EncodedLen(len(payload)))
	input = append(input, t.header...)
	input = append(input, '.')
	input = enc.AppendEncode(input, payload)
	sig, err := t.signer(input)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("authz: token: %w", err)
	}
	input = append(input, '.')
	input = enc.AppendEncode(input, sig)
	return string(input), time.Unix(exp.Unix(), 0).UTC(), nil
}

// rawSigner returns the JWS algorithm for key and a function signing with
// its raw private key: EdDSA for Ed25519, ES256 (r‖s, 64 bytes) for P-256;
// other kinds are refused (the algorithm allow-list).
func rawSigner(key jwk.Key) (string, func([]byte) ([]byte, error), error) {
	var raw any
	if err := key.Raw(&raw); err != nil {
		return "", nil, fmt.Errorf("authz: signing key: %w", err)
	}
	switch k := raw.(type) {
	case ed25519.PrivateKey:
		return "EdDSA", func(in []byte) ([]byte, error) { return ed25519.Sign(k, in), nil }, nil
	case *ecdsa.PrivateKey:
		if k.Curve != elliptic.P256() {
			break
		}
		return "ES256", func(in []byte) ([]byte, error) {
			sum := sha256.Sum256(in)
			r, s, err := ecdsa.Sign(rand.Reader, k, sum[:])
			if err != nil {
				return nil, err
			}
			sig := make([]byte, 64)
			r.FillBytes(sig[:32])
			s.FillBytes(sig[32:])
			return sig, nil
		}, nil
	}
	return "", nil, fmt.Errorf("authz: signing key of type %T is not allowed (use Ed25519 or P-256)", raw)
}
