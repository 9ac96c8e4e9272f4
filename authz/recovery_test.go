package authz_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/internal/authztest"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
	"github.com/lestrrat-go/jwx/v2/jwa"
)

// newRecoveryEnv is an admission env whose get_repository declares, beside
// the example's failure modes (not_found: prompt_user; rate_limited: retry,
// 3 attempts), "flaky" (retry, no bound), "moved" (fallback to
// list_repositories) and "gone" (abort).
func newRecoveryEnv(t *testing.T) *admitEnv {
	t.Helper()
	e := newEnv(t, nil, func(m *manifest.Manifest) {
		tool := m.Tool("get_repository")
		tool.FailureModes = append(tool.FailureModes,
			manifest.FailureMode{Error: "flaky", Recovery: manifest.RecoveryRetry},
			manifest.FailureMode{Error: "moved", Recovery: manifest.RecoveryFallback, Fallback: "list_repositories"},
			manifest.FailureMode{Error: "gone", Recovery: manifest.RecoveryAbort})
	})
	key, iss := newIssuer(t, e.store, jwa.EdDSA)
	e.forms = authztest.New(t, authz.Config{Store: e.store, Decider: defaultSet(t), Now: e.clock.Now, Issuer: iss, Logger: quiet})
	return &admitEnv{env: e, key: key, iss: iss}
}

// fail admits f, claims its lease and reports outcome with failure, as the
// fence reports a backend's error answer.
func (e *admitEnv) fail(t *testing.T, f *record.Formation, outcome record.Outcome, failure *record.Failure) *authz.Grant {
	t.Helper()
	a, err := e.forms.Admissions.Admit(testCtx(t), f.ID)
	if err != nil {
		t.Fatal(err)
	}
	claim := e.mustClaim(t, a)
	if _, err := e.forms.Leases.Complete(testCtx(t), authz.CompleteRequest{Lease: a.Lease, Claim: claim, Outcome: outcome,
		Failure: failure}); err != nil {
		t.Fatal(err)
	}
	return a
}

func (e *admitEnv) recover(t *testing.T, id, tool, args string) (*record.Formation, error) {
	t.Helper()
	req := authz.RecoverRequest{Formation: id, Host: "host-1", Tool: tool}
	if args != "" {
		req.Arguments = []byte(args)
	}
	return e.forms.Formations.Recover(testCtx(t), req)
}

// TestRecoverRetry: a read whose backend answered a declared retryable
// failure is recovered as the same call, linked to it (attempt 2, the
// outcome and the failure mode matched), with a digest of its own, and
// its token carries the chain's first formation; a chain goes on by
// recovering the recovery, and stops at the mode's maxAttempts. A second
// recovery of one formation is refused, naming the first; of concurrent
// recovers exactly one wins.
func TestRecoverRetry(t *testing.T) {
	e := newRecoveryEnv(t)
	const args = `{"owner":"o","repo":"r"}`
	first := e.ready(t, "s", "github/get_repository", args, nil)
	e.fail(t, first, record.OutcomeFailed, &record.Failure{Error: "rate_limited", Message: "rate_limited: slow down"})
	if got, err := e.forms.Formations.Get(testCtx(t), first.ID); err != nil || got.Outcome != record.OutcomeFailed ||
		got.Failure == nil || got.Failure.Error != "rate_limited" {
		t.Fatalf("the failed formation: %+v %v", got, err)
	}

	second, err := e.recover(t, first.ID, "", "")
	if err != nil {
		t.Fatal(err)
	}
	r := second.Recovery
	if second.Status != record.StatusReady || r == nil || r.Of != first.ID || r.Root != first.ID || r.Attempt != 2 ||
		r.Outcome != record.OutcomeFailed || r.FailureMode == nil || r.FailureMode.Error != "rate_limited" {
		t.Fatalf("recovery %s: %+v", second.Status, r)
	}
	if second.Digest == first.Digest || second.ArgumentDigest != first.ArgumentDigest || second.Session != first.Session {
		t.Fatalf("recovery digest %s (first %s), arguments %s", second.Digest, first.Digest, second.ArgumentDigest)
	}
	if _, err := e.recover(t, first.ID, "", ""); !errors.Is(err, record.ErrRecoveryExists) || !strings.Contains(err.Error(), second.ID) {
		t.Fatalf("a second recovery of %s: %v", first.ID, err)
	}
	if _, err := e.recover(t, first.ID, "github/get_repository", `{"owner":"o","repo":"other"}`); err == nil {
		t.Fatal("a retry with other arguments was formed")
	}

	a := e.fail(t, second, record.OutcomeFailed, &record.Failure{Message: "rate_limited"})
	if c := e.claims(t, a.Token); c.RecoveryOf != first.ID || c.Formation != second.ID {
		t.Fatalf("the recovery's token: fcd_recovery_of %q, fcd_formation %q", c.RecoveryOf, c.Formation)
	}
	third, err := e.recover(t, second.ID, "", "")
	if err != nil || third.Recovery.Attempt != 3 || third.Recovery.Root != first.ID {
		t.Fatalf("third attempt: %+v %v", third, err)
	}
	e.fail(t, third, record.OutcomeFailed, &record.Failure{Error: "rate_limited"})
	if _, err := e.recover(t, third.ID, "", ""); !errors.Is(err, authz.ErrRecoveryNotAllowed) || !strings.Contains(err.Error(), "allows 3 attempts") {
		t.Fatalf("a fourth attempt of a mode with maxAttempts 3: %v", err)
	}

	// Concurrent recovers of one formation: one recovery.
	other := e.ready(t, "s2", "github/get_repository", args, nil)
	e.fail(t, other, record.OutcomeRejected, &record.Failure{Code: -32000, Error: "flaky"})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var won []string
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := e.forms.Formations.Recover(context.Background(), authz.RecoverRequest{Formation: other.ID, Host: "host-1"})
			switch {
			case err == nil:
				mu.Lock()
				won = append(won, f.ID)
				mu.Unlock()
			case !errors.Is(err, record.ErrRecoveryExists):
				t.Errorf("a concurrent recover: %v", err)
			}
		}()
	}
	wg.Wait()
	if len(won) != 1 {
		t.Fatalf("concurrent recovers formed %v, want one", won)
	}
}

// TestRecoverByFailureMode: what each failure mode, and each outcome,
// allows.
func TestRecoverByFailureMode(t *testing.T) {
	e := newRecoveryEnv(t)
	const args = `{"owner":"o","repo":"r"}`
	n := 0
	failed := func(outcome record.Outcome, failure *record.Failure) *record.Formation {
		n++
		f := e.ready(t, "s"+strings.Repeat("x", n), "github/get_repository", args, nil)
		e.fail(t, f, outcome, failure)
		return f
	}

	// fallback: only as a call to the alternative, decided as its own call.
	moved := failed(record.OutcomeFailed, &record.Failure{Message: "moved: see the org"})
	if _, err := e.recover(t, moved.ID, "", ""); !errors.Is(err, authz.ErrBadRequest) || !strings.Contains(err.Error(), "github/list_repositories") {
		t.Fatalf("a fallback without the alternative: %v", err)
	}
	fb, err := e.recover(t, moved.ID, "github/list_repositories", `{"owner":"o"}`)
	if err != nil || fb.Tool != "github/list_repositories" || fb.Recovery.FailureMode.Recovery != manifest.RecoveryFallback ||
		fb.Status != record.StatusReady {
		t.Fatalf("fallback: %+v %v", fb, err)
	}

	// prompt_user: the call again (new arguments allowed), only once a
	// person approved it — even a read.
	notFound := failed(record.OutcomeFailed, &record.Failure{Error: "not_found"})
	pu, err := e.recover(t, notFound.ID, "", `{"owner":"o","repo":"renamed"}`)
	if err != nil || pu.Status != record.StatusPendingApproval || pu.ApprovalsRequired != 1 || pu.ArgumentDigest == notFound.ArgumentDigest {
		t.Fatalf("prompt_user: %+v %v", pu, err)
	}
	if _, err := e.forms.Admissions.Admit(testCtx(t), pu.ID); err == nil {
		t.Fatal("a prompt_user recovery was admitted without an approval")
	}
	if pu, err = approve(e.env, pu, "bob", record.Approve); err != nil || pu.Status != record.StatusReady {
		t.Fatalf("approving the prompt_user recovery: %+v %v", pu, err)
	}

	for _, tc := range []struct {
		note    string
		f       *record.Formation
		wantErr error
		want    string
	}{
		{"abort", failed(record.OutcomeFailed, &record.Failure{Error: "gone"}), authz.ErrRecoveryNotAllowed, `"gone" of github/get_repository declares abort`},
		{"no declared mode matches", failed(record.OutcomeFailed, &record.Failure{Error: "disk_full"}), authz.ErrRecoveryNotAllowed, "failure mode: none"},
		{"refused with no answer (a release)", func() *record.Formation {
			f := e.ready(t, "s-release", "github/get_repository", args, nil)
			a, err := e.forms.Admissions.Admit(testCtx(t), f.ID)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.complete(a.Lease, "", record.OutcomeRejected); err != nil {
				t.Fatal(err)
			}
			return f
		}(), authz.ErrRecoveryNotAllowed, "failure mode: none"},
		{"completed", failed(record.OutcomeEffect, nil), authz.ErrRecoveryNotAllowed, "its effect completed"},
		{"never admitted", e.ready(t, "s-ready", "github/get_repository", args, nil), authz.ErrRecoveryNotAllowed, "is ready"},
	} {
		t.Run(tc.note, func(t *testing.T) {
			_, err := e.recover(t, tc.f.ID, "", "")
			if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %v naming %q", err, tc.wantErr, tc.want)
			}
		})
	}
	other, err := e.forms.Formations.Recover(testCtx(t), authz.RecoverRequest{Formation: moved.ID, Host: "host-2",
		Tool: "github/list_repositories", Arguments: []byte(`{"owner":"o"}`)})
	if !errors.Is(err, authz.ErrRecoveryNotAllowed) || other != nil {
		t.Fatalf("another host's recover: %v", err)
	}
}

// TestRecoverUncertain: an uncertain call blocks recovery until an
// operator resolves it no_effect; the recovery of a write whose effect was
// uncertain then needs two approvers (the default policies), and a chain
// past three attempts is denied by policy, the rule named.
func TestRecoverUncertain(t *testing.T) {
	e := newRecoveryEnv(t)
	w := e.ready(t, "s", "github/create_repository", `{"name":"payroll"}`, nil, "bob")
	a, err := e.forms.Admissions.Admit(testCtx(t), w.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.recover(t, w.ID, "", ""); !errors.Is(err, authz.ErrRecoveryBlocked) {
		t.Fatalf("recovering an admitted call: %v", err)
	}
	claim := e.mustClaim(t, a)
	if _, err := e.complete(a.Lease, claim, record.OutcomeUncertain); err != nil {
		t.Fatal(err)
	}
	if _, err := e.recover(t, w.ID, "", ""); !errors.Is(err, authz.ErrRecoveryBlocked) || !strings.Contains(err.Error(), "uncertain") {
		t.Fatalf("recovering an uncertain call: %v", err)
	}
	if _, err := e.forms.Leases.Resolve(testCtx(t), "ops", a.Lease, record.OutcomeNoEffect, "checked: nothing created"); err != nil {
		t.Fatal(err)
	}
	rw, err := e.recover(t, w.ID, "", "")
	if err != nil || rw.Recovery.Outcome != record.OutcomeNoEffect || rw.Recovery.FailureMode != nil ||
		rw.ApprovalsRequired != 2 || !hasRule(rw.Decision, "recover-uncertain-write") {
		t.Fatalf("recovery of an uncertain write: %+v %v", rw, err)
	}

	// Attempts 2 and 3 end uncertain too; the fourth is denied by policy.
	prev := rw
	for attempt := 2; attempt <= 3; attempt++ {
		if prev.Status != record.StatusReady {
			for _, who := range []string{"bob", "carol"} {
				if prev, err = approve(e.env, prev, who, record.Approve); err != nil {
					t.Fatal(err)
				}
			}
		}
		a, err := e.forms.Admissions.Admit(testCtx(t), prev.ID)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.complete(a.Lease, e.mustClaim(t, a), record.OutcomeUncertain); err != nil {
			t.Fatal(err)
		}
		if _, err := e.forms.Leases.Resolve(testCtx(t), "ops", a.Lease, record.OutcomeNoEffect, "nothing"); err != nil {
			t.Fatal(err)
		}
		next, err := e.recover(t, prev.ID, "", "")
		if err != nil || next.Recovery.Attempt != attempt+1 {
			t.Fatalf("attempt %d: %+v %v", attempt+1, next, err)
		}
		prev = next
	}
	if prev.Status != record.StatusDenied || !hasRule(prev.Decision, "deny-recovery-attempts") {
		t.Fatalf("attempt 4: %s %+v", prev.Status, prev.Decision)
	}
}

// hasRule reports whether any engine's decision names rule.
func hasRule(d record.Decision, rule string) bool {
	for _, e := range d.Engines {
		for _, r := range e.Rules {
			if r == rule {
				return true
			}
		}
	}
	return false
}
