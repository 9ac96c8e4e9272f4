package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/internal/fixtures"
	"github.com/fcd-authz/fcd/internal/manifesttest"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/lestrrat-go/jwx/v2/jwk"
)

// recover recovers a formation as the host, with body (nil for a retry).
func (s *stack) recover(id string, body []byte) reply {
	s.t.Helper()
	return s.do("POST", "/v1/formations/"+id+"/recover", api.RoleHost, body)
}

// formationOf reads a reply that answers a formation.
func formationOf(r reply) formation {
	f := formation{}
	f.ID, _ = r.Body["id"].(string)
	f.Status, _ = r.Body["status"].(string)
	f.Digest, _ = r.Body["digest"].(string)
	if d, ok := r.Body["decision"].(map[string]any); ok {
		es, _ := d["engines"].([]any)
		for _, e := range es {
			rules, _ := e.(map[string]any)["rules"].([]any)
			for _, rule := range rules {
				f.Rules = append(f.Rules, fmt.Sprint(rule))
			}
		}
	}
	return f
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
	r := s.recover(first.ID, nil)
	s.expect(r, http.StatusCreated)
	retry := formationOf(r)
	rec, _ := r.Body["recovery"].(map[string]any)
	mode, _ := rec["failureMode"].(map[string]any)
	if retry.Status != "ready" || rec["of"] != first.ID || rec["attempt"] != float64(2) || mode["error"] != "rate_limited" {
		t.Fatalf("the retry: %s", r.Raw)
	}
	if again := s.recover(first.ID, nil); again.Status != http.StatusConflict || slugOf(again) != "recovery-exists" {
		t.Fatalf("a second recovery: %d %s", again.Status, again.Raw)
	}
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
	r = s.recover(lost.ID, []byte(`{"arguments":`+repo+`}`))
	s.expect(r, http.StatusCreated)
	asked := formationOf(r)
	if asked.Status != "pending_approval" || r.Body["approvalsRequired"] != float64(1) {
		t.Fatalf("the prompt_user recovery: %s", r.Raw)
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
	if r := s.recover(w.ID, nil); r.Status != http.StatusConflict || slugOf(r) != "recovery-not-allowed" ||
		!strings.Contains(fmt.Sprint(r.Body["detail"]), `"validation_failed"`) || !strings.Contains(fmt.Sprint(r.Body["detail"]), "abort") {
		t.Fatalf("recovering an abort: %d %s", r.Status, r.Raw)
	}

	// uncertain, resolved no_effect: the backend claims, then reports
	// uncertain (its relay to the tool broke after forwarding).
	u := s.formReady(snap, "sess-uncertain", "maybe-made")
	ua := s.admit(u)
	backend := s.poolCreds[poolV14]
	claim := s.doAs("POST", "/v1/leases/"+ua.Lease+"/claim", backend,
		[]byte(fmt.Sprintf(`{"claim":"cl-u","epoch":%q,"revision":%d}`, ua.Claims.Epoch, ua.Claims.Revision)))
	s.expect(claim, http.StatusOK)
	s.expect(s.doAs("POST", "/v1/leases/"+ua.Lease+"/complete", backend, []byte(`{"outcome":"uncertain","claim":"cl-u"}`)), http.StatusOK)
	ep := s.do("GET", "/v1/epochs/"+s.Epoch[poolV14], api.RoleOperator, nil)
	if ep.Body["uncertainLeases"] != float64(1) {
		t.Fatalf("the epoch with an uncertain lease: %s", ep.Raw)
	}
	if r := s.recover(u.ID, nil); r.Status != http.StatusConflict || slugOf(r) != "recovery-blocked" {
		t.Fatalf("recovering an uncertain call: %d %s", r.Status, r.Raw)
	}
	// Resolution: unsigned, forged (another key) and for another lease are
	// refused and change nothing; the operator's signed document resolves.
	resolve := func(body []byte) reply {
		return s.do("POST", "/v1/leases/"+ua.Lease+"/resolve", api.RoleOperator, body)
	}
	signed := func(key jwk.Key, lease string) []byte {
		jws, err := manifest.SignResolution(&manifest.Resolution{Lease: lease, Outcome: manifest.ResolutionNoEffect,
			Reason: "the repository does not exist", Operator: "ops@example", IssuedAt: time.Now().UTC()}, key)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(map[string]string{"resolution": string(jws)})
		return b
	}
	for _, tc := range []struct {
		note string
		body []byte
		slug string
	}{
		{"unsigned", []byte(`{"outcome":"no_effect","reason":"trust me"}`), "resolution-unsigned"},
		{"forged", signed(manifesttest.NewSigner(t).Key, ua.Lease), "resolution-invalid"},
		{"another lease", signed(s.operatorKey, a.Lease), "resolution-invalid"},
	} {
		if r := resolve(tc.body); r.Status != http.StatusForbidden || slugOf(r) != tc.slug {
			t.Fatalf("a %s resolution: %d %s", tc.note, r.Status, r.Raw)
		}
	}
	if r := s.recover(u.ID, nil); slugOf(r) != "recovery-blocked" {
		t.Fatalf("after refused resolutions: %d %s", r.Status, r.Raw)
	}
	s.expect(resolve(signed(s.operatorKey, ua.Lease)), http.StatusOK)
	r = s.recover(u.ID, nil)
	s.expect(r, http.StatusCreated)
	again := formationOf(r)
	if again.Status != "pending_approval" || r.Body["approvalsRequired"] != float64(2) || count(again.Rules, "recover-uncertain-write") != 2 {
		t.Fatalf("the recovery of an uncertain write: %s", r.Raw)
	}
	for _, approver := range []api.Secret{s.creds[api.RoleApprover], s.approver2} {
		s.expect(s.doAs("POST", "/v1/formations/"+again.ID+"/approvals", approver,
			[]byte(fmt.Sprintf(`{"decision":"approve","digest":%q,"reason":"e2e"}`, again.Digest))), http.StatusOK)
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
	backend := s.poolCreds[poolV14]
	s.expect(s.doAs("POST", "/v1/leases/"+a.Lease+"/claim", backend,
		[]byte(fmt.Sprintf(`{"claim":"cl-h","epoch":%q,"revision":%d}`, a.Claims.Epoch, a.Claims.Revision))), http.StatusOK)
	s.expect(s.doAs("POST", "/v1/leases/"+a.Lease+"/complete", backend, []byte(`{"outcome":"uncertain","claim":"cl-h"}`)), http.StatusOK)
	s.drain(poolV14)
	r := s.do("POST", "/v1/epochs/"+s.Epoch[poolV14]+"/retire", api.RoleOperator, nil)
	if r.Status != http.StatusConflict || slugOf(r) != "leases-outstanding" || r.Body["uncertainLeases"] != float64(1) {
		t.Fatalf("retiring with an uncertain lease: %d %s", r.Status, r.Raw)
	}
	jws, err := manifest.SignResolution(&manifest.Resolution{Lease: a.Lease, Outcome: manifest.ResolutionNoEffect,
		Reason: "checked the backend: nothing created", Operator: "ops@example", IssuedAt: time.Now().UTC()}, s.operatorKey)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(map[string]string{"resolution": string(jws)})
	s.expect(s.do("POST", "/v1/leases/"+a.Lease+"/resolve", api.RoleOperator, body), http.StatusOK)
	s.retireDrained(poolV14)
	rec := s.recover(u.ID, nil)
	s.expect(rec, http.StatusCreated)
	f := formationOf(rec)
	for _, approver := range []api.Secret{s.creds[api.RoleApprover], s.approver2} {
		s.expect(s.doAs("POST", "/v1/formations/"+f.ID+"/approvals", approver,
			[]byte(fmt.Sprintf(`{"decision":"approve","digest":%q,"reason":"e2e"}`, f.Digest))), http.StatusOK)
	}
	if code, slug := s.readmit(f); code != http.StatusGone || slug != "source-stale" {
		t.Fatalf("admitting the recovery of a call whose source retired: %d %s", code, slug)
	}
}
