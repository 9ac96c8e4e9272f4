package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/internal/cmdtest"
	"github.com/fcd-authz/fcd/manifest"
)

// TestKeysNew: `authzd keys new` writes a private JWK (mode 0600) that the
// commands and serve load, and its JWKS, for each kind and algorithm;
// it never overwrites a key, and refuses an unknown kind or algorithm.
func TestKeysNew(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ kind, alg string }{{"registrar", "EdDSA"}, {"signing", "ES256"}, {"issuer", "EdDSA"}, {"operator", "EdDSA"}} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), []string{"keys", "new", "--kind", tc.kind, "--alg", tc.alg, "--out", dir}, nil, &out, &errb); code != 0 {
			t.Fatalf("keys new %s: exit %d %s", tc.kind, code, errb.String())
		}
		var got struct{ Kid, Private, Public string }
		if err := json.Unmarshal(out.Bytes(), &got); err != nil || got.Kid == "" {
			t.Fatalf("keys new %s printed %s (%v)", tc.kind, out.String(), err)
		}
		fi, err := os.Stat(got.Private)
		if err != nil || fi.Mode().Perm() != 0o600 || got.Private != filepath.Join(dir, tc.kind+".jwk") {
			t.Fatalf("private key %s: %v %v", got.Private, err, fi)
		}
		key, err := manifest.LoadPrivateKey(got.Private)
		if err != nil || key.KeyID() != got.Kid {
			t.Fatalf("load %s: %v", got.Private, err)
		}
		if _, err := manifest.LoadVerifier(got.Public); err != nil {
			t.Fatalf("load %s: %v", got.Public, err)
		}
	}
	before, _ := os.ReadFile(filepath.Join(dir, "registrar.jwk"))
	for _, args := range [][]string{
		{"keys", "new", "--kind", "registrar", "--out", dir}, // exists
		{"keys", "new", "--kind", "dispatcher", "--out", dir},
		{"keys", "new", "--kind", "signing", "--alg", "RS256", "--out", t.TempDir()},
		{"keys", "old"},
	} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), args, nil, &out, &errb); code == 0 {
			t.Errorf("%v: exit 0", args)
		}
	}
	if after, _ := os.ReadFile(filepath.Join(dir, "registrar.jwk")); !bytes.Equal(before, after) {
		t.Fatal("a key was overwritten")
	}
}

// TestCredentialNewAppend: `credential new --append FILE` adds the stored
// credential to the --credentials file (created 0600), prints only its
// secret, refuses a second credential of the same id, and the file loads
// as serve loads it, the secrets authenticating as their roles.
func TestCredentialNewAppend(t *testing.T) {
	file := filepath.Join(t.TempDir(), "credentials.json")
	secrets := map[string]string{}
	for _, tc := range []struct{ role, id string }{{"approver", "alice"}, {"approver", "bob"}, {"backend", "github-backend"}} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), []string{"credential", "new", "--role", tc.role, "--id", tc.id, "--append", file}, nil, &out, &errb); code != 0 {
			t.Fatalf("credential new %s: exit %d %s", tc.id, code, errb.String())
		}
		var got struct{ Secret, ID string }
		if err := json.Unmarshal(out.Bytes(), &got); err != nil || got.Secret == "" || got.ID != tc.id || strings.Contains(out.String(), "hash") {
			t.Fatalf("printed %s (%v)", out.String(), err)
		}
		secrets[tc.id] = got.Secret
	}
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("credentials file: %v %v", err, fi)
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"credential", "new", "--role", "host", "--id", "alice", "--append", file}, nil, &out, &errb); code == 0 {
		t.Fatal("a second credential of id alice was appended")
	}
	auth, err := loadCredentials(file)
	if err != nil {
		t.Fatal(err)
	}
	for id, secret := range secrets {
		if c, ok := auth.Lookup(api.Secret(secret)); !ok || c.ID != id {
			t.Errorf("secret of %s authenticates as %+v %v", id, c, ok)
		}
	}
}

// TestInitThenServe: `authzd init` writes a setup that `serve --config`
// accepts unchanged: the server starts (embedded etcd on free ports, its
// data beside the configuration), is ready (it can sign), takes a
// manifest signed with the generated registrar key from the registrar's
// secret, and knows two approvers and the pool's backend. A second init
// into the same directory is refused.
func TestInitThenServe(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "fcd")
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"init", "--pool", "github-v1-4", "--listen", "127.0.0.1:0", dir}, nil, &out, &errb); code != 0 {
		t.Fatalf("init: exit %d %s", code, errb.String())
	}
	var secrets map[string]string
	raw, err := os.ReadFile(filepath.Join(dir, "secrets.json"))
	if err != nil || json.Unmarshal(raw, &secrets) != nil {
		t.Fatalf("secrets.json: %v", err)
	}
	for _, id := range []string{"registrar", "host", "gateway", "approver-1", "approver-2", "operator", "backend-github-v1-4", "gateway-github-v1-4"} {
		if secrets[id] == "" {
			t.Errorf("no secret for %s", id)
		}
	}
	for _, f := range []string{"secrets.json", "credentials.json", "keys/signing.jwk", "keys/registrar.jwk", "authzd.yaml"} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v", f, err, fi)
		}
	}
	if code := run(context.Background(), []string{"init", dir}, nil, &out, &errb); code == 0 {
		t.Fatal("a second init overwrote the setup")
	}

	args := []string{"serve", "--config", filepath.Join(dir, "authzd.yaml")}
	c, url, err := cmdtest.Start(t, "authzd", listeningLine, func(ctx context.Context, stderr io.Writer) int {
		return run(ctx, args, nil, io.Discard, stderr)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(t)
	if code, body := readyz(t, url, http.StatusOK); code != http.StatusOK {
		t.Fatalf("readyz %d %s", code, body)
	}
	key, err := manifest.LoadPrivateKey(filepath.Join(dir, "keys", "registrar.jwk"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := os.ReadFile("../../examples/github/manifest-v1.4.json")
	if err != nil {
		t.Fatal(err)
	}
	jws, err := manifest.Sign(bytes.TrimSpace(m), key, manifest.TypManifest)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("POST", url+"/v1/manifests", bytes.NewReader(jws))
	req.Header.Set("Authorization", "Bearer "+secrets["registrar"])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("register with the generated key and secret: %d", resp.StatusCode)
	}
	for _, id := range []string{"approver-1", "approver-2"} {
		req, _ := http.NewRequest("GET", url+"/v1/approvers/me", nil)
		req.Header.Set("Authorization", "Bearer "+secrets[id])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", id, resp.StatusCode)
		}
	}
}
