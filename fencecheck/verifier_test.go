package fencecheck_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/fencecheck/fencechecktest"
	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jws"
)

// call is what a backend received: the tool and its arguments.
type call struct{ tool, args string }

var theCall = call{testTool, testArgs}

// TestVerifyAttackCorpus runs the RFC 8725 attacks (and fcd's own binding
// checks) against a verifier, for each signing algorithm. Every attack
// must be refused with its own reason; the two well-formed rows pass.
func TestVerifyAttackCorpus(t *testing.T) {
	for _, alg := range []jwa.SignatureAlgorithm{jwa.EdDSA, jwa.ES256} {
		t.Run(alg.String(), func(t *testing.T) { attackCorpus(t, alg) })
	}
}

func attackCorpus(t *testing.T, alg jwa.SignatureAlgorithm) {
	key := fencechecktest.NewKey(alg.String(), "authzd-1")
	other := jwa.ES256 // a trusted key of the other kind
	if alg == jwa.ES256 {
		other = jwa.EdDSA
	}
	otherKey := fencechecktest.NewKey(other.String(), "authzd-2")
	attacker := fencechecktest.NewKey(alg.String(), "authzd-1") // same kid, not trusted
	set := fencechecktest.Keys(key, otherKey)

	// The trusted public key as an attacker would find it: its raw bytes
	// and its PEM encoding, to be used as an HMAC secret.
	rawPub := key.Public()
	der, err := x509.MarshalPKIXPublicKey(rawPub)
	if err != nil {
		t.Fatal(err)
	}
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	pubBytes := der
	if ed, ok := rawPub.(ed25519.PublicKey); ok {
		pubBytes = ed
	}

	hdr := func(kv ...any) map[string]any {
		m := map[string]any{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	std := hdr(jws.TypeKey, fencecheck.TokenType, jws.KeyIDKey, "authzd-1")
	with := func(edit func(c *fencecheck.Claims)) func(t *testing.T) string {
		return func(t *testing.T) string {
			c := validClaims(t)
			edit(&c)
			return key.Issue(c)
		}
	}
	b64 := base64.RawURLEncoding.EncodeToString

	cases := []struct {
		note  string
		token func(t *testing.T) string
		call  call
		// prepare runs before the verification under test, with the
		// token it will verify.
		prepare func(t *testing.T, v *fencecheck.Verifier, token string)
		want    fencecheck.Reason // "" accepts
	}{
		{note: "valid token", token: with(func(*fencecheck.Claims) {})},
		{note: "a recovery's token (fcd_recovery_of)", token: with(func(c *fencecheck.Claims) { c.RecoveryOf = "fm_first" })},
		{note: "signed the way authzd signs (jwx with the private JWK, as manifest.Sign)", token: func(t *testing.T) string {
			h := jws.NewHeaders()
			_ = h.Set(jws.TypeKey, fencecheck.TokenType)
			_ = h.Set(jws.KeyIDKey, key.KID)
			payload, _ := json.Marshal(validClaims(t))
			out, err := jws.Sign(payload, jws.WithKey(alg, privateJWK(t, key), jws.WithProtectedHeaders(h)))
			if err != nil {
				t.Fatal(err)
			}
			return string(out)
		}},
		{note: "same arguments in another key order pass", token: with(func(*fencecheck.Claims) {}),
			call: call{testTool, "{\"topics\": [\"finance\", \"exports\"],\n \"private\": true, \"name\": \"payroll-exports\"}"}},

		// Not a JWS compact serialization, or not one fcd issues.
		{note: "no token", token: func(*testing.T) string { return "" }, want: fencecheck.ReasonMissing},
		{note: "JWS JSON serialization", want: fencecheck.ReasonMalformed, token: func(t *testing.T) string {
			h := jws.NewHeaders()
			_ = h.Set(jws.TypeKey, fencecheck.TokenType)
			_ = h.Set(jws.KeyIDKey, "authzd-1")
			payload, _ := json.Marshal(validClaims(t))
			out, err := jws.Sign(payload, jws.WithJSON(), jws.WithKey(alg, privateJWK(t, key), jws.WithProtectedHeaders(h)))
			if err != nil {
				t.Fatal(err)
			}
			return string(out)
		}},
		{note: "two parts", want: fencecheck.ReasonMalformed, token: func(t *testing.T) string {
			tok := key.Issue(validClaims(t))
			return tok[:strings.LastIndex(tok, ".")]
		}},
		{note: "base64 padding", want: fencecheck.ReasonMalformed, token: func(t *testing.T) string {
			return key.Issue(validClaims(t)) + "=="
		}},
		{note: "header member beyond alg typ kid (jku)", want: fencecheck.ReasonMalformed, token: func(t *testing.T) string {
			return signJWS(t, alg, key.Private, hdr(jws.TypeKey, fencecheck.TokenType, jws.KeyIDKey, "authzd-1",
				jws.JWKSetURLKey, "https://attacker.test/jwks.json"), validClaims(t))
		}},
		{note: "crit header", want: fencecheck.ReasonMalformed, token: func(t *testing.T) string {
			return signJWS(t, alg, key.Private, hdr(jws.TypeKey, fencecheck.TokenType, jws.KeyIDKey, "authzd-1",
				jws.CriticalKey, []string{"exp"}), validClaims(t))
		}},

		// Algorithm confusion.
		{note: "alg none", want: fencecheck.ReasonAlgorithm, token: func(t *testing.T) string {
			h, _ := json.Marshal(map[string]string{"alg": "none", "typ": fencecheck.TokenType, "kid": "authzd-1"})
			p, _ := json.Marshal(validClaims(t))
			return b64(h) + "." + b64(p) + "."
		}},
		{note: "HS256 keyed with the public key's raw bytes", want: fencecheck.ReasonAlgorithm, token: func(t *testing.T) string {
			return signJWS(t, jwa.HS256, []byte(pubBytes), std, validClaims(t))
		}},
		{note: "HS256 keyed with the public key's PEM", want: fencecheck.ReasonAlgorithm, token: func(t *testing.T) string {
			return signJWS(t, jwa.HS256, pubPEM, std, validClaims(t))
		}},
		{note: "alg of the other trusted key's kind", want: fencecheck.ReasonAlgorithm, token: func(t *testing.T) string {
			// Signed correctly by authzd-2 but naming authzd-1.
			return signJWS(t, other, otherKey.Private, std, validClaims(t))
		}},

		// Explicit typing.
		{note: "typ JWT", want: fencecheck.ReasonType, token: func(t *testing.T) string {
			return signJWS(t, alg, key.Private, hdr(jws.TypeKey, "JWT", jws.KeyIDKey, "authzd-1"), validClaims(t))
		}},
		{note: "no typ", want: fencecheck.ReasonType, token: func(t *testing.T) string {
			return signJWS(t, alg, key.Private, hdr(jws.KeyIDKey, "authzd-1"), validClaims(t))
		}},

		// Key selection.
		{note: "missing kid", want: fencecheck.ReasonKeyID, token: func(t *testing.T) string {
			return signJWS(t, alg, key.Private, hdr(jws.TypeKey, fencecheck.TokenType), validClaims(t))
		}},
		{note: "unknown kid", want: fencecheck.ReasonUnknownKey, token: func(t *testing.T) string {
			return signJWS(t, alg, key.Private, hdr(jws.TypeKey, fencecheck.TokenType, jws.KeyIDKey, "authzd-9"), validClaims(t))
		}},

		// Integrity.
		{note: "signed by another key under a trusted kid", want: fencecheck.ReasonSignature, token: func(t *testing.T) string {
			return attacker.Issue(validClaims(t))
		}},
		{note: "tampered payload", want: fencecheck.ReasonSignature, token: func(t *testing.T) string {
			tok := key.Issue(validClaims(t))
			parts := strings.Split(tok, ".")
			c := validClaims(t)
			c.Generation = testGen + 1
			p, _ := json.Marshal(c)
			return parts[0] + "." + b64(p) + "." + parts[2]
		}},
		{note: "tampered signature", want: fencecheck.ReasonSignature, token: func(t *testing.T) string {
			tok := key.Issue(validClaims(t))
			parts := strings.Split(tok, ".")
			sig, _ := base64.RawURLEncoding.DecodeString(parts[2])
			sig[len(sig)/2] ^= 0x01
			return parts[0] + "." + parts[1] + "." + b64(sig)
		}},

		// The claim set itself.
		{note: "unknown extra claim", want: fencecheck.ReasonClaims, token: func(t *testing.T) string {
			m := claimsMap(t, validClaims(t))
			m["fcd_scope"] = "admin"
			return key.Issue(m)
		}},
		{note: "missing required claim", want: fencecheck.ReasonClaims, token: func(t *testing.T) string {
			m := claimsMap(t, validClaims(t))
			delete(m, "fcd_generation")
			return key.Issue(m)
		}},
		{note: "empty required claim", want: fencecheck.ReasonClaims, token: with(func(c *fencecheck.Claims) { c.Cluster = "" })},
		{note: "duplicate claim", want: fencecheck.ReasonClaims, token: func(t *testing.T) string {
			p, _ := json.Marshal(validClaims(t))
			p = append(p[:len(p)-1], `,"aud":"other-pool"}`...)
			return key.Issue(p)
		}},
		{note: "claim name in another case", want: fencecheck.ReasonClaims, token: func(t *testing.T) string {
			m := claimsMap(t, validClaims(t))
			m["AUD"] = m["aud"]
			delete(m, "aud")
			return key.Issue(m)
		}},
		{note: "missing fcd_admitted", want: fencecheck.ReasonClaims, token: func(t *testing.T) string {
			m := claimsMap(t, validClaims(t))
			delete(m, "fcd_admitted")
			return key.Issue(m)
		}},
		{note: "zero fcd_admitted", want: fencecheck.ReasonClaims, token: with(func(c *fencecheck.Claims) { c.Admitted = 0 })},
		{note: "empty fcd_recovery_of", want: fencecheck.ReasonClaims, token: func(t *testing.T) string {
			m := claimsMap(t, validClaims(t))
			m["fcd_recovery_of"] = ""
			return key.Issue(m)
		}},
		{note: "fcd_recovery_of a number", want: fencecheck.ReasonClaims, token: func(t *testing.T) string {
			m := claimsMap(t, validClaims(t))
			m["fcd_recovery_of"] = 7
			return key.Issue(m)
		}},
		{note: "fcd_admitted in seconds with a fraction", want: fencecheck.ReasonClaims, token: func(t *testing.T) string {
			m := claimsMap(t, validClaims(t))
			m["fcd_admitted"] = float64(testEpoch.Unix()) + 0.5
			return key.Issue(m)
		}},
		{note: "claim of the wrong type", want: fencecheck.ReasonClaims, token: func(t *testing.T) string {
			m := claimsMap(t, validClaims(t))
			m["aud"] = []string{testPool}
			return key.Issue(m)
		}},

		// Who and when.
		{note: "wrong iss", want: fencecheck.ReasonIssuer, token: with(func(c *fencecheck.Claims) { c.Issuer = "https://attacker.test" })},
		{note: "token for another pool (aud)", want: fencecheck.ReasonAudience, token: with(func(c *fencecheck.Claims) { c.Audience = "github-canary" })},
		{note: "expired", want: fencecheck.ReasonExpired, token: with(func(c *fencecheck.Claims) {
			c.IssuedAt, c.NotBefore, c.Expiry = c.IssuedAt-60, c.NotBefore-60, c.IssuedAt-5
		})},
		{note: "expired within the skew passes", token: with(func(c *fencecheck.Claims) {
			c.IssuedAt, c.NotBefore, c.Expiry = c.IssuedAt-30, c.NotBefore-30, c.IssuedAt-4
		})},
		{note: "nbf in the future", want: fencecheck.ReasonNotYetValid, token: with(func(c *fencecheck.Claims) {
			c.NotBefore, c.Expiry = c.NotBefore+20, c.Expiry+20
		})},
		{note: "iat in the future", want: fencecheck.ReasonIssuedInFuture, token: with(func(c *fencecheck.Claims) {
			c.IssuedAt = c.IssuedAt + 20
		})},
		{note: "lifetime too long", want: fencecheck.ReasonLifetime, token: with(func(c *fencecheck.Claims) {
			c.Expiry = c.IssuedAt + int64((time.Hour).Seconds())
		})},
		{note: "exp before iat", want: fencecheck.ReasonLifetime, token: with(func(c *fencecheck.Claims) {
			// iat within the skew ahead, exp still ahead, but before iat.
			c.IssuedAt, c.Expiry = testEpoch.Unix()+4, testEpoch.Unix()+3
		})},

		// What this backend runs.
		{note: "token for another artifact", want: fencecheck.ReasonArtifact, token: with(func(c *fencecheck.Claims) { c.Artifact = "sha256:9999" })},
		{note: "token for another config", want: fencecheck.ReasonConfig, token: with(func(c *fencecheck.Claims) { c.Config = "sha256:8888" })},
		{note: "token for another generation", want: fencecheck.ReasonGeneration, token: with(func(c *fencecheck.Claims) { c.Generation = testGen - 1 })},

		// The call actually received.
		{note: "another tool", want: fencecheck.ReasonTool, token: with(func(*fencecheck.Claims) {}),
			call: call{"github/delete_repository", testArgs}},
		{note: "arguments differing by one value", want: fencecheck.ReasonArguments, token: with(func(*fencecheck.Claims) {}),
			call: call{testTool, `{"name":"payroll-exports","private":false,"topics":["finance","exports"]}`}},
		{note: "an extra argument field", want: fencecheck.ReasonArguments, token: with(func(*fencecheck.Claims) {}),
			call: call{testTool, `{"name":"payroll-exports","private":true,"topics":["finance","exports"],"visibility":"public"}`}},
		{note: "arguments with a duplicate member", want: fencecheck.ReasonArguments, token: with(func(*fencecheck.Claims) {}),
			call: call{testTool, `{"name":"payroll-exports","private":true,"topics":["finance","exports"],"private":false}`}},

		// Offline mode: leases admitted before this process started.
		{note: "lease admitted before the process started", want: fencecheck.ReasonAdmittedBeforeStart,
			token: with(func(c *fencecheck.Claims) { c.Admitted = testStarted.Add(-time.Millisecond).UnixMilli() })},

		// Replay.
		{note: "replayed jti", want: fencecheck.ReasonReplay, token: with(func(*fencecheck.Claims) {}),
			prepare: func(t *testing.T, v *fencecheck.Verifier, token string) {
				if _, err := v.Verify(context.Background(), token, testTool, json.RawMessage(testArgs)); err != nil {
					t.Fatalf("first use: %v", err)
				}
			}},
		{note: "a new token reusing an accepted jti", want: fencecheck.ReasonReplay,
			token: with(func(c *fencecheck.Claims) { c.ID = "lease-reused" }),
			prepare: func(t *testing.T, v *fencecheck.Verifier, _ string) {
				c := validClaims(t)
				c.ID = "lease-reused"
				c.Formation = "formation-0"
				if _, err := v.Verify(context.Background(), key.Issue(c), testTool, json.RawMessage(testArgs)); err != nil {
					t.Fatalf("first use: %v", err)
				}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.note, func(t *testing.T) {
			v := newVerifier(set)
			token := tc.token(t)
			if tc.prepare != nil {
				tc.prepare(t, v, token)
			}
			c := tc.call
			if c.tool == "" {
				c = theCall
			}
			claims, err := v.Verify(context.Background(), token, c.tool, json.RawMessage(c.args))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if claims.Tool != testTool || claims.Audience != testPool {
					t.Fatalf("claims = %+v", claims)
				}
				if want := claims.Formation; claims.RecoveryOf != "" {
					if claims.RecoveryOf != "fm_first" || claims.IdempotencyKey() != "fm_first" {
						t.Fatalf("recovery claims = %+v", claims)
					}
				} else if claims.IdempotencyKey() != want {
					t.Fatalf("idempotency key %q, want the formation %q", claims.IdempotencyKey(), want)
				}
				return
			}
			var re *fencecheck.RejectError
			if !errors.As(err, &re) {
				t.Fatalf("err = %v, want a *RejectError with reason %s", err, tc.want)
			}
			if re.Reason != tc.want {
				t.Fatalf("reason = %s (%s), want %s", re.Reason, re.Detail, tc.want)
			}
			if claims != nil {
				t.Fatal("claims returned with an error")
			}
			if strings.Contains(re.Error(), token) && token != "" {
				t.Fatal("the error holds the token")
			}
		})
	}
}

// TestRejectedTokenKeepsJTI: a token refused for any reason before the
// replay check does not consume its jti, so a forged or misdirected copy
// cannot burn the genuine call.
func TestRejectedTokenKeepsJTI(t *testing.T) {
	key := fencechecktest.NewKey(fencechecktest.EdDSA, "authzd-1")
	forger := fencechecktest.NewKey(fencechecktest.EdDSA, "authzd-1")
	v := newVerifier(fencechecktest.Keys(key))
	ctx := context.Background()
	c := validClaims(t)
	genuine := key.Issue(c)
	forged := forger.Issue(c)

	for _, attempt := range []struct {
		token, args string
		want        fencecheck.Reason
	}{
		{forged, testArgs, fencecheck.ReasonSignature},
		{genuine, `{"name":"x"}`, fencecheck.ReasonArguments},
	} {
		_, err := v.Verify(ctx, attempt.token, testTool, json.RawMessage(attempt.args))
		if got := fencecheck.ReasonOf(err); got != attempt.want {
			t.Fatalf("reason = %q (%v), want %s", got, err, attempt.want)
		}
	}
	if _, err := v.Verify(ctx, genuine, testTool, json.RawMessage(testArgs)); err != nil {
		t.Fatalf("the genuine call was refused after the attempts: %v", err)
	}
	if _, err := v.Verify(ctx, genuine, testTool, json.RawMessage(testArgs)); fencecheck.ReasonOf(err) != fencecheck.ReasonReplay {
		t.Fatalf("second use: %v, want replay", err)
	}
}

func TestVerifierConfiguration(t *testing.T) {
	key := fencechecktest.NewKey(fencechecktest.EdDSA, "authzd-1")
	set := fencechecktest.Keys(key)
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		note string
		v    *fencecheck.Verifier
		want string // substring of Validate's error; "" is valid
	}{
		{"complete", newVerifier(set), ""},
		{"zero value", &fencecheck.Verifier{}, "Pool is required"},
		{"no key source", &fencecheck.Verifier{Pool: "p", Artifact: "a", Config: "c"}, "key source"},
		{"both key sources", &fencecheck.Verifier{Pool: "p", Artifact: "a", Config: "c", Keys: set, JWKSURL: "http://x/jwks"}, "not both"},
		{"no usable key", &fencecheck.Verifier{Pool: "p", Artifact: "a", Config: "c", Keys: fencechecktest.Keys()}, "no usable"},
		{"a private key", &fencecheck.Verifier{Pool: "p", Artifact: "a", Config: "c",
			Keys: map[string]crypto.PublicKey{"authzd-1": key.Private}}, "not an Ed25519 or P-256 public key"},
		{"a P-384 key", &fencecheck.Verifier{Pool: "p", Artifact: "a", Config: "c",
			Keys: map[string]crypto.PublicKey{"authzd-1": &p384.PublicKey}}, "not an Ed25519 or P-256 public key"},
		{"a key without a kid", &fencecheck.Verifier{Pool: "p", Artifact: "a", Config: "c",
			Keys: map[string]crypto.PublicKey{"": key.Public()}}, "without a kid"},
		{"JWKS URL not http", &fencecheck.Verifier{Pool: "p", Artifact: "a", Config: "c", JWKSURL: "file:///etc/jwks"}, "http"},
	}
	for _, tc := range cases {
		t.Run(tc.note, func(t *testing.T) {
			err := tc.v.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want %q", err, tc.want)
			}
			_, err = tc.v.Verify(context.Background(), key.Issue(validClaims(t)), testTool, json.RawMessage(testArgs))
			if got := fencecheck.ReasonOf(err); got != fencecheck.ReasonMisconfigured {
				t.Fatalf("Verify reason = %q, want %s", got, fencecheck.ReasonMisconfigured)
			}
		})
	}
}

// TestVerifyReplayStoreFull: a store that cannot record the jti refuses
// the token rather than accept it unrecorded.
func TestVerifyReplayStoreFull(t *testing.T) {
	key := fencechecktest.NewKey(fencechecktest.EdDSA, "authzd-1")
	v := newVerifier(fencechecktest.Keys(key))
	store := fencecheck.NewMemoryReplay(1)
	store.Now = v.Now
	v.Replay = store
	ctx := context.Background()
	if _, err := v.Verify(ctx, key.Issue(validClaims(t)), testTool, json.RawMessage(testArgs)); err != nil {
		t.Fatal(err)
	}
	_, err := v.Verify(ctx, key.Issue(validClaims(t)), testTool, json.RawMessage(testArgs))
	if got := fencecheck.ReasonOf(err); got != fencecheck.ReasonReplayStore {
		t.Fatalf("reason = %q (%v), want %s", got, err, fencecheck.ReasonReplayStore)
	}
}

// TestVerifySkewSettings: zero skew is the default, a negative one none.
func TestVerifySkewSettings(t *testing.T) {
	key := fencechecktest.NewKey(fencechecktest.EdDSA, "authzd-1")
	c := validClaims(t)
	c.IssuedAt, c.NotBefore, c.Expiry = c.IssuedAt-20, c.NotBefore-20, testEpoch.Unix()-2 // expired 2 s ago
	for _, tc := range []struct {
		skew time.Duration
		want fencecheck.Reason
	}{{0, ""}, {-1, fencecheck.ReasonExpired}, {time.Second, fencecheck.ReasonExpired}, {3 * time.Second, ""}} {
		v := newVerifier(fencechecktest.Keys(key))
		v.Skew = tc.skew
		c.ID = newJTI()
		_, err := v.Verify(context.Background(), key.Issue(c), testTool, json.RawMessage(testArgs))
		if got := fencecheck.ReasonOf(err); got != tc.want {
			t.Errorf("skew %s: reason %q (%v), want %q", tc.skew, got, err, tc.want)
		}
	}
}

func TestClaimsValidateOrder(t *testing.T) {
	// With every claim missing, the first in declaration order is named,
	// every time.
	for range 20 {
		err := (&fencecheck.Claims{}).Validate()
		if err == nil || err.Error() != "claim iss is missing" {
			t.Fatalf("Validate = %v", err)
		}
	}
	c := validClaims(t)
	c.Revision = 0
	c.Config = ""
	if err := c.Validate(); err == nil || err.Error() != "claim fcd_config is missing" {
		t.Fatalf("Validate = %v", err)
	}
}

// TestVerifyOffline: without a Claimer, a token whose lease was admitted
// before the process started (plus the skew) is refused: an earlier
// process may have run it, and its replay memory is gone.
func TestVerifyOffline(t *testing.T) {
	key := fencechecktest.NewKey(fencechecktest.EdDSA, "authzd-1")
	started := testEpoch.Add(-time.Minute)
	cases := []struct {
		note     string
		admitted time.Time
		skew     time.Duration
		want     fencecheck.Reason
	}{
		{"an hour before the start", started.Add(-time.Hour), 0, fencecheck.ReasonAdmittedBeforeStart},
		{"a millisecond before the start", started.Add(-time.Millisecond), 0, fencecheck.ReasonAdmittedBeforeStart},
		{"at the start", started, 0, fencecheck.ReasonAdmittedBeforeStart},
		{"within the skew after the start", started.Add(fencecheck.DefaultSkew - time.Millisecond), 0, fencecheck.ReasonAdmittedBeforeStart},
		{"at the start plus the skew", started.Add(fencecheck.DefaultSkew), 0, ""},
		{"after the start", started.Add(30 * time.Second), 0, ""},
		{"within a larger skew", started.Add(30 * time.Second), time.Minute, fencecheck.ReasonAdmittedBeforeStart},
		{"no skew: right after the start", started.Add(time.Millisecond), -1, ""},
	}
	for _, tc := range cases {
		t.Run(tc.note, func(t *testing.T) {
			v := newVerifier(fencechecktest.Keys(key))
			v.Started = started
			v.Skew = tc.skew
			c := validClaims(t)
			c.Admitted = tc.admitted.UnixMilli()
			token := key.Issue(c)
			_, err := v.Verify(context.Background(), token, testTool, json.RawMessage(testArgs))
			if got := fencecheck.ReasonOf(err); got != tc.want {
				t.Fatalf("reason = %q (%v), want %q", got, err, tc.want)
			}
			if tc.want == "" {
				return
			}
			// A refused token is refused again the same way: it consumed
			// nothing, and nothing lets it through.
			_, err = v.Verify(context.Background(), token, testTool, json.RawMessage(testArgs))
			if got := fencecheck.ReasonOf(err); got != tc.want {
				t.Fatalf("again: reason = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestVerifyOfflineStartedAtFirstUse: a zero Started is the verifier's
// first use (Validate or Verify), by its clock.
func TestVerifyOfflineStartedAtFirstUse(t *testing.T) {
	key := fencechecktest.NewKey(fencechecktest.EdDSA, "authzd-1")
	clk := newClock()
	v := newVerifier(fencechecktest.Keys(key))
	v.Started = time.Time{}
	v.Now = clk.Now
	if err := v.Validate(); err != nil { // first use, at testEpoch
		t.Fatal(err)
	}
	clk.Advance(time.Minute)
	for _, tc := range []struct {
		admitted time.Time
		want     fencecheck.Reason
	}{
		{testEpoch.Add(-time.Second), fencecheck.ReasonAdmittedBeforeStart},
		{testEpoch.Add(2 * time.Second), fencecheck.ReasonAdmittedBeforeStart},
		{testEpoch.Add(30 * time.Second), ""},
	} {
		c := validClaims(t)
		now := clk.Now().Unix()
		c.IssuedAt, c.NotBefore, c.Expiry = now, now, now+30
		c.Admitted = tc.admitted.UnixMilli()
		_, err := v.Verify(context.Background(), key.Issue(c), testTool, json.RawMessage(testArgs))
		if got := fencecheck.ReasonOf(err); got != tc.want {
			t.Errorf("admitted %s after the first use: reason %q (%v), want %q", tc.admitted.Sub(testEpoch), got, err, tc.want)
		}
	}
}
