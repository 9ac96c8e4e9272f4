package manifest

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v2/jwa"
)

// resolutionNow is the verifier's clock in the resolution tests.
var resolutionNow = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

func baseResolution() *Resolution {
	return &Resolution{
		Lease:    "ls_7xq2guseygvspgfq3z5bzlql4a",
		Outcome:  ResolutionNoEffect,
		Reason:   "the repository does not exist; checked the GitHub audit log",
		Operator: "dana@example.com",
		IssuedAt: resolutionNow.Add(-5 * time.Minute),
	}
}

// resolutionPayload is r's canonical JSON with the members in extra set
// (a nil value removes the member).
func resolutionPayload(t *testing.T, r *Resolution, extra map[string]any) []byte {
	t.Helper()
	b, err := Canonical(r)
	if err != nil {
		t.Fatal(err)
	}
	if len(extra) == 0 {
		return b
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for k, v := range extra {
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	b, _ = json.Marshal(m)
	return b
}

func TestVerifyResolution(t *testing.T) {
	operator := genKey(t, jwa.EdDSA)
	operatorES := genKey(t, jwa.ES256)
	stranger := genKey(t, jwa.EdDSA)
	v := verifierFor(t, operator, operatorES)
	good := resolutionPayload(t, baseResolution(), nil)
	goodJWS := sign(t, good, operator, TypResolution)
	parts := strings.Split(goodJWS, ".")
	at := func(d time.Duration) []byte {
		r := baseResolution()
		r.IssuedAt = resolutionNow.Add(d)
		return resolutionPayload(t, r, nil)
	}
	var edRaw ed25519.PrivateKey
	if err := operator.Raw(&edRaw); err != nil {
		t.Fatal(err)
	}
	// edSign signs a handcrafted JWS's input with the trusted Ed25519 key:
	// only its header is wrong.
	edSign := func(in []byte) []byte { return ed25519.Sign(edRaw, in) }

	cases := []struct {
		name string
		jws  string
		want error // nil: verifies
	}{
		{"good, EdDSA", goodJWS, nil},
		{"good, ES256", sign(t, good, operatorES, TypResolution), nil},
		{"good, effect", sign(t, resolutionPayload(t, baseResolution(), map[string]any{"outcome": "effect"}), operator, TypResolution), nil},
		{"issued just now", sign(t, at(0), operator, TypResolution), nil},
		{"issued within the skew ahead", sign(t, at(ResolutionMaxSkew), operator, TypResolution), nil},
		{"issued at the oldest accepted", sign(t, at(-ResolutionMaxAge), operator, TypResolution), nil},
		{"issued too far ahead", sign(t, at(ResolutionMaxSkew+time.Second), operator, TypResolution), ErrResolutionTime},
		{"issued too long ago", sign(t, at(-ResolutionMaxAge-time.Second), operator, TypResolution), ErrResolutionTime},
		{"issued a day ago", sign(t, at(-24*time.Hour), operator, TypResolution), ErrResolutionTime},
		{"manifest typ", sign(t, good, operator, TypManifest), ErrBadSignature},
		{"certificate typ", sign(t, good, operator, TypCertificate), ErrBadSignature},
		{"handcrafted with the right header", handcraft(t, map[string]any{"alg": "EdDSA", "typ": TypResolution, "kid": operator.KeyID()}, good, edSign), nil},
		{"no typ", handcraft(t, map[string]any{"alg": "EdDSA", "kid": operator.KeyID()}, good, edSign), ErrBadSignature},
		{"untrusted key", sign(t, good, stranger, TypResolution), ErrUntrustedSigner},
		{"alg none", handcraft(t, map[string]any{"alg": "none", "typ": TypResolution, "kid": operator.KeyID()}, good, nil), ErrBadSignature},
		{"alg HS256", handcraft(t, map[string]any{"alg": "HS256", "typ": TypResolution, "kid": operator.KeyID()}, good, edSign), ErrBadSignature},
		{"alg ES256 under an Ed25519 kid", handcraft(t, map[string]any{"alg": "ES256", "typ": TypResolution, "kid": operator.KeyID()}, good, edSign), ErrBadSignature},
		{"no kid", handcraft(t, map[string]any{"alg": "EdDSA", "typ": TypResolution}, good, edSign), ErrBadSignature},
		{"payload changed after signing", parts[0] + "." + b64.EncodeToString(resolutionPayload(t, baseResolution(), map[string]any{"outcome": "effect"})) + "." + parts[2], ErrBadSignature},
		{"unknown member", sign(t, resolutionPayload(t, baseResolution(), map[string]any{"scope": "all leases"}), operator, TypResolution), ErrMalformed},
		{"case-folded member", sign(t, []byte(strings.Replace(string(good), `"lease"`, `"Lease"`, 1)), operator, TypResolution), ErrMalformed},
		{"duplicate member", sign(t, []byte(strings.Replace(string(good), `{`, `{"outcome":"effect",`, 1)), operator, TypResolution), ErrMalformed},
		{"issuedAt not a time", sign(t, resolutionPayload(t, baseResolution(), map[string]any{"issuedAt": "yesterday"}), operator, TypResolution), ErrMalformed},
		{"outcome uncertain", sign(t, resolutionPayload(t, baseResolution(), map[string]any{"outcome": "uncertain"}), operator, TypResolution), ErrInvalid},
		{"no lease", sign(t, resolutionPayload(t, baseResolution(), map[string]any{"lease": nil}), operator, TypResolution), ErrInvalid},
		{"no issuedAt", sign(t, resolutionPayload(t, baseResolution(), map[string]any{"issuedAt": nil}), operator, TypResolution), ErrInvalid},
		{"a signed manifest", sign(t, manifestPayload(t), operator, TypResolution), ErrMalformed},
		{"not a JWS", "resolved", ErrMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sr, err := v.VerifyResolution([]byte(tc.jws), resolutionNow)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("VerifyResolution: %v", err)
				}
				if sr.JWS != tc.jws || sr.Resolution.Lease != baseResolution().Lease || sr.KeyID == "" || !ValidDigest(sr.Digest) {
					t.Fatalf("verified %+v", sr)
				}
				return
			}
			if !errors.Is(err, tc.want) || sr != nil {
				t.Fatalf("got %v (%v), want %v", err, sr, tc.want)
			}
		})
	}

	t.Run("decoded", func(t *testing.T) {
		sr, err := v.VerifyResolution([]byte(" "+goodJWS+"\n"), resolutionNow)
		if err != nil {
			t.Fatal(err)
		}
		want := baseResolution()
		got := sr.Resolution
		if got.Lease != want.Lease || got.Outcome != want.Outcome || got.Reason != want.Reason || got.Operator != want.Operator ||
			!got.IssuedAt.Equal(want.IssuedAt) || sr.KeyID != operator.KeyID() || sr.JWS != goodJWS {
			t.Fatalf("decoded %+v %+v", sr, got)
		}
		// The digest is the canonical payload's, whatever its signature.
		if sr.Digest != DigestBytes(good) {
			t.Fatalf("digest %s, want %s", sr.Digest, DigestBytes(good))
		}
		other, err := v.VerifyResolution([]byte(sign(t, good, operatorES, TypResolution)), resolutionNow)
		if err != nil || other.Digest != sr.Digest {
			t.Fatalf("same payload, other signature: %v, digest %v", err, other)
		}
	})

	// A resolution is never a manifest or a certificate, and the other way round.
	t.Run("no other kind of document", func(t *testing.T) {
		if _, err := v.VerifyManifest([]byte(goodJWS)); !errors.Is(err, ErrBadSignature) {
			t.Errorf("VerifyManifest of a resolution: %v", err)
		}
		if _, err := v.VerifyCertificate([]byte(goodJWS)); !errors.Is(err, ErrBadSignature) {
			t.Errorf("VerifyCertificate of a resolution: %v", err)
		}
		cert := sign(t, certificatePayload(t, baseCertificate()), operator, TypCertificate)
		if _, err := v.VerifyResolution([]byte(cert), resolutionNow); !errors.Is(err, ErrBadSignature) {
			t.Errorf("VerifyResolution of a certificate: %v", err)
		}
	})
}

func TestResolutionValidate(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(r *Resolution)
		path   string
	}{
		{"no lease", func(r *Resolution) { r.Lease = "" }, "/lease"},
		{"lease with a slash", func(r *Resolution) { r.Lease = "ls_a/../b" }, "/lease"},
		{"lease with a newline", func(r *Resolution) { r.Lease = "ls_a\n" }, "/lease"},
		{"lease too long", func(r *Resolution) { r.Lease = strings.Repeat("a", 257) }, "/lease"},
		{"no outcome", func(r *Resolution) { r.Outcome = "" }, "/outcome"},
		{"outcome rejected", func(r *Resolution) { r.Outcome = "rejected" }, "/outcome"},
		{"blank reason", func(r *Resolution) { r.Reason = " \n" }, "/reason"},
		{"reason too long", func(r *Resolution) { r.Reason = strings.Repeat("r", MaxResolutionReason+1) }, "/reason"},
		{"no operator", func(r *Resolution) { r.Operator = "" }, "/operator"},
		{"operator too long", func(r *Resolution) { r.Operator = strings.Repeat("o", MaxResolutionOperator+1) }, "/operator"},
		{"operator with a control character", func(r *Resolution) { r.Operator = "dana\u0085" }, "/operator"},
		{"no issuedAt", func(r *Resolution) { r.IssuedAt = time.Time{} }, "/issuedAt"},
	}
	if err := baseResolution().Validate(); err != nil {
		t.Fatalf("base resolution: %v", err)
	}
	key := genKey(t, jwa.EdDSA)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := baseResolution()
			tc.mutate(r)
			err := r.Validate()
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.path+" ") {
				t.Fatalf("got %v, want ErrInvalid at %s", err, tc.path)
			}
			if _, err := DecodeResolution(resolutionPayload(t, r, nil)); !errors.Is(err, ErrInvalid) {
				t.Fatalf("DecodeResolution: %v", err)
			}
			// Nothing invalid is signed.
			if out, err := SignResolution(r, key); !errors.Is(err, ErrInvalid) || out != nil {
				t.Fatalf("SignResolution: %v", err)
			}
		})
	}
}

// TestSignResolution: what SignResolution makes verifies, and
// ReadVerifiedResolution reads back what was verified (without checking
// it: a document too old to verify now still reads).
func TestSignResolution(t *testing.T) {
	key := genKey(t, jwa.ES256)
	v := verifierFor(t, key)
	r := baseResolution()
	out, err := SignResolution(r, key)
	if err != nil {
		t.Fatal(err)
	}
	sr, err := v.VerifyResolution(out, resolutionNow)
	if err != nil {
		t.Fatal(err)
	}
	if sr.Resolution.Operator != r.Operator || sr.KeyID != key.KeyID() {
		t.Fatalf("verified %+v", sr)
	}
	if _, err := v.VerifyResolution(out, resolutionNow.Add(2*ResolutionMaxAge)); !errors.Is(err, ErrResolutionTime) {
		t.Fatalf("later: %v", err)
	}
	read, err := ReadVerifiedResolution(out)
	if err != nil || read.Digest != sr.Digest || read.KeyID != sr.KeyID || read.JWS != sr.JWS || read.Resolution.Reason != r.Reason {
		t.Fatalf("read back: %v %+v", err, read)
	}
	for name, bad := range map[string]string{
		"a manifest": sign(t, manifestPayload(t), key, TypManifest),
		"not a JWS":  "{}",
	} {
		if _, err := ReadVerifiedResolution([]byte(bad)); !errors.Is(err, ErrMalformed) {
			t.Errorf("ReadVerifiedResolution of %s: %v", name, err)
		}
	}
}
