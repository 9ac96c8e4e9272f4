package front

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwk"
	"github.com/lestrrat-go/jwx/v2/jws"
	"github.com/lestrrat-go/jwx/v2/jwt"
	"github.com/modelcontextprotocol/go-sdk/auth"
)

// ErrUnauthenticated is the cause of every refused bearer token; the
// client is told only that its token is invalid.
var ErrUnauthenticated = errors.New("front: the bearer token is not valid")

// Principal is who a client session calls tools as: the formations'
// principal, what the policies see.
type Principal struct {
	// ID is the principal's id.
	ID string
	// Attributes are the claims the policies may use (groups, department…).
	Attributes map[string]any
	// Expires is when the credential stops being valid; zero means never
	// (static development tokens only).
	Expires time.Time
	// Scopes are the OAuth scopes the token grants.
	Scopes []string
}

// Authenticator turns a bearer token into its principal. A token that is
// not valid is an error wrapping [ErrUnauthenticated]; its text is logged,
// never sent to the client.
type Authenticator interface {
	Authenticate(ctx context.Context, token string) (Principal, error)
}

// JWTAuthenticator accepts JWTs signed by a key of an issuer's JWKS, for
// one audience: the bearer tokens of MCP's authorization specification,
// which a resource server must check were issued for it (RFC 8707).
type JWTAuthenticator struct {
	// Issuer is the only iss accepted. Required.
	Issuer string
	// Audience is the only aud accepted: the front's resource identifier.
	// Required.
	Audience string
	// JWKSURL is the issuer's key set. Required.
	JWKSURL string
	// PrincipalClaim names the claim that is the principal's id; empty
	// means "sub".
	PrincipalClaim string
	// AttributeClaims are the claims copied into the principal's
	// attributes, under their own names (e.g. "groups").
	AttributeClaims []string
	// Skew is the clock skew tolerated on exp, nbf and iat; zero means
	// 30 s.
	Skew time.Duration

	keys *jwk.Cache
}

// Algorithms are the only JWS algorithms a JWTAuthenticator accepts; a
// token signed otherwise (none, HS256 with a public key…) is refused.
var algorithms = []jwa.SignatureAlgorithm{jwa.RS256, jwa.PS256, jwa.ES256, jwa.EdDSA}

// NewJWTAuthenticator checks a and starts caching the issuer's keys; the
// cache is refreshed in the background until ctx ends.
func NewJWTAuthenticator(ctx context.Context, a JWTAuthenticator, hc *http.Client) (*JWTAuthenticator, error) {
	if a.Issuer == "" || a.Audience == "" || a.JWKSURL == "" {
		return nil, errors.New("front: a JWT authenticator needs Issuer, Audience and JWKSURL")
	}
	if a.PrincipalClaim == "" {
		a.PrincipalClaim = "sub"
	}
	if a.Skew == 0 {
		a.Skew = 30 * time.Second
	}
	if hc == nil {
		hc = &http.Client{Timeout: 10 * time.Second}
	}
	a.keys = jwk.NewCache(ctx)
	if err := a.keys.Register(a.JWKSURL, jwk.WithHTTPClient(hc), jwk.WithMinRefreshInterval(time.Minute)); err != nil {
		return nil, fmt.Errorf("front: the issuer's JWKS %s: %w", a.JWKSURL, err)
	}
	return &a, nil
}

// Authenticate verifies the token's signature with the issuer's keys (kid
// required, an allowed algorithm that fits the key), then iss, aud, exp,
// nbf and iat, and reads the principal.
func (a *JWTAuthenticator) Authenticate(ctx context.Context, token string) (Principal, error) {
	if err := checkHeader(token); err != nil {
		return Principal{}, err
	}
	keys, err := a.keys.Get(ctx, a.JWKSURL)
	if err != nil {
		return Principal{}, fmt.Errorf("%w: the issuer's keys: %v", ErrUnauthenticated, err)
	}
	tok, err := jwt.ParseString(token,
		jwt.WithKeySet(keys, jws.WithRequireKid(true), jws.WithInferAlgorithmFromKey(true)), jwt.WithValidate(true),
		jwt.WithIssuer(a.Issuer), jwt.WithAudience(a.Audience), jwt.WithAcceptableSkew(a.Skew),
		jwt.WithRequiredClaim("exp"))
	if err != nil {
		return Principal{}, fmt.Errorf("%w: %v", ErrUnauthenticated, err)
	}
	claims, err := tok.AsMap(ctx)
	if err != nil {
		return Principal{}, fmt.Errorf("%w: %v", ErrUnauthenticated, err)
	}
	id, _ := claims[a.PrincipalClaim].(string)
	if id == "" {
		return Principal{}, fmt.Errorf("%w: claim %q is not a non-empty string", ErrUnauthenticated, a.PrincipalClaim)
	}
	p := Principal{ID: id, Expires: tok.Expiration()}
	for _, c := range a.AttributeClaims {
		if v, ok := claims[c]; ok {
			if p.Attributes == nil {
				p.Attributes = map[string]any{}
			}
			p.Attributes[c] = v
		}
	}
	if s, ok := claims["scope"].(string); ok {
		p.Scopes = strings.Fields(s)
	}
	return p, nil
}

// checkHeader refuses, before any key is looked up, a token that is not
// one compact JWS with an allowed alg and a kid.
func checkHeader(token string) error {
	msg, err := jws.ParseString(token)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnauthenticated, err)
	}
	sigs := msg.Signatures()
	if len(sigs) != 1 {
		return fmt.Errorf("%w: %d signatures, want one", ErrUnauthenticated, len(sigs))
	}
	h := sigs[0].ProtectedHeaders()
	if !slices.Contains(algorithms, h.Algorithm()) {
		return fmt.Errorf("%w: algorithm %q is not allowed", ErrUnauthenticated, h.Algorithm())
	}
	if h.KeyID() == "" {
		return fmt.Errorf("%w: no kid", ErrUnauthenticated)
	}
	return nil
}

// StaticTokens authenticates fixed bearer tokens, for development and
// tests: token → principal. Tokens are compared in constant time.
type StaticTokens map[string]Principal

// Authenticate finds the token's principal.
func (s StaticTokens) Authenticate(_ context.Context, token string) (Principal, error) {
	got := sha256.Sum256([]byte(token))
	var found *Principal
	for t, p := range s {
		want := sha256.Sum256([]byte(t))
		if subtle.ConstantTimeCompare(got[:], want[:]) == 1 {
			found = &p
		}
	}
	if found == nil {
		return Principal{}, fmt.Errorf("%w: not a known static token", ErrUnauthenticated)
	}
	return *found, nil
}

// principalKey is where a session's principal is kept in the SDK's
// TokenInfo.
const principalKey = "fcd.principal"

// verifier adapts an Authenticator to the SDK's bearer middleware: the
// SDK refuses a missing, invalid or expired token with 401 and a
// WWW-Authenticate header naming the resource metadata, and binds each
// session to its user (a session id used by another user is refused).
func verifier(a Authenticator) auth.TokenVerifier {
	return func(ctx context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		p, err := a.Authenticate(ctx, token)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", auth.ErrInvalidToken, err)
		}
		exp := p.Expires
		if exp.IsZero() {
			exp = time.Now().Add(24 * time.Hour) // static tokens: the middleware needs one
		}
		return &auth.TokenInfo{UserID: p.ID, Scopes: slices.Clone(p.Scopes), Expiration: exp,
			Extra: map[string]any{principalKey: p}}, nil
	}
}

// principalOf reads the principal the bearer middleware authenticated.
func principalOf(ti *auth.TokenInfo) (Principal, bool) {
	if ti == nil {
		return Principal{}, false
	}
	p, ok := ti.Extra[principalKey].(Principal)
	return p, ok
}
