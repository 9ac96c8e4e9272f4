package manifest

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v2/jwa"
)

const (
	testSource = "sha256:1ad4702ca985ff3518fc88e43a0c51d04728cd7bd7b24a376fcca3e5fc9dbb6f"
	testTarget = "sha256:c60db86d5c63a03fae38e1ef4b09451a8240da190ddb3912a89610779b7a5543"
	// testEnvelope requires private to be present and true.
	testEnvelope = `{"type":"object","required":["private"],"properties":{"private":{"const":true}}}`
)

func baseCertificate() *Certificate {
	issued := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	return &Certificate{
		Source:    testSource,
		Target:    testTarget,
		Tool:      "create_repository",
		Envelope:  json.RawMessage(testEnvelope),
		Effects:   map[string]any{"visibility": "private"},
		Profile:   ProfileRef{ID: "github-create-repository/1", Digest: DigestBytes([]byte("profile"))},
		IssuedAt:  issued,
		ExpiresAt: issued.AddDate(1, 0, 0),
	}
}

func certificatePayload(t *testing.T, c *Certificate) []byte {
	t.Helper()
	b, err := Canonical(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCertificateRoundtrip(t *testing.T) {
	for _, alg := range []jwa.SignatureAlgorithm{jwa.EdDSA, jwa.ES256} {
		t.Run(alg.String(), func(t *testing.T) {
			key := genKey(t, alg)
			v := verifierFor(t, key)
			want := baseCertificate()
			sc, err := v.VerifyCertificate([]byte(sign(t, certificatePayload(t, want), key, TypCertificate)))
			if err != nil {
				t.Fatal(err)
			}
			wantID, _ := want.ID()
			if sc.ID != wantID || sc.KeyID != key.KeyID() || sc.JWS == "" {
				t.Fatalf("got id %s kid %s, want %s %s", sc.ID, sc.KeyID, wantID, key.KeyID())
			}
			c := sc.Certificate
			if c.Source != want.Source || c.Target != want.Target || c.Tool != want.Tool ||
				!c.ExpiresAt.Equal(want.ExpiresAt) || c.Effects["visibility"] != "private" {
				t.Fatalf("decoded %+v", c)
			}
		})
	}
}

func TestCertificateID(t *testing.T) {
	a, b := baseCertificate(), baseCertificate()
	// Whitespace and member order in the envelope do not change the id.
	b.Envelope = json.RawMessage(`{ "properties": {"private": {"const": true}}, "required": ["private"], "type": "object" }`)
	ida, err := a.ID()
	if err != nil {
		t.Fatal(err)
	}
	idb, _ := b.ID()
	if ida != idb || !ValidDigest(ida) {
		t.Fatalf("ids %s %s", ida, idb)
	}
	b.Effects = map[string]any{"visibility": "public"}
	if idc, _ := b.ID(); idc == ida {
		t.Fatal("different effects, same id")
	}
}

func TestVerifyCertificateFailures(t *testing.T) {
	issuer := genKey(t, jwa.EdDSA)
	registrar := genKey(t, jwa.EdDSA)
	issuers := verifierFor(t, issuer)
	registrars := verifierFor(t, registrar)
	good := sign(t, certificatePayload(t, baseCertificate()), issuer, TypCertificate)
	parts := strings.Split(good, ".")

	withField := func(name string, value any) []byte {
		var m map[string]any
		if err := json.Unmarshal(certificatePayload(t, baseCertificate()), &m); err != nil {
			t.Fatal(err)
		}
		m[name] = value
		b, _ := json.Marshal(m)
		return b
	}
	expired := baseCertificate()
	expired.ExpiresAt = expired.IssuedAt.Add(-time.Hour)

	cases := []struct {
		name string
		jws  string
		want error
	}{
		{"signed by a registrar, not an issuer", sign(t, certificatePayload(t, baseCertificate()), registrar, TypCertificate), ErrUntrustedSigner},
		{"tampered payload", parts[0] + "." + b64.EncodeToString(withField("tool", "delete_repository")) + "." + parts[2], ErrBadSignature},
		{"manifest typ", sign(t, certificatePayload(t, baseCertificate()), issuer, TypManifest), ErrBadSignature},
		{"a signed manifest", sign(t, manifestPayload(t), issuer, TypManifest), ErrBadSignature},
		{"certificate typ, manifest payload", sign(t, manifestPayload(t), issuer, TypCertificate), ErrMalformed},
		{"unknown field", sign(t, withField("scope", "all"), issuer, TypCertificate), ErrMalformed},
		{"expiry before issue", sign(t, certificatePayload(t, expired), issuer, TypCertificate), ErrInvalid},
		{"not a JWS", "{}", ErrMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := issuers.VerifyCertificate([]byte(tc.jws))
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}

	// A certificate is never accepted as a manifest, whoever signed it.
	t.Run("certificate refused by VerifyManifest", func(t *testing.T) {
		cert := sign(t, certificatePayload(t, baseCertificate()), registrar, TypCertificate)
		if _, err := registrars.VerifyManifest([]byte(cert)); !errors.Is(err, ErrBadSignature) {
			t.Fatalf("got %v, want %v", err, ErrBadSignature)
		}
	})
}

func TestCertificateValidate(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(c *Certificate)
		path   string
	}{
		{"bad source", func(c *Certificate) { c.Source = "sha256:abc" }, "/source"},
		{"missing target", func(c *Certificate) { c.Target = "" }, "/target"},
		{"same epochs", func(c *Certificate) { c.Target = c.Source }, "/target"},
		{"bad tool name", func(c *Certificate) { c.Tool = "create repository" }, "/tool"},
		{"empty tool", func(c *Certificate) { c.Tool = "" }, "/tool"},
		{"no envelope", func(c *Certificate) { c.Envelope = nil }, "/envelope"},
		{"envelope not an object", func(c *Certificate) { c.Envelope = json.RawMessage(`true`) }, "/envelope"},
		{"envelope without type", func(c *Certificate) { c.Envelope = json.RawMessage(`{"required":["private"]}`) }, "/envelope/type"},
		{"envelope of another type", func(c *Certificate) { c.Envelope = json.RawMessage(`{"type":"array"}`) }, "/envelope/type"},
		{"envelope type list", func(c *Certificate) { c.Envelope = json.RawMessage(`{"type":["object"]}`) }, "/envelope/type"},
		{"envelope does not compile", func(c *Certificate) { c.Envelope = json.RawMessage(`{"type":"object","minProperties":-1}`) }, "/envelope"},
		{"envelope with remote ref", func(c *Certificate) {
			c.Envelope = json.RawMessage(`{"type":"object","$ref":"https://example.com/s.json"}`)
		}, "/envelope"},
		{"no effects", func(c *Certificate) { c.Effects = nil }, "/effects"},
		{"empty effect name", func(c *Certificate) { c.Effects = map[string]any{"": "x"} }, "/effects"},
		{"no profile id", func(c *Certificate) { c.Profile.ID = "" }, "/profile/id"},
		{"bad profile digest", func(c *Certificate) { c.Profile.Digest = "md5:00" }, "/profile/digest"},
		{"no issuedAt", func(c *Certificate) { c.IssuedAt = time.Time{} }, "/issuedAt"},
		{"no expiresAt", func(c *Certificate) { c.ExpiresAt = time.Time{} }, "/expiresAt"},
		{"expiry before issue", func(c *Certificate) { c.ExpiresAt = c.IssuedAt.Add(-time.Second) }, "/expiresAt"},
		{"expiry equals issue", func(c *Certificate) { c.ExpiresAt = c.IssuedAt }, "/expiresAt"},
	}
	if err := baseCertificate().Validate(); err != nil {
		t.Fatalf("base certificate: %v", err)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := baseCertificate()
			tc.mutate(c)
			err := c.Validate()
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.path+" ") {
				t.Fatalf("got %v, want ErrInvalid at %s", err, tc.path)
			}
			// DecodeCertificate applies the same checks.
			if _, err := DecodeCertificate(certificatePayload(t, c)); !errors.Is(err, ErrInvalid) {
				t.Fatalf("DecodeCertificate: got %v, want ErrInvalid", err)
			}
		})
	}
}

func TestDecodeCertificateStrict(t *testing.T) {
	good := string(certificatePayload(t, baseCertificate()))
	if _, err := DecodeCertificate([]byte(good)); err != nil {
		t.Fatal(err)
	}
	cases := map[string]string{
		"unknown member":   strings.Replace(good, `{`, `{"scope":"all",`, 1),
		"duplicate member": strings.Replace(good, `{`, `{"tool":"delete_repository",`, 1),
		"case-folded name": strings.Replace(good, `"tool"`, `"Tool"`, 1),
		"trailing data":    good + `{}`,
		"not JSON":         `certificate`,
	}
	for name, doc := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := DecodeCertificate([]byte(doc)); !errors.Is(err, ErrMalformed) {
				t.Fatalf("got %v, want ErrMalformed", err)
			}
		})
	}
}

func TestCertificateFits(t *testing.T) {
	c := baseCertificate()
	cases := []struct {
		args    string
		fits    bool
		wantErr error
	}{
		{`{"name":"payroll-exports","private":true}`, true, nil},
		{`{"name":"payroll-exports"}`, false, nil},                  // private omitted
		{`{"name":"payroll-exports","private":false}`, false, nil},  // explicitly public
		{`{"name":"payroll-exports","private":"true"}`, false, nil}, // not a boolean
		{`[]`, false, nil},
		{`{"private":true,"private":true}`, false, ErrMalformed},
		{`{`, false, ErrMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.args, func(t *testing.T) {
			fits, err := c.Fits(json.RawMessage(tc.args))
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("got %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil || fits != tc.fits {
				t.Fatalf("Fits = %v, %v; want %v", fits, err, tc.fits)
			}
		})
	}
	// An envelope that cannot compile is an error, not a misfit.
	c.Envelope = json.RawMessage(`{"type":"object","$ref":"https://example.com/s.json"}`)
	if _, err := c.Fits(json.RawMessage(`{"private":true}`)); !errors.Is(err, ErrSchemaRefused) {
		t.Fatalf("uncompilable envelope: %v", err)
	}
}
