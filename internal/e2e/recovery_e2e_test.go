package e2e_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/client"
	"github.com/fcd-authz/fcd/internal/fixtures"
	"github.com/fcd-authz/fcd/internal/manifesttest"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/lestrrat-go/jwx/v2/jwk"
)

// recover recovers a formation as the host with req (zero for a retry).
// It answers the recovery's record (JSON201) or authzd's refusal.
func (s *stack) recover(id string, req client.RecoverFormationJSONRequestBody) (*client.RecoverFormationResponse, error) {
	s.t.Helper()
	r, err := s.as(api.RoleHost).RecoverFormationWithResponse(s.t.Context(), id, req)
	if err == nil && r.JSON201 == nil {
		s.t.Fatalf("recover %s: %d %s, want 201 or a problem", id, r.StatusCode(), r.Body)
	}
	return r, err
}

// claimUncertain claims an admitted lease with the backend credential
// under claim, then reports its outcome uncertain: what a backend whose
// relay to the tool broke after forwarding the call reports.
func (s *stack) claimUncertain(backend api.Secret, a admission, claim string) {
	s.t.Helper()
	c := s.with(backend)
	r, err := c.ClaimLeaseWithResponse(s.t.Context(), a.Lease,
		client.ClaimRequest{Claim: claim, Epoch: a.Claims.Epoch, Revision: int(a.Claims.Revision)})
	s.must("claim "+a.Lease, err)
	if r.JSON200 == nil {
		s.t.Fatalf("claim %s: %d %s, want 200", a.Lease, r.StatusCode(), r.Body)
	}
	done, err := c.CompleteLeaseWithResponse(s.t.Context(), a.Lease,
		client.CompleteRequest{Outcome: client.CompleteRequestOutcomeUncertain, Claim: &claim})
	s.must("report "+a.Lease+" uncertain", err)
	if done.JSON200 == nil {
		s.t.Fatalf("report %s uncertain: %d %s, want 200", a.Lease, done.StatusCode(), done.Body)
	}
}

// resolve resolves a lease as the operator with req: nil once resolved,
// or authzd's refusal.
func (s *stack) resolve(lease string, req client.ResolveRequest) error {
	s.t.Helper()
	r, err := s.as(api.RoleOperator).ResolveLeaseWithResponse(s.t.Context(), lease, req)
	if err == nil && r.JSON200 == nil {
		s.t.Fatalf("resolve %s: %d %s, want 200 or a problem", lease, r.StatusCode(), r.Body)
	}
	return err
}

// signedResolution is the request resolving lease no_effect with a
// resolution document signed by key, giving reason.
func signedResolution(t *testing.T, key jwk.Key, lease, reason string) client.ResolveRequest {
	t.Helper()
	jws, err := manifest.SignResolution(&manifest.Resolution{Lease: lease, Outcome: manifest.ResolutionNoEffect,
		Reason: reason, Operator: "ops@example", IssuedAt: time.Now().UTC()}, key)
	if err != nil {
		t.Fatal(err)
	}
	return client.ResolveRequest{Resolution: ptr(string(jws))}
}

// TestRecoveryEndToEnd: with the github fixture behind fencecheck, real
// etcd and authzd over HTTP, each failure mode the v1.4 manifest declares
// is recovered as it says, from what the fence reported of the backend's
// answer:
//   - rate_limited (retry): recovered once, the same call, and run once —
//     the backend sees the first formation as Fcd-Recovery-Of; a second
//     recovery of the same call is refused (recovery-exists);
//   - not_found (prompt_user): the recovery with new arguments needs an
//     approval of its own before it runs;
//   - validation_failed (abort): refused, naming the mode;
//   - an uncertain write holds its epoch (uncertainLeases), blocks its
//     recovery until an operator resolves it no_effect with a signed
//     document (unsigned, forged and other-lease documents are refused),
//     and its recovery then needs two approvers before it runs once.
func TestRecoveryEndToEnd(t *testing.T) {
	s := startStack(t, nil)
	snap := s.snapshot()
	c := connectFence(t, s.Fixture[poolV14], nil)
	const repo = `{"owner":"octo-org","repo":"hello-world"}`
	var failNext atomic.Value // the error name the next call answers
	s.setFail(func(_ context.Context, tool string) string {
		code, _ := failNext.Swap("").(string)
		return code
	})

	// retry
	failNext.Store("rate_limited")
	first := s.formRead(snap, "sess-retry", "get_repository", repo)
	if res, _, err := c.call(s.admit(first).Token, "get_repository", repo); err != nil || !res.IsError {
		t.Fatalf("the injected failure: %v %+v", err, res)
	}
	s.waitStatus(first.ID, "failed")
	r, err := s.recover(first.ID, client.RecoverFormationJSONRequestBody{})
	s.must("the retry", err)
	retry := formationFrom(r.JSON201)
	if rec := r.JSON201.Recovery; retry.Status != "ready" || rec == nil || rec.Of != first.ID || rec.Attempt != 2 ||
		rec.FailureMode == nil || rec.FailureMode.Error != "rate_limited" {
		t.Fatalf("the retry: %s", r.Body)
	}
	_, err = s.recover(first.ID, client.RecoverFormationJSONRequestBody{})
	s.refused("a second recovery", err, http.StatusConflict, "recovery-exists")
	a := s.admit(retry)
	if a.Claims.RecoveryOf != first.ID {
		t.Fatalf("the retry's token: fcd_recovery_of %q, want %s", a.Claims.RecoveryOf, first.ID)
	}
	if res, _, err := c.call(a.Token, "get_repository", repo); err != nil || res.IsError {
		t.Fatalf("the retry: %v %+v", err, res)
	}
	s.waitStatus(retry.ID, "completed")
	reads := s.Rec.Effects(fixtures.Filter{Tool: "get_repository", Kind: fixtures.KindRead})
	if len(reads) != 1 || reads[0].Lease != a.Lease || reads[0].RecoveryOf != first.ID {
		t.Fatalf("get_repository ran %+v, want once under the retry's lease with Fcd-Recovery-Of %s", reads, first.ID)
	}

	// prompt_user
	const missing = `{"owner":"octo-org","repo":"no-such-repo"}`
	lost := s.formRead(snap, "sess-prompt", "get_repository", missing)
	if res, _, err := c.call(s.admit(lost).Token, "get_repository", missing); err != nil || !res.IsError {
		t.Fatalf("get_repository of a missing repository: %v %+v", err, res)
	}
	s.waitStatus(lost.ID, "failed")
	r, err = s.recover(lost.ID, client.RecoverFormationJSONRequestBody{Arguments: object(t, repo)})
	s.must("the prompt_user recovery", err)
	asked := formationFrom(r.JSON201)
	if asked.Status != "pending_approval" || r.JSON201.ApprovalsRequired != 1 {
		t.Fatalf("the prompt_user recovery: %s", r.Body)
	}
	if code, slug := s.readmit(asked); code != http.StatusForbidden || slug != "not-approved" {
		t.Fatalf("admitting it unapproved: %d %s", code, slug)
	}
	s.approve(asked)
	if res, _, err := c.call(s.admit(asked).Token, "get_repository", repo); err != nil || res.IsError {
		t.Fatalf("the approved recovery: %v %+v", err, res)
	}
	s.waitStatus(asked.ID, "completed")

	// abort
	failNext.Store("validation_failed")
	w := s.formReady(snap, "sess-abort", "bad-name")
	if res, _, err := c.call(s.admit(w).Token, "create_repository", `{"name":"bad-name"}`); err != nil || !res.IsError {
		t.Fatalf("the injected validation failure: %v %+v", err, res)
	}
	s.waitStatus(w.ID, "failed")
	_, err = s.recover(w.ID, client.RecoverFormationJSONRequestBody{})
	if p := s.refused("recovering an abort", err, http.StatusConflict, "recovery-not-allowed"); !strings.Contains(p.Detail, `"validation_failed"`) || !strings.Contains(p.Detail, "abort") {
		t.Fatalf("recovering an abort: %v, want the detail to name \"validation_failed\" and abort", p)
	}

	// uncertain, resolved no_effect: the backend claims, then reports
	// uncertain (its relay to the tool broke after forwarding).
	u := s.formReady(snap, "sess-uncertain", "maybe-made")
	ua := s.admit(u)
	s.claimUncertain(s.poolCreds[poolV14], ua, "cl-u")
	ep, err := s.as(api.RoleOperator).GetEpochWithResponse(t.Context(), s.Epoch[poolV14])
	s.must("read the epoch", err)
	if ep.JSON200 == nil || ep.JSON200.UncertainLeases != 1 {
		t.Fatalf("the epoch with an uncertain lease: %s", ep.Body)
	}
	_, err = s.recover(u.ID, client.RecoverFormationJSONRequestBody{})
	s.refused("recovering an uncertain call", err, http.StatusConflict, "recovery-blocked")
	// Resolution: unsigned, forged (another key) and for another lease are
	// refused and change nothing; the operator's signed document resolves.
	const reason = "the repository does not exist"
	for _, tc := range []struct {
		note string
		req  client.ResolveRequest
		slug string
	}{
		{"unsigned", client.ResolveRequest{Outcome: ptr(client.ResolveRequestOutcomeNoEffect), Reason: ptr("trust me")}, "resolution-unsigned"},
		{"forged", signedResolution(t, manifesttest.NewSigner(t).Key, ua.Lease, reason), "resolution-invalid"},
		{"another lease", signedResolution(t, s.operatorKey, a.Lease, reason), "resolution-invalid"},
	} {
		s.refused("a "+tc.note+" resolution", s.resolve(ua.Lease, tc.req), http.StatusForbidden, tc.slug)
	}
	_, err = s.recover(u.ID, client.RecoverFormationJSONRequestBody{})
	if p := s.problem("after refused resolutions", err); p.Slug() != "recovery-blocked" {
		t.Fatalf("after refused resolutions: %v", p)
	}
	s.must("resolve", s.resolve(ua.Lease, signedResolution(t, s.operatorKey, ua.Lease, reason)))
	r, err = s.recover(u.ID, client.RecoverFormationJSONRequestBody{})
	s.must("the recovery of an uncertain write", err)
	again := formationFrom(r.JSON201)
	if again.Status != "pending_approval" || r.JSON201.ApprovalsRequired != 2 || count(again.Rules, "recover-uncertain-write") != 2 {
		t.Fatalf("the recovery of an uncertain write: %s", r.Body)
	}
	for _, approver := range []api.Secret{s.creds[api.RoleApprover], s.approver2} {
		s.approveAs(approver, again)
	}
	if res, _, err := c.call(s.admit(again).Token, "create_repository", `{"name":"maybe-made"}`); err != nil || res.IsError {
		t.Fatalf("the recovered write: %v %+v", err, res)
	}
	s.waitStatus(again.ID, "completed")
	writes := s.Rec.Effects(fixtures.Filter{Tool: "create_repository", Kind: fixtures.KindWrite})
	if len(writes) != 1 || writes[0].RecoveryOf != u.ID {
		t.Fatalf("create_repository wrote %+v, want once, as the recovery of %s", writes, u.ID)
	}
}

// TestUncertainCallHoldsRetirement: a write its backend reported uncertain
// keeps its epoch from retiring (409 leases-outstanding, counting it as
// uncertain) whatever else is done; once an operator's signed document
// resolves it no_effect the epoch retires, and a recovery of the call is
// formed but, its source now STALE and no successor captured, is never
// admitted (source-stale).
func TestUncertainCallHoldsRetirement(t *testing.T) {
	s := startStack(t, nil)
	snap := s.snapshot()
	u := s.formReady(snap, "sess-hold", "held-back")
	a := s.admit(u)
	s.claimUncertain(s.poolCreds[poolV14], a, "cl-h")
	s.drain(poolV14)
	_, err := s.as(api.RoleOperator).RetireEpochWithResponse(t.Context(), s.Epoch[poolV14], nil)
	if p := s.refused("retiring with an uncertain lease", err, http.StatusConflict, "leases-outstanding"); p.Details.UncertainLeases == nil || *p.Details.UncertainLeases != 1 {
		t.Fatalf("retiring with an uncertain lease: %+v, want uncertainLeases 1", p.Details)
	}
	s.must("resolve", s.resolve(a.Lease, signedResolution(t, s.operatorKey, a.Lease, "checked the backend: nothing created")))
	s.retireDrained(poolV14)
	rec, err := s.recover(u.ID, client.RecoverFormationJSONRequestBody{})
	s.must("recover", err)
	f := formationFrom(rec.JSON201)
	for _, approver := range []api.Secret{s.creds[api.RoleApprover], s.approver2} {
		s.approveAs(approver, f)
	}
	if code, slug := s.readmit(f); code != http.StatusGone || slug != "source-stale" {
		t.Fatalf("admitting the recovery of a call whose source retired: %d %s", code, slug)
	}
}
