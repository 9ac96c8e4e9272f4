package policy

import (
	"context"
	"fmt"
	"reflect"
	"testing"

	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/policies"
	"github.com/fcd-authz/fcd/record"
)

// loadDefaults loads the embedded default policy set.
func loadDefaults(t testing.TB) *Set {
	t.Helper()
	s, err := Load(context.Background(), policies.FS)
	if err != nil {
		t.Fatalf("Load(policies.FS): %v", err)
	}
	return s
}

// TestDecisionMatrix decides every combination of side effects (none, read,
// write, delete) × principal in repo-admins or not × requires met or not ×
// artifact pinned or not over the default policies, with each engine alone
// and combined, and compares with the documented intent: reads are
// allowed, writes need one approval, deletes need repo-admins and two
// approvals, and an unmet requirement or an unpinned artifact denies.
func TestDecisionMatrix(t *testing.T) {
	m := githubManifest(t)
	s := loadDefaults(t)
	ctx := context.Background()
	// Each row uses a descriptor of the github example; every row requires
	// get_repository (delete_repository declares it; the others are given
	// it) so the requires dimension is never vacuous.
	tools := []struct {
		effects  manifest.SideEffect
		tool     string
		override manifest.SideEffect
	}{
		{manifest.SideEffectNone, "list_repositories", manifest.SideEffectNone},
		{manifest.SideEffectRead, "list_repositories", ""},
		{manifest.SideEffectWrite, "create_repository", ""},
		{manifest.SideEffectDelete, "delete_repository", ""},
	}
	for _, tl := range tools {
		for _, admin := range []bool{false, true} {
			for _, met := range []bool{false, true} {
				for _, pinned := range []bool{false, true} {
					name := fmt.Sprintf("%s/admin=%v/requires-met=%v/pinned=%v", tl.effects, admin, met, pinned)
					t.Run(name, func(t *testing.T) {
						c := call{tool: tl.tool, effects: tl.override, admin: admin, unpinned: !pinned,
							requires: []string{"get_repository"}}
						if met {
							c.completed = []string{"github/get_repository"}
						}
						in := githubInput(t, m, c)
						if in.Tool.SideEffects != tl.effects {
							t.Fatalf("row builds %s, want %s", in.Tool.SideEffects, tl.effects)
						}
						w := matrixWant(tl.effects, admin, met, pinned)
						doc, err := NewDocument(in)
						if err != nil {
							t.Fatal(err)
						}
						for _, e := range s.Engines() {
							got := e.Decide(ctx, doc)
							if got.Engine != e.Name() {
								t.Errorf("%s: engine = %q", e.Name(), got.Engine)
							}
							check(t, got, w)
						}
						d := s.Decide(ctx, in)
						if d.Verdict != w.verdict || d.Approvals != w.approvals {
							t.Errorf("combined: %s with %d approvals, want %s with %d", d.Verdict, d.Approvals, w.verdict, w.approvals)
						}
						if d.PolicyDigest != s.Digest() || len(d.Engines) != 2 ||
							d.Engines[0].Engine != EngineRego || d.Engines[1].Engine != EngineCedar {
							t.Errorf("combined decision is not stamped with the set and both engines: %+v", d)
						}
					})
				}
			}
		}
	}
}

// matrixWant is the intent of the default policies, written independently
// of them.
func matrixWant(effects manifest.SideEffect, admin, met, pinned bool) want {
	var deny []string
	if effects == manifest.SideEffectDelete && !admin {
		deny = append(deny, "deny-delete-non-admin")
	}
	if !met {
		deny = append(deny, "deny-requires-unmet")
	}
	if !pinned {
		deny = append(deny, "deny-artifact-unpinned")
	}
	if len(deny) > 0 {
		return want{verdict: record.VerdictDeny, rules: sorted(deny)}
	}
	switch effects {
	case manifest.SideEffectWrite:
		return want{verdict: record.VerdictAllow, approvals: 1, rules: []string{"allow-write"}}
	case manifest.SideEffectDelete:
		return want{verdict: record.VerdictAllow, approvals: 2, rules: []string{"allow-delete-repo-admin"}}
	}
	return want{verdict: record.VerdictAllow, rules: []string{"allow-read"}}
}

// TestDefaultCasesAgreeAcrossEngines runs the default Cedar cases
// (policies/fcd.cases.json) against the default Rego policies too: the two
// halves must state the same rules under the same names, or the combined
// deny-overrides decision would be stricter than either half says.
func TestDefaultCasesAgreeAcrossEngines(t *testing.T) {
	s := loadDefaults(t)
	data, err := policies.FS.ReadFile("fcd.cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []CedarCase
	if err := manifest.DecodeStrict(data, &cases); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		if c.Expect.Error {
			continue // a Cedar type error has no Rego counterpart
		}
		t.Run(c.Name, func(t *testing.T) {
			if msg := checkCedarCase(context.Background(), s.rego, &c); msg != "" {
				t.Errorf("rego: %s", msg)
			}
			in, err := DecodeInput(c.Input)
			if err != nil {
				t.Fatal(err)
			}
			doc, err := NewDocument(in)
			if err != nil {
				t.Fatal(err)
			}
			r, ce := s.rego.Decide(context.Background(), doc), s.cedar.Decide(context.Background(), doc)
			if !reflect.DeepEqual(r.Rules, ce.Rules) || r.Approvals != ce.Approvals || r.Verdict != ce.Verdict {
				t.Errorf("engines disagree: rego %s %d %v, cedar %s %d %v", r.Verdict, r.Approvals, r.Rules, ce.Verdict, ce.Approvals, ce.Rules)
			}
			// Allow reasons are static in both halves and must read the
			// same; some Rego deny reasons name values Cedar cannot.
			if r.Verdict == record.VerdictAllow && !reflect.DeepEqual(r.Reasons, ce.Reasons) {
				t.Errorf("allow reasons differ: rego %q, cedar %q", r.Reasons, ce.Reasons)
			}
			// Both answer on a successor exactly when the input has one.
			// On an allowed call they must agree on it too; on a denied
			// one a Cedar forbid with an unconstrained action refuses it
			// as well, which Rego's separate deny_successor does not.
			if (r.Successor == nil) != (ce.Successor == nil) || (r.Successor == nil) != (in.Successor == nil) {
				t.Fatalf("successor answers: rego %+v, cedar %+v, input successor %v", r.Successor, ce.Successor, in.Successor != nil)
			}
			if r.Successor != nil && r.Verdict == record.VerdictAllow &&
				(r.Successor.Verdict != ce.Successor.Verdict || !reflect.DeepEqual(r.Successor.Rules, ce.Successor.Rules)) {
				t.Errorf("engines disagree on the successor: rego %s %v, cedar %s %v",
					r.Successor.Verdict, r.Successor.Rules, ce.Successor.Verdict, ce.Successor.Rules)
			}
		})
	}
}
