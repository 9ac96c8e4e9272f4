package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/client"
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
	// --if-missing keeps the pair there (exit 0), as a container's init
	// step that runs again must.
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"keys", "new", "--kind", "registrar", "--if-missing", "--out", dir}, nil, &out, &errb); code != 0 || !strings.Contains(out.String(), `"kept": true`) {
		t.Errorf("keys new --if-missing on an existing pair: exit %d, %s %s", code, out.String(), errb.String())
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
	auth, err := api.LoadCredentials(file)
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
	secrets := map[string]string{}
	for _, id := range []string{"registrar", "host", "gateway", "approver-1", "approver-2", "operator", "backend-github-v1-4", "gateway-github-v1-4"} {
		raw, err := os.ReadFile(filepath.Join(dir, "secrets", id))
		if secrets[id] = strings.TrimSpace(string(raw)); err != nil || secrets[id] == "" {
			t.Errorf("no secret for %s: %v", id, err)
		}
		if fi, err := os.Stat(filepath.Join(dir, "secrets", id)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("secrets/%s: %v %v", id, err, fi)
		}
	}
	for _, f := range []string{"credentials.json", "keys/signing.jwk", "keys/registrar.jwk", "authzd.yaml"} {
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
	readyz(t, url, http.StatusOK)
	// The registrar signs and registers with the generated key and its
	// secret file, through the CLI.
	secret := func(id string) string { return filepath.Join(dir, "secrets", id) }
	cmd := func(args ...string) (string, error) {
		t.Helper()
		var out, errb bytes.Buffer
		if code := run(context.Background(), args, nil, &out, &errb); code != 0 {
			return out.String(), fmt.Errorf("authzd %s: exit %d: %s", strings.Join(args, " "), code, strings.TrimSpace(errb.String()))
		}
		return out.String(), nil
	}
	jws := filepath.Join(t.TempDir(), "v1.4.jws")
	signed, err := cmd("manifest", "sign", "--key", filepath.Join(dir, "keys", "registrar.jwk"), "../../examples/github/manifest-v1.4.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(jws, []byte(signed), 0o600); err != nil {
		t.Fatal(err)
	}
	reply, err := cmd("manifest", "register", "--url", url, "--credential-file", secret("registrar"), jws)
	var reg struct{ Epoch string }
	if err != nil || json.Unmarshal([]byte(reply), &reg) != nil || !strings.HasPrefix(reg.Epoch, "sha256:") {
		t.Fatalf("manifest register with the generated key and secret: %v %s", err, reply)
	}
	if _, err := cmd("manifest", "register", "--url", url, "--credential-file", secret("host"), jws); err == nil ||
		!strings.Contains(err.Error(), "forbidden-role") {
		t.Fatalf("a host registering: %v, want forbidden-role", err)
	}

	// A host forms a write (the typed client); the two approvers find it
	// and decide it from the CLI, each with their own secret.
	hostSecret, err := os.ReadFile(secret("host"))
	if err != nil {
		t.Fatal(err)
	}
	host, err := client.New(url, strings.TrimSpace(string(hostSecret)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	snap, err := host.CreateSnapshotWithResponse(ctx, client.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	form := func(name string) string {
		t.Helper()
		args := map[string]any{"name": name}
		f, err := host.CreateFormationWithResponse(ctx, client.FormationRequest{
			Snapshot: snap.JSON201.Id, Session: "init-then-serve", Tool: "github/create_repository", Arguments: &args,
		})
		if err != nil || f.JSON201 == nil || f.JSON201.Status != "pending_approval" {
			t.Fatalf("form %s: %v %s", name, err, f.Body)
		}
		return f.JSON201.Id
	}
	approved, denied := form("approved-from-the-cli"), form("denied-from-the-cli")
	as := func(id string, args ...string) []string {
		return append(args, "--url", url, "--credential-file", secret(id))
	}
	// A person reads tables; a program asks for the JSON.
	reply, err = cmd(as("approver-1", "formation", "pending")...)
	if err != nil || !strings.HasPrefix(reply, "FORMATION ") || !strings.Contains(reply, approved) || !strings.Contains(reply, denied) ||
		strings.Count(strings.TrimSpace(reply), "\n") != 2 || !strings.Contains(reply, "github/create_repository") || !strings.Contains(reply, "0/1") {
		t.Fatalf("formation pending: %v %s", err, reply)
	}
	reply, err = cmd(as("approver-1", "formation", "pending", "--json")...)
	var page struct{ Formations []struct{ ID string } }
	if err != nil || json.Unmarshal([]byte(reply), &page) != nil || len(page.Formations) != 2 {
		t.Fatalf("formation pending --json: %v %s", err, reply)
	}
	reply, err = cmd(as("approver-2", "formation", "show", approved)...)
	if err != nil || !strings.Contains(reply, "approved-from-the-cli") || !strings.Contains(reply, "approvals  0 of 1") ||
		!strings.Contains(reply, "status     pending_approval") || !strings.Contains(reply, "no difference between the releases") {
		t.Fatalf("formation show: %v %s", err, reply)
	}
	reply, err = cmd(as("approver-2", "formation", "show", "--json", approved)...)
	var shown struct{ ID, Status string }
	if err != nil || json.Unmarshal([]byte(reply), &shown) != nil || shown.ID != approved || shown.Status != "pending_approval" {
		t.Fatalf("formation show --json: %v %s", err, reply)
	}
	reply, err = cmd(as("approver-1", "formation", "approve", approved, "--reason", "reviewed")...)
	var f struct{ Status string }
	if err != nil || json.Unmarshal([]byte(reply), &f) != nil || f.Status != "ready" {
		t.Fatalf("formation approve: %v %s", err, reply)
	}
	if _, err := cmd(as("approver-1", "formation", "approve", approved, "--reason", "again")...); err == nil {
		t.Fatal("a second decision by one approver was taken")
	}
	reply, err = cmd(as("approver-2", "formation", "deny", denied, "--reason", "not this one")...)
	if err != nil || json.Unmarshal([]byte(reply), &f) != nil || f.Status != "denied" {
		t.Fatalf("formation deny: %v %s", err, reply)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{as("approver-1", "formation", "approve", approved), "--reason"},
		{as("approver-1", "formation", "approve", "--reason", "x"), "FORMATION"},
		{as("approver-1", "formation", "frobnicate", approved), "show, pending, approve, deny"},
		{as("approver-1", "formation", "show", "fm_unknown"), "formation-not-found"},
		{[]string{"formation", "show", approved, "--url", url, "--credential-file", filepath.Join(dir, "no-such-file")}, "no-such-file"},
		{as("approver-1", "manifest", "register"), "needs FILE"},
	} {
		if _, err := cmd(c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("authzd %v: %v, want an error naming %q", c.args, err, c.want)
		}
	}

}
