package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/internal/manifesttest"
	"github.com/fcd-authz/fcd/manifest"
)

// writeKeyPair writes a fresh private JWK and a JWKS of its public half
// into dir and returns their paths.
func writeKeyPair(t *testing.T, dir, name string) (keyFile, jwksFile string) {
	t.Helper()
	s := manifesttest.NewSigner(t)
	for path, v := range map[string]any{
		filepath.Join(dir, name+".jwk"):  s.Key,
		filepath.Join(dir, name+".jwks"): s.Set,
	} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, name+".jwk"), filepath.Join(dir, name+".jwks")
}

func TestCertCommands(t *testing.T) {
	dir := t.TempDir()
	issuerKey, issuerKeys := writeKeyPair(t, dir, "issuer")
	registrarKey, registrarKeys := writeKeyPair(t, dir, "registrar")
	example := "../../examples/github/certificate-v1.4-to-v1.3.json"
	cli := func(stdin []byte, args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(context.Background(), args, bytes.NewReader(stdin), &out, &errb)
		return code, out.String(), errb.String()
	}

	code, jws, stderr := cli(nil, "cert", "sign", "--key", issuerKey, example)
	if code != 0 || strings.Count(strings.TrimSpace(jws), ".") != 2 {
		t.Fatalf("sign: %d %q %s", code, jws, stderr)
	}
	code, out, stderr := cli([]byte(jws), "cert", "verify", "--keys", issuerKeys, "-")
	if code != 0 {
		t.Fatalf("verify: %d %s", code, stderr)
	}
	var got map[string]string
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("verify output %q: %v", out, err)
	}
	raw, _ := os.ReadFile(example)
	c, err := manifest.DecodeCertificate(raw)
	if err != nil {
		t.Fatalf("example: %v", err)
	}
	id, _ := c.ID()
	signer, err := manifest.LoadPrivateKey(issuerKey)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"id": id, "source": c.Source, "target": c.Target, "tool": "create_repository",
		"expiresAt": "2027-11-30T00:00:00Z", "signer": signer.KeyID(),
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("verify %s = %q, want %q", name, got[name], w)
		}
	}

	// --valid-for sets the validity at signing time, keeping everything
	// else; a negative one is a usage error.
	before := time.Now().UTC().Truncate(time.Second)
	code, vjws, stderr := cli(nil, "cert", "sign", "--key", issuerKey, "--valid-for", "720h", example)
	if code != 0 {
		t.Fatalf("sign --valid-for: %d %s", code, stderr)
	}
	code, out, _ = cli([]byte(vjws), "cert", "verify", "--keys", issuerKeys)
	var valid map[string]string
	if code != 0 || json.Unmarshal([]byte(out), &valid) != nil {
		t.Fatalf("verify --valid-for: %d %s", code, out)
	}
	exp, err := time.Parse(time.RFC3339, valid["expiresAt"])
	if err != nil || exp.Before(before.Add(720*time.Hour)) || exp.After(time.Now().Add(721*time.Hour)) ||
		valid["source"] != c.Source || valid["target"] != c.Target || valid["id"] == id {
		t.Fatalf("--valid-for 720h: %v (%v)", valid, err)
	}
	if code, _, _ := cli(nil, "cert", "sign", "--key", issuerKey, "--valid-for", "-1h", example); code != 2 {
		t.Fatalf("negative --valid-for: exit %d, want 2", code)
	}

	// The example's epochs are those of the example manifests.
	for file, epoch := range map[string]string{"manifest-v1.4.json": c.Source, "manifest-v1.3.json": c.Target} {
		if code, d, _ := cli(nil, "manifest", "digest", "../../examples/github/"+file); code != 0 || strings.TrimSpace(d) != epoch {
			t.Errorf("digest of %s = %q, want %s", file, d, epoch)
		}
	}

	// Registrar keys do not vouch for certificates, nor issuer keys for manifests.
	if code, _, stderr := cli([]byte(jws), "cert", "verify", "--keys", registrarKeys); code != 1 || !strings.Contains(stderr, "not trusted") {
		t.Fatalf("verify with registrar keys: %d %s", code, stderr)
	}
	code, mjws, _ := cli(nil, "manifest", "sign", "--key", registrarKey, "../../examples/github/manifest-v1.4.json")
	if code != 0 {
		t.Fatal("manifest sign failed")
	}
	if code, _, stderr := cli([]byte(mjws), "cert", "verify", "--keys", registrarKeys); code != 1 || !strings.Contains(stderr, "typ") {
		t.Fatalf("manifest verified as certificate: %d %s", code, stderr)
	}
	if code, _, stderr := cli([]byte(jws), "manifest", "verify", "--keys", issuerKeys); code != 1 || !strings.Contains(stderr, "typ") {
		t.Fatalf("certificate verified as manifest: %d %s", code, stderr)
	}
	tampered := strings.Replace(jws, ".", ".e30", 1)
	if code, _, stderr := cli([]byte(tampered), "cert", "verify", "--keys", issuerKeys); code != 1 {
		t.Fatalf("tampered certificate verified: %s", stderr)
	}

	// sign refuses what no verifier would accept.
	unknown := bytes.Replace(raw, []byte(`{`), []byte(`{"scope":"all",`), 1)
	if code, _, stderr := cli(unknown, "cert", "sign", "--key", issuerKey); code != 1 || !strings.Contains(stderr, "malformed") {
		t.Fatalf("sign of unknown member: %d %s", code, stderr)
	}
	backwards := bytes.Replace(raw, []byte(`"2027-11-30T00:00:00Z"`), []byte(`"2025-11-30T00:00:00Z"`), 1)
	if code, _, stderr := cli(backwards, "cert", "sign", "--key", issuerKey); code != 1 || !strings.Contains(stderr, "expiresAt") {
		t.Fatalf("sign of expiry before issue: %d %s", code, stderr)
	}

	for _, args := range [][]string{{"cert"}, {"cert", "frobnicate"}, {"cert", "sign"}, {"cert", "verify"}, {"cert", "sign", "--key", issuerKey, "a", "b"}} {
		if code, _, _ := cli(nil, args...); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
}
