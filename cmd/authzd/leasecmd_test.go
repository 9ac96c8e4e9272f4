package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/client"
	"github.com/fcd-authz/fcd/manifest"
)

// devClient calls a --dev server with the credentials it wrote, through
// the typed client.
type devClient struct {
	t   *testing.T
	url string
	dc  devCredentials
}

func newDevClient(t *testing.T, url, dataDir string) *devClient {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dataDir, "dev-credentials.json"))
	if err != nil {
		t.Fatal(err)
	}
	c := &devClient{t: t, url: url}
	if err := json.Unmarshal(raw, &c.dc); err != nil {
		t.Fatal(err)
	}
	return c
}

// as is a client of the server with role's credential.
func (c *devClient) as(role api.Role) *client.ClientWithResponses {
	c.t.Helper()
	cl, err := client.New(c.url, string(c.dc.Credentials[role]))
	if err != nil {
		c.t.Fatal(err)
	}
	return cl
}

// must fails the test on err, naming what was called.
func (c *devClient) must(what string, err error) {
	c.t.Helper()
	if err != nil {
		c.t.Fatalf("%s: %v", what, err)
	}
}

// uncertainLease registers the github v1.4 example (once), forms and
// admits a read call, claims its lease and reports it uncertain, as a
// fence does when the backend's answer was lost. It returns the lease and
// the formation.
func (c *devClient) uncertainLease(session string) (string, string) {
	c.t.Helper()
	ctx := c.t.Context()
	key, err := manifest.LoadPrivateKey(c.dc.Keys["registrar"])
	if err != nil {
		c.t.Fatal(err)
	}
	m, err := os.ReadFile("../../examples/github/manifest-v1.4.json")
	if err != nil {
		c.t.Fatal(err)
	}
	jws, err := manifest.Sign(bytes.TrimSpace(m), key, manifest.TypManifest)
	if err != nil {
		c.t.Fatal(err)
	}
	_, err = c.as(api.RoleRegistrar).RegisterManifestWithBodyWithResponse(ctx, "application/jose", bytes.NewReader(jws))
	c.must("register", err)
	host := c.as(api.RoleHost)
	snap, err := host.CreateSnapshotWithResponse(ctx, client.SnapshotRequest{Servers: &[]string{"github"}})
	c.must("snapshot", err)
	args := map[string]any{"owner": "octo", "repo": session}
	formed, err := host.CreateFormationWithResponse(ctx, client.FormationRequest{Snapshot: snap.JSON201.Id, Session: session, Tool: "github/get_repository", Arguments: &args})
	c.must("form", err)
	formation := formed.JSON201.Id
	admitted, err := host.AdmitFormationWithResponse(ctx, formation)
	c.must("admit", err)
	payload, err := base64.RawURLEncoding.DecodeString(strings.Split(admitted.JSON200.Token, ".")[1])
	if err != nil {
		c.t.Fatal(err)
	}
	var claims struct {
		Lease    string `json:"jti"`
		Epoch    string `json:"fcd_epoch"`
		Revision int    `json:"fcd_revision"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		c.t.Fatal(err)
	}
	backend := c.as(api.RoleBackend)
	_, err = backend.ClaimLeaseWithResponse(ctx, claims.Lease, client.ClaimRequest{Claim: "cl_" + session, Epoch: claims.Epoch, Revision: claims.Revision})
	c.must("claim", err)
	claim := "cl_" + session
	_, err = backend.CompleteLeaseWithResponse(ctx, claims.Lease, client.CompleteRequest{Outcome: client.CompleteRequestOutcomeUncertain, Claim: &claim})
	c.must("complete", err)
	return claims.Lease, formation
}

// isStatus says whether err is a problem answer of status.
func isStatus(err error, status int) bool {
	p, ok := errors.AsType[*client.Problem](err)
	return ok && p.Status == status
}

// status is the formation's status.
func (c *devClient) status(formation string) client.FormationStatus {
	c.t.Helper()
	got, err := c.as(api.RoleOperator).GetFormationWithResponse(c.t.Context(), formation)
	c.must("get formation", err)
	return got.JSON200.Status
}

// TestLeaseResolveCommand runs `authzd lease resolve` against a real
// `serve --dev`, which generates an operator key and so requires signed
// resolutions: a bare bearer resolution is refused, a resolution signed
// with another key is refused with its problem and exit 1, the lease
// staying uncertain; one signed with the dev operator key closes it, is
// kept, and a second attempt is refused lease-closed. The credential and
// URL also come from the environment --dev's env file sets.
// sign-resolution prints a document that verifies against the operator
// keys.
func TestLeaseResolveCommand(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	url, stop := startServer(t, dir, "--dev")
	defer stop()
	c := newDevClient(t, url, dir)
	if c.dc.Keys["operator"] == "" || c.dc.OperatorKeys == "" {
		t.Fatalf("--dev generated no operator key: %+v", c.dc)
	}
	env, err := os.ReadFile(filepath.Join(dir, devEnvFile))
	if err != nil || !strings.Contains(string(env), "export FCD_OPERATOR_KEY="+c.dc.Keys["operator"]+"\n") {
		t.Fatalf("env file: %v\n%s", err, env)
	}
	credFile := filepath.Join(t.TempDir(), "operator-credential")
	if err := os.WriteFile(credFile, []byte(string(c.dc.Credentials[api.RoleOperator])+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	approverFile := filepath.Join(t.TempDir(), "approver-credential")
	if err := os.WriteFile(approverFile, []byte(c.dc.Credentials[api.RoleApprover]), 0o600); err != nil {
		t.Fatal(err)
	}
	leaseID, formation := c.uncertainLease("cli-a")
	cli := func(args ...string) (int, string, string) {
		t.Helper()
		var out, errb bytes.Buffer
		code := run(context.Background(), args, nil, &out, &errb)
		return code, out.String(), errb.String()
	}

	// The dev server requires signed resolutions.
	outcome, reason := client.ResolveRequestOutcomeNoEffect, "x"
	if _, err := c.as(api.RoleOperator).ResolveLeaseWithResponse(t.Context(), leaseID, client.ResolveRequest{Outcome: &outcome, Reason: &reason}); !isStatus(err, http.StatusForbidden) {
		t.Fatalf("a bare resolution on a server with operator keys: %v, want 403", err)
	}

	for _, tc := range []struct {
		note string
		args []string
		code int
		errs string
	}{
		{"no key", []string{"lease", "resolve", "--outcome", "no_effect", "--reason", "r", leaseID}, 2, "--key"},
		{"no lease", []string{"lease", "resolve", "--key", c.dc.Keys["operator"], "--outcome", "no_effect", "--reason", "r"}, 2, "LEASE"},
		{"two leases", []string{"lease", "resolve", "--key", c.dc.Keys["operator"], "--outcome", "no_effect", "--reason", "r", leaseID, "ls_other"}, 2, "ls_other"},
		{"bad outcome", []string{"lease", "resolve", "--key", c.dc.Keys["operator"], "--outcome", "uncertain", "--reason", "r", leaseID}, 2, "--outcome"},
		{"no reason", []string{"lease", "resolve", "--key", c.dc.Keys["operator"], "--outcome", "effect", leaseID}, 2, "--reason"},
		{"unknown subcommand", []string{"lease", "close", leaseID}, 2, "unknown lease command"},
		{"signed with the registrar's key", []string{"lease", "resolve", "--key", c.dc.Keys["registrar"], "--url", url, "--credential-file", credFile,
			"--outcome", "no_effect", "--reason", "checked", "--operator", "dana", leaseID}, 1, "403 resolution-invalid"},
		{"an approver's credential", []string{"lease", "resolve", "--key", c.dc.Keys["operator"], "--url", url, "--credential-file", approverFile,
			"--outcome", "no_effect", "--reason", "checked", "--operator", "dana", leaseID}, 1, "403 forbidden-role"},
	} {
		code, out, errs := cli(tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.errs) || out != "" {
			t.Fatalf("%s: exit %d, stdout %q, stderr %q; want exit %d naming %q", tc.note, code, out, errs, tc.code, tc.errs)
		}
		if st := c.status(formation); st != "uncertain" {
			t.Fatalf("%s: the formation is %s", tc.note, st)
		}
	}

	// Flags may follow the lease.
	code, out, errs := cli("lease", "resolve", leaseID, "--key", c.dc.Keys["operator"], "--url", url, "--credential-file", credFile,
		"--outcome", "no-effect", "--reason", "the repository was never created", "--operator", "dana@example.com")
	if code != 0 {
		t.Fatalf("lease resolve: exit %d\n%s", code, errs)
	}
	var answer map[string]any
	if err := json.Unmarshal([]byte(out), &answer); err != nil {
		t.Fatalf("lease resolve printed %q: %v", out, err)
	}
	operatorKey, err := manifest.LoadPrivateKey(c.dc.Keys["operator"])
	if err != nil {
		t.Fatal(err)
	}
	if answer["lease"] != leaseID || answer["outcome"] != "no_effect" || answer["formation"] != formation ||
		answer["signer"] != operatorKey.KeyID() || answer["operator"] != "dana@example.com" {
		t.Fatalf("lease resolve answered %s", out)
	}
	if st := c.status(formation); st != "rejected" {
		t.Fatalf("after the resolution the formation is %s", st)
	}
	kept, err := c.as(api.RoleOperator).GetLeaseResolutionWithResponse(t.Context(), leaseID)
	if err != nil || kept.JSON200 == nil || kept.JSON200.Digest != answer["digest"] || kept.JSON200.Reason != "the repository was never created" {
		t.Fatalf("kept resolution: %v %+v", err, kept)
	}
	code, _, errs = cli("lease", "resolve", "--key", c.dc.Keys["operator"], "--url", url, "--credential-file", credFile,
		"--outcome", "effect", "--reason", "again", leaseID)
	if code != 1 || !strings.Contains(errs, "409 lease-closed") {
		t.Fatalf("resolving again: exit %d, %s", code, errs)
	}

	// From the environment: FCD_URL and FCD_OPERATOR, as the env file sets.
	other, otherFormation := c.uncertainLease("cli-b")
	t.Setenv("FCD_URL", url)
	t.Setenv("FCD_OPERATOR", string(c.dc.Credentials[api.RoleOperator]))
	if code, out, errs := cli("lease", "resolve", "--key", c.dc.Keys["operator"], "--outcome", "effect", "--reason", "it ran", other); code != 0 ||
		!strings.Contains(out, `"outcome": "effect"`) {
		t.Fatalf("lease resolve from the environment: exit %d\n%s%s", code, out, errs)
	}
	if st := c.status(otherFormation); st != "completed" {
		t.Fatalf("after an effect resolution the formation is %s", st)
	}

	// sign-resolution prints the document only.
	code, out, errs = cli("lease", "sign-resolution", "--key", c.dc.Keys["operator"], "--outcome", "effect", "--reason", "r", "--operator", "o", "ls_x")
	if code != 0 {
		t.Fatalf("sign-resolution: exit %d %s", code, errs)
	}
	v, err := manifest.LoadVerifier(c.dc.OperatorKeys)
	if err != nil {
		t.Fatal(err)
	}
	sr, err := v.VerifyResolution([]byte(out), time.Now())
	if err != nil || sr.Resolution.Lease != "ls_x" || sr.Resolution.Operator != "o" || sr.Resolution.Outcome != "effect" {
		t.Fatalf("sign-resolution printed %q: %v %+v", out, err, sr)
	}
}
