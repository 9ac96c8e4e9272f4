package fencecheck

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwk"
	"github.com/lestrrat-go/jwx/v2/jws"
)

const (
	// DefaultMinRefreshInterval is the least time between two JWKS
	// fetches when MinRefreshInterval is zero.
	DefaultMinRefreshInterval = 10 * time.Second
	// DefaultMaxKeyAge is how long fetched keys are trusted without a
	// successful refetch when MaxKeyAge is zero.
	DefaultMaxKeyAge = 5 * time.Minute
	// keyFetchTimeout bounds one JWKS fetch, whatever the HTTP client.
	keyFetchTimeout = 10 * time.Second
	// maxJWKSBytes bounds a JWKS document.
	maxJWKSBytes = 1 << 20
)

// defaultHTTPClient fetches the JWKS when Verifier.HTTPClient is nil.
var defaultHTTPClient = &http.Client{Timeout: keyFetchTimeout}

// verifyKey is a trusted public key, ready for use: the one algorithm its
// kind allows, the raw key and jwx's verifier for that algorithm.
type verifyKey struct {
	alg      jwa.SignatureAlgorithm
	raw      crypto.PublicKey // ed25519.PublicKey or *ecdsa.PublicKey (P-256)
	verifier jws.Verifier
}

// keySet is an immutable snapshot of trusted keys by kid.
type keySet struct {
	keys    map[string]verifyKey
	fetched time.Time // when the fetch that produced it started
}

// ParseJWKS reads a JWK Set document (RFC 7517; a single JWK is read as a
// set of one) into trusted keys by kid, for [Verifier.Keys]: the keys a
// fetched JWKS would give. Keys without a kid, with a "use" other than
// "sig", of a kind other than Ed25519 or P-256, or whose "alg" does not
// fit their kind are skipped: they can never verify a dispatch token. A
// kid that appears twice is an error, since it no longer names one key.
// The result may be empty; a Verifier refuses an empty set as
// misconfigured.
func ParseJWKS(data []byte) (map[string]crypto.PublicKey, error) {
	ks, err := parseKeySet(data)
	if err != nil {
		return nil, err
	}
	keys := make(map[string]crypto.PublicKey, len(ks.keys))
	for kid, k := range ks.keys {
		keys[kid] = k.raw
	}
	return keys, nil
}

// parseKeySet is ParseJWKS into ready keys.
func parseKeySet(data []byte) (*keySet, error) {
	set, err := jwk.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("not a JWK set: %v", err)
	}
	ks := &keySet{keys: make(map[string]verifyKey, set.Len())}
	for i := 0; i < set.Len(); i++ {
		key, _ := set.Key(i)
		kid := key.KeyID()
		if kid == "" {
			continue
		}
		if _, dup := ks.keys[kid]; dup {
			return nil, fmt.Errorf("kid %q appears twice in the key set", kid)
		}
		vk, ok := jwkVerifyKey(key)
		if !ok {
			continue
		}
		ks.keys[kid] = vk
	}
	return ks, nil
}

// staticKeySet checks Verifier.Keys: every entry must be a key a dispatch
// token can be verified with, under a kid.
func staticKeySet(keys map[string]crypto.PublicKey) (*keySet, error) {
	ks := &keySet{keys: make(map[string]verifyKey, len(keys))}
	var errs []error
	for kid, pub := range keys {
		vk, ok := newVerifyKey(pub)
		switch {
		case kid == "":
			errs = append(errs, errors.New("Keys has a key without a kid"))
		case !ok:
			errs = append(errs, fmt.Errorf("Keys[%q] is a %T, not an Ed25519 or P-256 public key", kid, pub))
		default:
			ks.keys[kid] = vk
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return ks, nil
}

// jwkVerifyKey is newVerifyKey of a JWK, if its use and alg allow it.
func jwkVerifyKey(key jwk.Key) (verifyKey, bool) {
	if use := key.KeyUsage(); use != "" && use != "sig" {
		return verifyKey{}, false
	}
	pub, err := key.PublicKey()
	if err != nil {
		return verifyKey{}, false
	}
	var raw any
	if err := pub.Raw(&raw); err != nil {
		return verifyKey{}, false
	}
	vk, ok := newVerifyKey(raw)
	if a := key.Algorithm().String(); !ok || (a != "" && a != vk.alg.String()) {
		return verifyKey{}, false
	}
	return vk, true
}

// newVerifyKey readies an Ed25519 or P-256 public key; its kind decides
// its one algorithm.
func newVerifyKey(pub crypto.PublicKey) (verifyKey, bool) {
	var alg jwa.SignatureAlgorithm
	switch k := pub.(type) {
	case ed25519.PublicKey:
		if len(k) != ed25519.PublicKeySize {
			return verifyKey{}, false
		}
		alg = jwa.EdDSA
	case *ecdsa.PublicKey:
		if k == nil || k.Curve != elliptic.P256() {
			return verifyKey{}, false
		}
		if _, err := k.ECDH(); err != nil { // not a point on the curve
			return verifyKey{}, false
		}
		alg = jwa.ES256
	default:
		return verifyKey{}, false
	}
	v, err := jws.NewVerifier(alg)
	if err != nil {
		return verifyKey{}, false
	}
	return verifyKey{alg: alg, raw: pub, verifier: v}, true
}

// keyring finds trusted keys by kid, from a static set or a JWKS URL.
//
// Fetched keys are cached. A kid not in the cache, or a cache older than
// maxAge, triggers a refetch; refetches are rate-limited to one per
// minRefresh, and concurrent callers that need one share a single fetch.
type keyring struct {
	static *keySet // the static set, or nil for a JWKS URL

	url        string
	client     *http.Client
	minRefresh time.Duration
	maxAge     time.Duration
	now        func() time.Time

	cur atomic.Pointer[keySet] // the last fetched set, read without locking

	mu          sync.Mutex
	lastAttempt time.Time  // start of the last fetch
	lastErr     error      // its error
	inflight    *fetchCall // the fetch under way, if any
}

// fetchCall is one JWKS fetch that several callers may wait for.
type fetchCall struct {
	done chan struct{}
	err  error
}

// lookup returns the trusted key named kid, refreshing the JWKS at most
// once for this call.
func (k *keyring) lookup(ctx context.Context, kid string) (verifyKey, *RejectError) {
	if k.static != nil {
		if key, ok := k.static.keys[kid]; ok {
			return key, nil
		}
		return verifyKey{}, reject(ReasonUnknownKey, "kid %q is not in the key set", kid)
	}
	if s := k.cur.Load(); s != nil && k.fresh(s, k.now()) {
		if key, ok := s.keys[kid]; ok {
			return key, nil
		}
	}
	return k.refresh(ctx, kid)
}

func (k *keyring) fresh(s *keySet, now time.Time) bool {
	return now.Sub(s.fetched) <= k.maxAge
}

// refresh fetches the JWKS (or joins the fetch under way) unless the last
// fetch started less than minRefresh ago, then looks kid up again.
func (k *keyring) refresh(ctx context.Context, kid string) (verifyKey, *RejectError) {
	now := k.now()
	k.mu.Lock()
	call := k.inflight
	if call == nil {
		if !k.lastAttempt.IsZero() && now.Sub(k.lastAttempt) < k.minRefresh {
			err := k.lastErr
			k.mu.Unlock()
			return k.find(kid, now, err, true)
		}
		call = &fetchCall{done: make(chan struct{})}
		k.inflight = call
		k.lastAttempt = now
		k.mu.Unlock()

		k.lead(ctx, call, now)
	} else {
		k.mu.Unlock()
		select {
		case <-call.done:
		case <-ctx.Done():
			return verifyKey{}, reject(ReasonKeySource, "waiting for the JWKS: %v", ctx.Err())
		}
	}
	return k.find(kid, k.now(), call.err, false)
}

// lead runs the fetch that call stands for and publishes its result to
// everyone waiting on it, even if the fetch panics.
func (k *keyring) lead(ctx context.Context, call *fetchCall, now time.Time) {
	call.err = errors.New("key fetch did not complete")
	defer func() {
		k.mu.Lock()
		k.lastErr = call.err
		k.inflight = nil
		close(call.done)
		k.mu.Unlock()
	}()
	// The fetch serves every waiter, so the caller's cancellation must not
	// cut it short; keyFetchTimeout bounds it instead.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), keyFetchTimeout)
	defer cancel()
	set, err := k.fetch(fctx)
	if err == nil {
		set.fetched = now
		k.cur.Store(set)
	}
	call.err = err
}

// find looks kid up in the cached set after a refresh attempt whose error
// was fetchErr. Without a usable set the answer is ReasonKeySource: the
// verifier cannot tell an unknown key from an unreachable key source, so
// it fails closed.
func (k *keyring) find(kid string, now time.Time, fetchErr error, limited bool) (verifyKey, *RejectError) {
	s := k.cur.Load()
	if s != nil && k.fresh(s, now) {
		if key, ok := s.keys[kid]; ok {
			return key, nil
		}
	}
	switch {
	case fetchErr != nil:
		return verifyKey{}, reject(ReasonKeySource, "JWKS %s: %v", k.url, fetchErr)
	case s == nil || !k.fresh(s, now):
		return verifyKey{}, reject(ReasonKeySource, "JWKS %s: no keys younger than %s", k.url, k.maxAge)
	case limited:
		return verifyKey{}, reject(ReasonUnknownKey, "kid %q is not in the JWKS (next refresh within %s)", kid, k.minRefresh)
	}
	return verifyKey{}, reject(ReasonUnknownKey, "kid %q is not in the JWKS", kid)
}

func (k *keyring) fetch(ctx context.Context) (*keySet, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/jwk-set+json, application/json")
	resp, err := k.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("status %s", resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSBytes+1))
	if err != nil {
		return nil, err
	}
	if len(body) > maxJWKSBytes {
		return nil, errors.New("document larger than 1 MiB")
	}
	return parseKeySet(body)
}
