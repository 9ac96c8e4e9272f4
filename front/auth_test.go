package front_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/front"
	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwk"
	"github.com/lestrrat-go/jwx/v2/jwt"
)

// issuer is an OAuth issuer's signing key, served as a JWKS over real
// HTTP.
type issuer struct {
	key  jwk.Key
	jwks string
}

func newIssuer(t *testing.T) *issuer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	key, err := jwk.FromRaw(priv)
	if err != nil {
		t.Fatal(err)
	}
	_ = key.Set(jwk.KeyIDKey, "idp-1")
	_ = key.Set(jwk.AlgorithmKey, jwa.EdDSA)
	pub, err := key.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	set := jwk.NewSet()
	_ = set.AddKey(pub)
	raw, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(raw)
	}))
	t.Cleanup(srv.Close)
	return &issuer{key: key, jwks: srv.URL}
}

// token signs claims with the issuer's key (or with key, if given).
func (i *issuer) token(t *testing.T, build func(*jwt.Builder) *jwt.Builder, opts ...jwt.SignOption) string {
	t.Helper()
	tok, err := build(jwt.NewBuilder()).Build()
	if err != nil {
		t.Fatal(err)
	}
	if len(opts) == 0 {
		opts = []jwt.SignOption{jwt.WithKey(jwa.EdDSA, i.key)}
	}
	signed, err := jwt.Sign(tok, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return string(signed)
}

// TestJWTAuthenticator: a token of the issuer, for the front's audience,
// in date, is its subject with the configured attributes; any other —
// another audience or issuer, expired, not yet valid, without kid, signed
// by another key or with an algorithm not allowed — is refused.
func TestJWTAuthenticator(t *testing.T) {
	idp := newIssuer(t)
	a, err := front.NewJWTAuthenticator(t.Context(), front.JWTAuthenticator{Issuer: "https://idp.test", Audience: "https://front.test/mcp",
		JWKSURL: idp.jwks, AttributeClaims: []string{"groups"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	good := func(b *jwt.Builder) *jwt.Builder {
		return b.Issuer("https://idp.test").Audience([]string{"https://front.test/mcp"}).Subject("alice").
			IssuedAt(now).Expiration(now.Add(time.Hour)).Claim("groups", []string{"dev"}).Claim("scope", "mcp tools")
	}
	p, err := a.Authenticate(t.Context(), idp.token(t, good))
	if err != nil {
		t.Fatal(err)
	}
	if p.ID != "alice" || len(p.Scopes) != 2 || p.Attributes["groups"] == nil || p.Expires.IsZero() {
		t.Fatalf("principal %+v", p)
	}

	_, otherPriv, _ := ed25519.GenerateKey(rand.Reader)
	other, _ := jwk.FromRaw(otherPriv)
	_ = other.Set(jwk.KeyIDKey, "idp-1") // the issuer's kid, another key
	noKid, _ := jwk.FromRaw(otherPriv)
	ecPriv, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ecKey, _ := jwk.FromRaw(ecPriv)
	_ = ecKey.Set(jwk.KeyIDKey, "idp-1")
	hsKey, _ := jwk.FromRaw([]byte("a shared secret of thirty-two b!"))
	_ = hsKey.Set(jwk.KeyIDKey, "idp-1")
	for name, tok := range map[string]string{
		"another audience": idp.token(t, func(b *jwt.Builder) *jwt.Builder { return good(b).Audience([]string{"https://other.test/mcp"}) }),
		"another issuer":   idp.token(t, func(b *jwt.Builder) *jwt.Builder { return good(b).Issuer("https://evil.test") }),
		"expired":          idp.token(t, func(b *jwt.Builder) *jwt.Builder { return good(b).Expiration(now.Add(-time.Hour)) }),
		"not yet valid":    idp.token(t, func(b *jwt.Builder) *jwt.Builder { return good(b).NotBefore(now.Add(time.Hour)) }),
		"no expiry": idp.token(t, func(b *jwt.Builder) *jwt.Builder {
			return jwt.NewBuilder().Issuer("https://idp.test").Audience([]string{"https://front.test/mcp"}).Subject("alice")
		}),
		"no subject": idp.token(t, func(b *jwt.Builder) *jwt.Builder {
			return jwt.NewBuilder().Issuer("https://idp.test").Audience([]string{"https://front.test/mcp"}).Expiration(now.Add(time.Hour))
		}),
		"another key":  idp.token(t, good, jwt.WithKey(jwa.EdDSA, other)),
		"no kid":       idp.token(t, good, jwt.WithKey(jwa.EdDSA, noKid)),
		"another alg":  idp.token(t, good, jwt.WithKey(jwa.ES256, ecKey)),
		"HS256":        idp.token(t, good, jwt.WithKey(jwa.HS256, hsKey)),
		"unsigned":     unsigned(t, good),
		"not a JWT":    "alice",
		"empty string": "",
	} {
		if _, err := a.Authenticate(t.Context(), tok); !errors.Is(err, front.ErrUnauthenticated) {
			t.Errorf("%s: %v, want ErrUnauthenticated", name, err)
		}
	}
}

func unsigned(t *testing.T, build func(*jwt.Builder) *jwt.Builder) string {
	t.Helper()
	tok, err := build(jwt.NewBuilder()).Build()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := jwt.Sign(tok, jwt.WithInsecureNoSignature())
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

func TestStaticTokens(t *testing.T) {
	st := front.StaticTokens{"s3cret": {ID: "alice"}}
	if p, err := st.Authenticate(context.Background(), "s3cret"); err != nil || p.ID != "alice" {
		t.Fatalf("%+v %v", p, err)
	}
	for _, tok := range []string{"", "s3cre", "s3cret ", "S3CRET"} {
		if _, err := st.Authenticate(context.Background(), tok); !errors.Is(err, front.ErrUnauthenticated) {
			t.Errorf("%q: %v", tok, err)
		}
	}
}
