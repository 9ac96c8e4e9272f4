package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fcd-authz/fcd/api"
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
