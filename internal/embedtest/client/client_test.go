package client_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/client"
)

// tokenFacts are the claims of a dispatch token a backend's claim names.
type tokenFacts struct {
	Lease    string `json:"jti"`
	Epoch    string `json:"fcd_epoch"`
	Revision int    `json:"fcd_revision"`
}

// factsOf reads the claims of a dispatch token without verifying it (the
// fence's part, not the client's).
func factsOf(t *testing.T, token string) tokenFacts {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("not a compact JWS: %q", token)
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var f tokenFacts
	if err := json.Unmarshal(payload, &f); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestRoundTrip walks one call through every role with the typed client
// against a real server: a registrar registers a signed manifest, a host
// snapshots the catalog and forms calls, an approver approves the write,
// a gateway admits, a backend claims and completes the lease, and the
// formation reads completed.
func TestRoundTrip(t *testing.T) {
	s := startServer(t, serverConfig{})
	ctx := context.Background()
	registrar, host, approver, gateway, backend := s.as("registrar"), s.as("host"), s.as("approver"), s.as("gateway"), s.as("backend")

	reg, err := registrar.RegisterManifestWithBodyWithResponse(ctx, "application/jose", bytes.NewReader(s.signedExample("v1.4")))
	if err != nil {
		t.Fatalf("register: %v", err)
	}
	if reg.StatusCode() != http.StatusCreated || reg.JSON201 == nil || reg.JSON201.State != client.EpochStateACTIVE || reg.JSON201.Server != "github" {
		t.Fatalf("register answered %d: %s", reg.StatusCode(), reg.Body)
	}
	epoch := reg.JSON201.Epoch
	again, err := registrar.RegisterManifestWithBodyWithResponse(ctx, "application/jose", bytes.NewReader(s.signedExample("v1.4")))
	if err != nil || again.StatusCode() != http.StatusOK || again.JSON200 == nil || again.JSON200.Epoch != epoch {
		t.Fatalf("registering again must answer 200 with the same epoch: %v %+v", err, again)
	}

	snap, err := host.CreateSnapshotWithResponse(ctx, client.SnapshotRequest{})
	if err != nil || snap.JSON201 == nil {
		t.Fatalf("snapshot: %v %+v", err, snap)
	}
	full := client.GetSnapshotParamsViewFull
	got, err := host.GetSnapshotWithResponse(ctx, snap.JSON201.Id, &client.GetSnapshotParams{View: &full})
	if err != nil || got.JSON200 == nil {
		t.Fatalf("get snapshot: %v %+v", err, got)
	}
	catalog, err := got.JSON200.AsSnapshotFull()
	if err != nil {
		t.Fatal(err)
	}
	var write *client.FullTool
	for i, tool := range catalog.Tools {
		if tool.Name == "github/create_repository" {
			write = &catalog.Tools[i]
		}
	}
	if write == nil || write.Epoch != epoch || write.Descriptor.SideEffects != client.SideEffectWrite || !write.Descriptor.RequiresApproval {
		t.Fatalf("full snapshot lacks github/create_repository as a write needing approval: %+v", catalog.Tools)
	}

	args := map[string]any{"name": "demo"}
	formed, err := host.CreateFormationWithResponse(ctx, client.FormationRequest{
		Snapshot: snap.JSON201.Id, Session: "s1", Tool: "github/create_repository", Arguments: &args,
		Principal: &client.FormationRequest_Principal{Id: ptr("alice")},
	})
	if err != nil || formed.JSON201 == nil {
		t.Fatalf("form: %v %+v", err, formed)
	}
	fm := formed.JSON201
	if fm.Status != client.FormationStatusPendingApproval || fm.ApprovalsRequired != 1 || fm.Principal.Id != "alice" {
		t.Fatalf("formation: %s", formed.Body)
	}

	// Admitting before the approval is refused, as a typed problem.
	_, err = gateway.AdmitFormationWithResponse(ctx, fm.Id)
	if p := problemOf(t, err); p.Status != http.StatusForbidden || p.Slug() != "not-approved" {
		t.Fatalf("admit before approval: %v", err)
	}

	approved, err := approver.ApproveFormationWithResponse(ctx, fm.Id, client.ApprovalRequest{Decision: client.ApprovalRequestDecisionApprove, Digest: fm.Digest, Reason: ptr("reviewed")})
	if err != nil || approved.JSON200 == nil || approved.JSON200.Status != client.FormationStatusReady {
		t.Fatalf("approve: %v %+v", err, approved)
	}

	admitted, err := gateway.AdmitFormationWithResponse(ctx, fm.Id)
	if err != nil || admitted.JSON200 == nil {
		t.Fatalf("admit: %v %+v", err, admitted)
	}
	adm := admitted.JSON200
	facts := factsOf(t, adm.Token)
	if adm.Target.Epoch != epoch || facts.Lease != adm.Lease || facts.Epoch != epoch {
		t.Fatalf("admission %+v, token %+v: want epoch %s and the lease as jti", adm, facts, epoch)
	}

	claimed, err := backend.ClaimLeaseWithResponse(ctx, adm.Lease, client.ClaimRequest{Claim: "cl_client", Epoch: facts.Epoch, Revision: facts.Revision})
	if err != nil || claimed.JSON200 == nil || claimed.JSON200.Claim != "cl_client" {
		t.Fatalf("claim: %v %+v", err, claimed)
	}
	done, err := backend.CompleteLeaseWithResponse(ctx, adm.Lease, client.CompleteRequest{Outcome: client.CompleteRequestOutcomeEffect, Claim: ptr("cl_client")})
	if err != nil || done.JSON200 == nil || done.JSON200.Outcome != client.OutcomeEffect || done.JSON200.Formation != fm.Id {
		t.Fatalf("complete: %v %+v", err, done)
	}

	final, err := host.GetFormationWithResponse(ctx, fm.Id)
	if err != nil || final.JSON200 == nil || final.JSON200.Status != client.FormationStatusCompleted || final.JSON200.Lease == nil || *final.JSON200.Lease != adm.Lease {
		t.Fatalf("formation after its effect: %v %+v", err, final)
	}

	// A formation denied by policy is a documented answer, not a problem:
	// its record comes in JSON403.
	del := map[string]any{"owner": "octo", "repo": "demo"}
	denied, err := host.CreateFormationWithResponse(ctx, client.FormationRequest{Snapshot: snap.JSON201.Id, Session: "s1", Tool: "github/delete_repository", Arguments: &del,
		Principal: &client.FormationRequest_Principal{Id: ptr("alice")}})
	if err != nil || denied.StatusCode() != http.StatusForbidden || denied.JSON403 == nil || denied.JSON403.Status != client.FormationStatusDenied {
		t.Fatalf("denied formation: %v %+v", err, denied)
	}
}

// problemOf is err as a *client.Problem, failing t when it is not one.
func problemOf(t *testing.T, err error) *client.Problem {
	t.Helper()
	var p *client.Problem
	if !errors.As(err, &p) {
		t.Fatalf("error %v (%T) is not a *client.Problem", err, err)
	}
	return p
}

func ptr[T any](v T) *T { return &v }

// TestProblems checks that refusals of a real server reach the caller as
// *client.Problem errors with the status, the slug, the detail and the
// extension members of the answer.
func TestProblems(t *testing.T) {
	s := startServer(t, serverConfig{formationLimit: api.RateLimit{Rate: 0.001, Burst: 1}})
	ctx := context.Background()
	registrar, host := s.as("registrar"), s.as("host")
	if _, err := registrar.RegisterManifestWithBodyWithResponse(ctx, "application/jose", bytes.NewReader(s.signedExample("v1.4"))); err != nil {
		t.Fatal(err)
	}
	snap, err := host.CreateSnapshotWithResponse(ctx, client.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	unsignedBad := []byte(`{"not":"a manifest"}`)
	lintFails := func() []byte {
		var m map[string]any
		if err := json.Unmarshal(s.signedExamplePayload("v1.4"), &m); err != nil {
			t.Fatal(err)
		}
		for _, tool := range m["tools"].([]any) {
			tool.(map[string]any)["requiresApproval"] = false
		}
		return s.sign(m)
	}()
	noArgs := map[string]any{}

	cases := []struct {
		note   string
		call   func() error
		status int
		slug   string
		verify func(t *testing.T, p *client.Problem)
	}{
		{note: "no credential", status: 401, slug: "unauthenticated",
			call: func() error { _, err := s.as("").ListEpochsWithResponse(ctx, nil); return err },
			verify: func(t *testing.T, p *client.Problem) {
				if p.Header.Get("WWW-Authenticate") == "" {
					t.Errorf("no WWW-Authenticate challenge in %v", p.Header)
				}
			}},
		{note: "wrong role", status: 403, slug: "forbidden-role",
			call: func() error {
				_, err := host.RegisterManifestWithBodyWithResponse(ctx, "application/jose", bytes.NewReader(s.signedExample("v1.4")))
				return err
			}},
		{note: "not a JWS", status: 400, slug: "malformed-document",
			call: func() error {
				_, err := registrar.RegisterManifestWithBodyWithResponse(ctx, "application/jose", bytes.NewReader(unsignedBad))
				return err
			}},
		{note: "lint errors carry their findings", status: 422, slug: "lint-failed",
			call: func() error {
				_, err := registrar.RegisterManifestWithBodyWithResponse(ctx, "application/jose", bytes.NewReader(lintFails))
				return err
			},
			verify: func(t *testing.T, p *client.Problem) {
				if p.Details.Findings == nil || len(*p.Details.Findings) == 0 || (*p.Details.Findings)[0].Severity != client.FindingSeverityError {
					t.Errorf("findings: %+v", p.Details.Findings)
				}
			}},
		{note: "unknown formation", status: 404, slug: "formation-not-found",
			call: func() error {
				_, err := host.GetFormationWithResponse(ctx, "fm_aaaaaaaaaaaaaaaaaaaaaaaaaa")
				return err
			},
			verify: func(t *testing.T, p *client.Problem) {
				if p.Instance != "/v1/formations/fm_aaaaaaaaaaaaaaaaaaaaaaaaaa" {
					t.Errorf("instance %q", p.Instance)
				}
			}},
		{note: "unknown route is a problem too", status: 404, slug: "not-found",
			call: func() error {
				c, err := client.New(s.url+"/nothing-here", string(s.secrets["host"]))
				if err != nil {
					return err
				}
				_, err = c.GetFormationWithResponse(ctx, "fm_aaaaaaaaaaaaaaaaaaaaaaaaaa")
				return err
			}},
		{note: "over the formation rate, Retry-After", status: 429, slug: "rate-limited",
			call: func() error {
				form := func() error {
					_, err := host.CreateFormationWithResponse(ctx, client.FormationRequest{Snapshot: snap.JSON201.Id, Session: "s9", Tool: "github/get_repository", Arguments: &noArgs})
					return err
				}
				// The first may pass or fail on its arguments; the bucket
				// holds one, so the second is over the rate.
				_ = form()
				return form()
			},
			verify: func(t *testing.T, p *client.Problem) {
				if p.RetryAfter <= 0 {
					t.Errorf("RetryAfter %v, want the server's Retry-After (%q)", p.RetryAfter, p.Header.Get("Retry-After"))
				}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.note, func(t *testing.T) {
			err := tc.call()
			p := problemOf(t, err)
			if p.Status != tc.status || p.Slug() != tc.slug || p.Type != client.ProblemTypeBase+tc.slug {
				t.Fatalf("got %d %q (type %q), want %d %s", p.Status, p.Slug(), p.Type, tc.status, tc.slug)
			}
			if p.Title == "" || p.Detail == "" || p.Header.Get("Fcd-Problem") != tc.slug {
				t.Errorf("title %q, detail %q, Fcd-Problem %q: want all three", p.Title, p.Detail, p.Header.Get("Fcd-Problem"))
			}
			if msg := err.Error(); !strings.Contains(msg, tc.slug) || !strings.Contains(msg, p.Detail) {
				t.Errorf("error %q names neither the slug nor the detail", msg)
			}
			if tc.verify != nil {
				tc.verify(t, p)
			}
		})
	}
}
