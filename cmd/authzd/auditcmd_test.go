package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/audit"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwk"
)

// TestAuditVerifyKeys: `audit verify` checks checkpoints against the keys
// it is given — a JWKS file, or authzd's URL — and fails on another key
// (a forger's, or a rotated-out one); without keys and without the dev
// credentials beside the trail it is a usage error.
func TestAuditVerifyKeys(t *testing.T) {
	key, err := manifest.GenerateKey(jwa.EdDSA)
	if err != nil {
		t.Fatal(err)
	}
	other, err := manifest.GenerateKey(jwa.EdDSA)
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(t.TempDir(), "audit")
	tr, err := audit.Open(audit.Config{Root: root, Replica: "r1", Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Record(context.Background(), "drain", 5, map[string]string{"epoch": "e"}); err != nil {
		t.Fatal(err)
	}
	// A resolution signed by the operator's key (other): --operator-keys
	// names the keys it must verify against.
	res, err := manifest.SignResolution(&manifest.Resolution{Lease: "ls_1", Outcome: manifest.ResolutionNoEffect,
		Reason: "the backend's log shows no write", Operator: "dana", IssuedAt: time.Now().UTC().Truncate(time.Second)}, other)
	if err != nil {
		t.Fatal(err)
	}
	sr, err := manifest.ReadVerifiedResolution(res)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Record(context.Background(), "resolution", 6, map[string]any{"lease": "ls_1", "outcome": "no_effect", "by": "operator",
		"signed": map[string]any{"kid": sr.KeyID, "operator": "dana", "digest": sr.Digest, "issuedAt": sr.Resolution.IssuedAt, "jws": sr.JWS}}); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	jwks := func(k jwk.Key) []byte {
		set, err := manifest.PublicSet(k)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(set)
		return b
	}
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good.jwks"), filepath.Join(dir, "bad.jwks")
	os.WriteFile(good, jwks(key), 0o600)
	os.WriteFile(bad, jwks(other), 0o600)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/.well-known/jwks.json" {
			http.NotFound(w, r)
			return
		}
		w.Write(jwks(key))
	}))
	defer srv.Close()
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"the signer's JWKS file", []string{"--jwks", good}, 0, "ok: "},
		{"authzd's URL", []string{"--jwks", srv.URL}, 0, "ok: "},
		{"authzd's JWKS URL", []string{"--jwks", srv.URL + "/.well-known/jwks.json"}, 0, "ok: "},
		{"a JWKS URL elsewhere that answers 404", []string{"--jwks", srv.URL + "/keys/jwks.json"}, 1, "status 404"},
		{"a server without the JWKS route", []string{"--jwks", srv.URL + "/base"}, 1, "/base/.well-known/jwks.json: authzd answered 404"},
		{"another key", []string{"--jwks", bad}, 1, audit.ProblemSignature},
		{"no keys and no dev credentials", nil, 2, "dev-credentials.json"},
		{"a JWKS file that is not one", []string{"--jwks", filepath.Join(dir, "missing")}, 1, "read --jwks"},
		{"the operator's keys", []string{"--jwks", good, "--operator-keys", bad}, 0, "ok: "},
		{"keys that are not the operator's", []string{"--jwks", good, "--operator-keys", good}, 1, audit.ProblemResolutionSignature},
		{"an operator-keys file that is not there", []string{"--jwks", good, "--operator-keys", filepath.Join(dir, "missing")}, 1, "--operator-keys"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			code := run(t.Context(), append(append([]string{"audit", "verify"}, tc.args...), root), nil, &out, &out)
			if code != tc.code || !strings.Contains(out.String(), tc.want) {
				t.Fatalf("exit %d, want %d with %q:\n%s", code, tc.code, tc.want, out.String())
			}
		})
	}
}

// TestAuditVerifyReadsTrailsOfSchemaV1: `audit verify` passes a trail
// written before the events had a schema member (audit/testdata/trail-v1,
// never regenerated), with its operator keys.
func TestAuditVerifyReadsTrailsOfSchemaV1(t *testing.T) {
	dir := filepath.Join("..", "..", "audit", "testdata", "trail-v1")
	var out bytes.Buffer
	code := run(t.Context(), []string{"audit", "verify", "--jwks", filepath.Join(dir, "jwks.json"),
		"--operator-keys", filepath.Join(dir, "operator-keys.json"), filepath.Join(dir, "trails")}, nil, &out, &out)
	if code != 0 || !strings.Contains(out.String(), "chain r1: 31 events") || !strings.Contains(out.String(), "ok: ") {
		t.Fatalf("exit %d:\n%s", code, out.String())
	}
}
