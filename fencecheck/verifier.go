package fencecheck

import (
	"context"
	"crypto"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/lestrrat-go/jwx/v2/jwa"
)

const (
	// DefaultSkew is the clock skew tolerated on exp, nbf and iat when
	// Skew is zero.
	DefaultSkew = 5 * time.Second
	// DefaultMaxLifetime is the longest exp-iat accepted when MaxLifetime
	// is zero. authzd issues tokens of seconds (30 s by default).
	DefaultMaxLifetime = 5 * time.Minute
	// MaxTokenBytes bounds the length of a token; a longer one is
	// malformed. Dispatch tokens are well under 2 KiB.
	MaxTokenBytes = 8 << 10
)

// Verifier verifies dispatch tokens at a backend's effect path: that a
// token was signed by a trusted key, names this backend (pool, artifact,
// configuration, generation), is within its lifetime, was issued for the
// very call received (tool and argument digest), and has not been used
// before.
//
// Set the fields, then use it; do not change or copy it after the first
// call. A Verifier is safe for concurrent use. Pool, Artifact, Config and
// one key source (Keys or JWKSURL) are required: without them every token
// is refused with [ReasonMisconfigured]. Every other field has a default
// at its zero value.
type Verifier struct {
	// Pool is this backend's pool: the only audience (aud) accepted.
	Pool string
	// Artifact identifies the code this backend runs, exactly as its
	// registration manifest names it (the digest when pinned, else the
	// image reference); fcd_artifact must equal it.
	Artifact string
	// Config is this backend's configuration digest; fcd_config must
	// equal it.
	Config string
	// Generation is this backend's generation in its pool; fcd_generation
	// must equal it. Zero is generation 0.
	Generation int64
	// Issuer, if not empty, is the only iss accepted. Empty accepts any
	// iss: trust then rests on the keys alone.
	Issuer string

	// Keys is a static set of trusted public keys by kid, each an
	// ed25519.PublicKey (verifying EdDSA) or a P-256 *ecdsa.PublicKey
	// (ES256): a key's kind is the one algorithm it verifies. [ParseJWKS]
	// reads them from a JWKS document. Exactly one of Keys and JWKSURL
	// must be set.
	Keys map[string]crypto.PublicKey
	// JWKSURL is the URL of authzd's JWKS (…/.well-known/jwks.json). The
	// set is fetched on first use and cached; an unknown kid, or keys
	// older than MaxKeyAge, trigger a refetch. If the JWKS cannot be
	// fetched the token is refused with [ReasonKeySource].
	JWKSURL string
	// HTTPClient fetches the JWKS; nil means a client with a 10 s
	// timeout. A fetch never takes longer than 10 s either way.
	HTTPClient *http.Client
	// MinRefreshInterval is the least time between two JWKS fetches, so
	// a flood of tokens with made-up kids costs at most one fetch per
	// interval; zero means [DefaultMinRefreshInterval]. Concurrent
	// lookups that need a fetch share one.
	MinRefreshInterval time.Duration
	// MaxKeyAge is how long fetched keys are used without a successful
	// refetch, so a key removed from the JWKS stops being trusted; zero
	// means [DefaultMaxKeyAge]. Past it, an unreachable JWKS fails
	// closed — which costs nothing, since authzd issues no tokens it
	// could not serve keys for.
	MaxKeyAge time.Duration

	// Skew is the clock skew tolerated on exp, nbf and iat; zero means
	// [DefaultSkew], a negative value no tolerance.
	Skew time.Duration
	// MaxLifetime is the longest exp-iat accepted; zero means
	// [DefaultMaxLifetime].
	MaxLifetime time.Duration

	// Claimer claims each accepted token's lease in fcd's ordered store
	// before the effect (online mode): at most one call runs per lease
	// across instances, restarts, re-admissions and long calls, and a
	// claim that cannot be made refuses the call (fail closed). Use a
	// [*LeaseClient]. Nil is offline mode: the local replay memory is the
	// only check, and tokens of leases admitted before Started are
	// refused — see the package README for what each mode guarantees.
	Claimer Claimer
	// Started is when this process started, for offline mode: a token
	// whose lease was admitted before Started plus the skew is refused
	// ([ReasonAdmittedBeforeStart]), since an earlier process may have
	// run it. Zero means the Verifier's first use.
	Started time.Time

	// Replay records the jti of every accepted token, as a fast first
	// check before the claim (and the only one in offline mode); nil
	// means a [MemoryReplay] of [DefaultReplayCapacity] owned by this
	// Verifier.
	Replay ReplayStore
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Tracer, when set, traces each verification (SpanVerify) and claim
	// (SpanClaim), and the reports of the middleware's Reporter
	// (SpanReport), and carries the trace to authzd; nil traces nothing.
	Tracer Tracer

	once    sync.Once
	setup   error // configuration error, fixed at first use
	keys    *keyring
	replay  ReplayStore
	started time.Time
}

// Validate reports a configuration that refuses every token: a missing
// Pool, Artifact, Config or key source, both key sources, or an unusable
// static key set. Call it at startup; Verify refuses with
// [ReasonMisconfigured] for the same causes.
func (v *Verifier) Validate() error {
	v.init()
	return v.setup
}

func (v *Verifier) init() {
	v.once.Do(func() {
		now := v.Now
		if now == nil {
			now = time.Now
		}
		var errs []error
		if v.Pool == "" {
			errs = append(errs, errors.New("Pool is required"))
		}
		if v.Artifact == "" {
			errs = append(errs, errors.New("Artifact is required"))
		}
		if v.Config == "" {
			errs = append(errs, errors.New("Config is required"))
		}
		if v.Generation < 0 {
			errs = append(errs, errors.New("Generation is negative"))
		}
		kr := &keyring{url: v.JWKSURL, client: v.HTTPClient, minRefresh: v.MinRefreshInterval, maxAge: v.MaxKeyAge, now: now}
		if kr.client == nil {
			kr.client = defaultHTTPClient
		}
		if kr.minRefresh <= 0 {
			kr.minRefresh = DefaultMinRefreshInterval
		}
		if kr.maxAge <= 0 {
			kr.maxAge = DefaultMaxKeyAge
		}
		switch {
		case v.Keys != nil && v.JWKSURL != "":
			errs = append(errs, errors.New("set Keys or JWKSURL, not both"))
		case v.Keys != nil:
			ks, err := staticKeySet(v.Keys)
			if err != nil {
				errs = append(errs, err)
			} else if len(ks.keys) == 0 {
				errs = append(errs, errors.New("Keys holds no usable key: no Ed25519 or P-256 key with a kid"))
			}
			kr.static = ks
		case v.JWKSURL != "":
			if !strings.HasPrefix(v.JWKSURL, "https://") && !strings.HasPrefix(v.JWKSURL, "http://") {
				errs = append(errs, errors.New("JWKSURL must be an http or https URL"))
			}
		default:
			errs = append(errs, errors.New("a key source is required: Keys or JWKSURL"))
		}
		v.keys = kr
		v.started = v.Started
		if v.started.IsZero() {
			v.started = now()
		}
		v.replay = v.Replay
		if v.replay == nil {
			v.replay = &MemoryReplay{Now: v.Now}
		}
		if len(errs) > 0 {
			v.setup = errors.Join(errs...)
		}
	})
}

func (v *Verifier) now() time.Time {
	if v.Now != nil {
		return v.Now()
	}
	return time.Now()
}

func (v *Verifier) skew() time.Duration {
	switch {
	case v.Skew == 0:
		return DefaultSkew
	case v.Skew < 0:
		return 0
	}
	return v.Skew
}

func (v *Verifier) maxLifetime() time.Duration {
	if v.MaxLifetime <= 0 {
		return DefaultMaxLifetime
	}
	return v.MaxLifetime
}

// b64 is the strict base64url decoding of JWS: no padding, no stray bits.
var b64 = base64.RawURLEncoding.Strict()

// Verify checks token for a call of tool ("server/tool") with arguments
// (the call's JSON object, as received) and returns its claims. A refusal
// is a [*RejectError]; its Reason is the first failing check, in this
// order: configuration, presence, JWS compact form and header, algorithm
// allow-list, typ, kid, key lookup, algorithm against the key's kind,
// signature, claims, iss, aud, exp, nbf, iat, lifetime, artifact, config,
// generation, tool, argument digest, admitted before start (offline mode
// only), replay, and the claim in authzd (online mode).
//
// The replay store and the claim come last, so that a token refused for
// any other reason — a forged one above all — never consumes its jti or
// its lease. In online mode the returned claims carry the ClaimID to
// report the outcome under.
func (v *Verifier) Verify(ctx context.Context, token string, tool string, arguments json.RawMessage) (*Claims, error) {
	c, rerr := v.verify(ctx, token, tool, arguments, false)
	if rerr != nil {
		return nil, rerr
	}
	return c, nil
}

// verify is Verify; read says the arguments come from ReadMessage, which
// proved them valid JSON without names that fold alike, so the digest
// does not check that again.
func (v *Verifier) verify(ctx context.Context, token string, tool string, arguments json.RawMessage, read bool) (_ *Claims, rerr *RejectError) {
	ctx, span := startSpan(withTracer(ctx, v.Tracer), SpanVerify)
	span.SetAttribute("fcd.tool", tool)
	defer func() {
		if rerr != nil {
			span.SetAttribute("fcd.reason", string(rerr.Reason))
			span.End(rerr)
			return
		}
		span.End(nil)
	}()
	c, rerr := v.verifyToken(ctx, token)
	if rerr != nil {
		return nil, rerr
	}
	span.SetAttribute("fcd.lease", c.ID)
	out, rerr := v.verifyCall(ctx, c, tool, arguments, read)
	if rerr != nil {
		rerr.Formation = c.Formation
	}
	return out, rerr
}

// verifyToken checks a token up to and including the generation: it is
// genuine, for this backend, and within its lifetime.
func (v *Verifier) verifyToken(ctx context.Context, token string) (_ *Claims, rerr *RejectError) {
	var verified *Claims // the claims, once the signature and their form held
	defer func() {
		if rerr != nil && verified != nil {
			rerr.Formation = verified.Formation
		}
	}()
	v.init()
	if v.setup != nil {
		return nil, reject(ReasonMisconfigured, "%v", v.setup)
	}
	if token == "" {
		return nil, reject(ReasonMissing, "no dispatch token")
	}

	// The JWS compact serialization: three base64url parts. A JSON
	// serialization, or anything else, is malformed.
	if len(token) > MaxTokenBytes {
		return nil, reject(ReasonMalformed, "token longer than %d bytes", MaxTokenBytes)
	}
	h64, rest, ok1 := strings.Cut(token, ".")
	p64, s64, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || strings.Contains(s64, ".") {
		return nil, reject(ReasonMalformed, "not a JWS compact serialization")
	}
	hdrJSON, err := b64.DecodeString(h64)
	if err != nil {
		return nil, reject(ReasonMalformed, "header is not base64url")
	}
	payload, err := b64.DecodeString(p64)
	if err != nil {
		return nil, reject(ReasonMalformed, "payload is not base64url")
	}
	sig, err := b64.DecodeString(s64)
	if err != nil {
		return nil, reject(ReasonMalformed, "signature is not base64url")
	}
	hdr, err := decodeHeader(hdrJSON)
	if err != nil {
		return nil, reject(ReasonMalformed, "protected header: %v", err)
	}

	alg := jwa.SignatureAlgorithm(hdr.alg)
	if alg != jwa.EdDSA && alg != jwa.ES256 {
		return nil, reject(ReasonAlgorithm, "algorithm %q is not allowed", hdr.alg)
	}
	if hdr.typ != TokenType {
		return nil, reject(ReasonType, "typ %q, want %q", hdr.typ, TokenType)
	}
	if hdr.kid == "" {
		return nil, reject(ReasonKeyID, "no kid in the protected header")
	}
	key, rerr := v.keys.lookup(ctx, hdr.kid)
	if rerr != nil {
		return nil, rerr
	}
	if key.alg != alg {
		return nil, reject(ReasonAlgorithm, "algorithm %s does not fit key %q (%s)", alg, hdr.kid, key.alg)
	}
	// The signing input is the first two parts exactly as received.
	if err := key.verifier.Verify([]byte(token[:len(h64)+1+len(p64)]), sig, key.raw); err != nil {
		return nil, reject(ReasonSignature, "signature does not verify with key %q", hdr.kid)
	}

	c, err := decodeClaims(payload)
	if err != nil {
		return nil, reject(ReasonClaims, "%v", err)
	}
	verified = c
	if v.Issuer != "" && c.Issuer != v.Issuer {
		return nil, reject(ReasonIssuer, "iss %q, want %q", c.Issuer, v.Issuer)
	}
	if c.Audience != v.Pool {
		return nil, reject(ReasonAudience, "aud %q, want %q", c.Audience, v.Pool)
	}

	now, skew := v.now(), v.skew()
	exp, nbf, iat := time.Unix(c.Expiry, 0), time.Unix(c.NotBefore, 0), time.Unix(c.IssuedAt, 0)
	if !now.Before(exp.Add(skew)) {
		return nil, reject(ReasonExpired, "expired at %s", exp.UTC().Format(time.RFC3339))
	}
	if now.Add(skew).Before(nbf) {
		return nil, reject(ReasonNotYetValid, "not valid before %s", nbf.UTC().Format(time.RFC3339))
	}
	if iat.After(now.Add(skew)) {
		return nil, reject(ReasonIssuedInFuture, "issued at %s, in the future", iat.UTC().Format(time.RFC3339))
	}
	if life := exp.Sub(iat); life <= 0 || life > v.maxLifetime() {
		return nil, reject(ReasonLifetime, "lifetime %s, allowed (0, %s]", life, v.maxLifetime())
	}

	// Epoch is informational here: the backend cannot know its epoch id
	// (the manifest digest), but artifact, config and generation pin what
	// it runs.
	if c.Artifact != v.Artifact {
		return nil, reject(ReasonArtifact, "fcd_artifact %q, this backend runs %q", c.Artifact, v.Artifact)
	}
	if c.Config != v.Config {
		return nil, reject(ReasonConfig, "fcd_config %q, this backend has %q", c.Config, v.Config)
	}
	if c.Generation != v.Generation {
		return nil, reject(ReasonGeneration, "fcd_generation %d, this backend is %d", c.Generation, v.Generation)
	}
	return c, nil
}

// verifyCall checks that a genuine token is for this call, and not used
// before (locally, then by its claim in authzd).
func (v *Verifier) verifyCall(ctx context.Context, c *Claims, tool string, arguments json.RawMessage, read bool) (*Claims, *RejectError) {
	skew := v.skew()
	exp := time.Unix(c.Expiry, 0)
	if tool != c.Tool {
		return nil, reject(ReasonTool, "call of %q, token for %q", tool, c.Tool)
	}
	digest, err := argumentDigest(tool, arguments, read)
	if err != nil {
		return nil, reject(ReasonArguments, "%v", err)
	}
	if digest != c.ArgumentDigest {
		return nil, reject(ReasonArguments, "argument digest %s, token for %s", digest, c.ArgumentDigest)
	}

	if v.Claimer == nil {
		// Offline: an earlier process may have run any token of a lease
		// admitted before this one started (within the clock skew).
		if admitted := time.UnixMilli(c.Admitted); admitted.Before(v.started.Add(skew)) {
			return c, reject(ReasonAdmittedBeforeStart, "lease admitted at %s, before this process started at %s (offline mode)",
				admitted.UTC().Format(time.RFC3339Nano), v.started.UTC().Format(time.RFC3339Nano))
		}
	}

	// Last: only a token that passed everything else may consume its jti.
	// It is remembered as long as it could pass the exp check.
	seen, err := v.replay.Seen(ctx, c.ID, exp.Add(skew))
	if err != nil {
		return nil, reject(ReasonReplayStore, "jti %q: %v", c.ID, err)
	}
	if seen {
		return nil, reject(ReasonReplay, "jti %q was used before", c.ID)
	}
	if v.Claimer == nil {
		return c, nil
	}
	id := newClaimID()
	cctx, span := startSpan(ctx, SpanClaim)
	span.SetAttribute("fcd.lease", c.ID)
	err = v.Claimer.Claim(cctx, c, id)
	span.End(err)
	switch {
	case err == nil:
		c.ClaimID = id
		return c, nil
	case errors.Is(err, ErrAlreadyClaimed):
		return nil, reject(ReasonReplay, "lease %q was claimed by another call", c.ID)
	case errors.Is(err, ErrLeaseGone):
		return nil, reject(ReasonLeaseClosed, "lease %q: %v", c.ID, err)
	default:
		// Nothing ran and nothing is known to be claimed: let a retry of
		// the same token through the local memory, to be decided by the
		// claim again.
		if f, ok := v.replay.(ReplayForgetter); ok {
			f.Forget(ctx, c.ID)
		}
		return nil, reject(ReasonClaimUnavailable, "lease %q: %v", c.ID, err)
	}
}
