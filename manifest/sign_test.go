package manifest

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwk"
	"github.com/lestrrat-go/jwx/v2/jws"
)

var b64 = base64.RawURLEncoding

func genKey(t *testing.T, alg jwa.SignatureAlgorithm) jwk.Key {
	t.Helper()
	k, err := GenerateKey(alg)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func verifierFor(t *testing.T, keys ...jwk.Key) *Verifier {
	t.Helper()
	set, err := PublicSet(keys...)
	if err != nil {
		t.Fatal(err)
	}
	v, err := NewVerifier(set)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func manifestPayload(t *testing.T) []byte {
	t.Helper()
	b, err := Canonical(baseManifest())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sign(t *testing.T, payload []byte, key jwk.Key, typ string) string {
	t.Helper()
	out, err := Sign(payload, key, typ)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// handcraft builds a compact JWS from a header, a payload and a signing
// function over the signing input (nil: empty signature).
func handcraft(t *testing.T, hdr map[string]any, payload []byte, signFn func(input []byte) []byte) string {
	t.Helper()
	h, err := json.Marshal(hdr)
	if err != nil {
		t.Fatal(err)
	}
	input := b64.EncodeToString(h) + "." + b64.EncodeToString(payload)
	var sig []byte
	if signFn != nil {
		sig = signFn([]byte(input))
	}
	return input + "." + b64.EncodeToString(sig)
}

func TestSignVerifyRoundTrip(t *testing.T) {
	for _, alg := range []jwa.SignatureAlgorithm{jwa.EdDSA, jwa.ES256} {
		t.Run(alg.String(), func(t *testing.T) {
			key := genKey(t, alg)
			other := genKey(t, jwa.EdDSA)
			v := verifierFor(t, other, key)
			payload := manifestPayload(t)
			token := sign(t, payload, key, TypManifest)

			hdr := strings.Split(token, ".")[0]
			raw, _ := b64.DecodeString(hdr)
			var h map[string]any
			if err := json.Unmarshal(raw, &h); err != nil {
				t.Fatal(err)
			}
			if h["alg"] != alg.String() || h["typ"] != TypManifest || h["kid"] != key.KeyID() {
				t.Fatalf("header %v", h)
			}

			got, err := v.Verify([]byte(" "+token+"\n"), TypManifest)
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if string(got.Payload) != string(payload) || got.KeyID != key.KeyID() {
				t.Fatalf("Verify = %+v", got)
			}
			signed, err := v.VerifyManifest([]byte(token))
			if err != nil {
				t.Fatalf("VerifyManifest: %v", err)
			}
			want, _ := baseManifest().EpochID()
			if signed.Epoch != want || signed.KeyID != key.KeyID() || signed.JWS != token {
				t.Fatalf("VerifyManifest = epoch %s kid %s, want %s %s", signed.Epoch, signed.KeyID, want, key.KeyID())
			}
		})
	}
}

func TestVerifyRefuses(t *testing.T) {
	ed := genKey(t, jwa.EdDSA)
	es := genKey(t, jwa.ES256)
	v := verifierFor(t, ed, es)
	payload := manifestPayload(t)
	good := sign(t, payload, ed, TypManifest)
	parts := strings.Split(good, ".")

	var edRaw ed25519.PrivateKey
	if err := ed.Raw(&edRaw); err != nil {
		t.Fatal(err)
	}
	edPub := edRaw.Public().(ed25519.PublicKey)
	pubJWK, _ := ed.PublicKey()
	pubJSON, _ := json.Marshal(pubJWK)
	hmacWith := func(secret []byte) func([]byte) []byte {
		return func(in []byte) []byte {
			mac := hmac.New(sha256.New, secret)
			mac.Write(in)
			return mac.Sum(nil)
		}
	}
	edSign := func(in []byte) []byte { return ed25519.Sign(edRaw, in) }

	// Same kid, different key.
	impostor := genKey(t, jwa.EdDSA)
	if err := impostor.Set(jwk.KeyIDKey, ed.KeyID()); err != nil {
		t.Fatal(err)
	}
	// Two signatures (JSON serialization), both by trusted keys.
	hdrEd, hdrEs := jws.NewHeaders(), jws.NewHeaders()
	for _, h := range []struct {
		hdr jws.Headers
		kid string
	}{{hdrEd, ed.KeyID()}, {hdrEs, es.KeyID()}} {
		_ = h.hdr.Set(jws.TypeKey, TypManifest)
		_ = h.hdr.Set(jws.KeyIDKey, h.kid)
	}
	twoSigs, err := jws.Sign(payload, jws.WithJSON(),
		jws.WithKey(jwa.EdDSA, ed, jws.WithProtectedHeaders(hdrEd)),
		jws.WithKey(jwa.ES256, es, jws.WithProtectedHeaders(hdrEs)))
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name  string
		token string
		want  error
	}{
		{"tampered payload", parts[0] + "." + b64.EncodeToString([]byte(strings.Replace(string(payload), `"private"`, `"public"`, 1))) + "." + parts[2], ErrBadSignature},
		{"tampered signature", func() string {
			sig, _ := b64.DecodeString(parts[2])
			sig[7] ^= 0x01
			return parts[0] + "." + parts[1] + "." + b64.EncodeToString(sig)
		}(), ErrBadSignature},
		{"signature removed", parts[0] + "." + parts[1] + ".", ErrBadSignature},
		{"untrusted signer", sign(t, payload, genKey(t, jwa.ES256), TypManifest), ErrUntrustedSigner},
		{"same kid, different key", sign(t, payload, impostor, TypManifest), ErrBadSignature},
		{"wrong typ", sign(t, payload, ed, "fcd-certificate+jws"), ErrBadSignature},
		{"no typ", handcraft(t, map[string]any{"alg": "EdDSA", "kid": ed.KeyID()}, payload, edSign), ErrBadSignature},
		{"missing kid", handcraft(t, map[string]any{"alg": "EdDSA", "typ": TypManifest}, payload, edSign), ErrBadSignature},
		{"alg none", handcraft(t, map[string]any{"alg": "none", "typ": TypManifest, "kid": ed.KeyID()}, payload, nil), ErrBadSignature},
		{"alg None", handcraft(t, map[string]any{"alg": "None", "typ": TypManifest, "kid": ed.KeyID()}, payload, nil), ErrBadSignature},
		{"HS256 keyed with the raw public key", handcraft(t, map[string]any{"alg": "HS256", "typ": TypManifest, "kid": ed.KeyID()}, payload, hmacWith(edPub)), ErrBadSignature},
		{"HS256 keyed with the public JWK", handcraft(t, map[string]any{"alg": "HS256", "typ": TypManifest, "kid": ed.KeyID()}, payload, hmacWith(pubJSON)), ErrBadSignature},
		{"algorithm that does not fit the key", handcraft(t, map[string]any{"alg": "ES256", "typ": TypManifest, "kid": ed.KeyID()}, payload, edSign), ErrBadSignature},
		{"EdDSA signature under an ES256 kid", handcraft(t, map[string]any{"alg": "EdDSA", "typ": TypManifest, "kid": es.KeyID()}, payload, edSign), ErrBadSignature},
		{"two signatures", string(twoSigs), ErrBadSignature},
		{"not a JWS", "hello", ErrMalformed},
		{"empty", "", ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := v.Verify([]byte(tt.token), TypManifest)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Verify = %v, want %v", err, tt.want)
			}
			if got != nil {
				t.Fatalf("Verify returned a document with error %v", err)
			}
			if _, err := v.VerifyManifest([]byte(tt.token)); !errors.Is(err, tt.want) {
				t.Fatalf("VerifyManifest = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestVerifyManifestDecodesStrictly(t *testing.T) {
	key := genKey(t, jwa.EdDSA)
	v := verifierFor(t, key)
	base := baseJSON(t)

	unknown := `{"bogus":true,` + base[1:]
	if _, err := v.VerifyManifest([]byte(sign(t, []byte(unknown), key, TypManifest))); !errors.Is(err, ErrMalformed) {
		t.Fatalf("unknown member: %v, want ErrMalformed", err)
	}
	invalid := strings.Replace(base, `"pool":"github-v1-4"`, `"pool":""`, 1)
	if _, err := v.VerifyManifest([]byte(sign(t, []byte(invalid), key, TypManifest))); !errors.Is(err, ErrInvalid) {
		t.Fatalf("invalid manifest: %v, want ErrInvalid", err)
	}
}

func TestNewVerifierRefuses(t *testing.T) {
	ed := genKey(t, jwa.EdDSA)
	es := genKey(t, jwa.ES256)
	pubSet := func(keys ...jwk.Key) jwk.Set {
		set, err := PublicSet(keys...)
		if err != nil {
			t.Fatal(err)
		}
		return set
	}
	setOf := func(keys ...jwk.Key) jwk.Set {
		set := jwk.NewSet()
		for _, k := range keys {
			if err := set.AddKey(k); err != nil {
				t.Fatal(err)
			}
		}
		return set
	}
	noKid := func(k jwk.Key) jwk.Key {
		pub, err := k.PublicKey()
		if err != nil {
			t.Fatal(err)
		}
		if err := pub.Remove(jwk.KeyIDKey); err != nil {
			t.Fatal(err)
		}
		return pub
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	rsaPub, _ := jwk.FromRaw(rsaKey.Public())
	_ = jwk.AssignKeyID(rsaPub)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	p384Pub, _ := jwk.FromRaw(p384.Public())
	_ = jwk.AssignKeyID(p384Pub)
	oct, _ := jwk.FromRaw([]byte("0123456789abcdef0123456789abcdef"))
	_ = oct.Set(jwk.KeyIDKey, "hmac")
	dupKid, _ := es.PublicKey()
	_ = dupKid.Set(jwk.KeyIDKey, ed.KeyID())

	tests := []struct {
		name string
		set  jwk.Set
	}{
		{"private Ed25519 key", setOf(ed)},
		{"private P-256 key", setOf(es)},
		{"private key beside public ones", setOf(must(t, ed.PublicKey), es)},
		{"public key without kid", setOf(noKid(ed))},
		{"P-256 public key without kid", setOf(noKid(es))},
		{"RSA key", setOf(rsaPub)},
		{"P-384 key", setOf(p384Pub)},
		{"symmetric key", setOf(oct)},
		{"duplicate kid", setOf(must(t, ed.PublicKey), dupKid)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if v, err := NewVerifier(tt.set); err == nil || v != nil {
				t.Fatalf("NewVerifier = %v, %v; want an error", v, err)
			}
		})
	}
	if _, err := NewVerifier(pubSet(ed, es)); err != nil {
		t.Fatalf("NewVerifier(public keys) = %v", err)
	}
}

func must(t *testing.T, f func() (jwk.Key, error)) jwk.Key {
	t.Helper()
	k, err := f()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestSignRefuses(t *testing.T) {
	payload := []byte(`{}`)
	ed := genKey(t, jwa.EdDSA)
	if err := ed.Remove(jwk.KeyIDKey); err != nil {
		t.Fatal(err)
	}
	if _, err := Sign(payload, ed, TypManifest); err == nil {
		t.Error("Sign without kid succeeded")
	}
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	rk, _ := jwk.FromRaw(rsaKey)
	_ = jwk.AssignKeyID(rk)
	if _, err := Sign(payload, rk, TypManifest); err == nil {
		t.Error("Sign with an RSA key succeeded")
	}
	if _, err := GenerateKey(jwa.HS256); err == nil {
		t.Error("GenerateKey(HS256) succeeded")
	}
}

func TestVerifierConcurrent(t *testing.T) {
	key := genKey(t, jwa.ES256)
	v := verifierFor(t, key)
	token := []byte(sign(t, manifestPayload(t), key, TypManifest))
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				if _, err := v.VerifyManifest(token); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}
