package policy

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fcd-authz/fcd/record"
)

func regoEngine(t *testing.T, src string) *RegoEngine {
	t.Helper()
	e, err := NewRegoEngine(context.Background(), map[string][]byte{"p.rego": []byte(src)})
	if err != nil {
		t.Fatalf("NewRegoEngine: %v", err)
	}
	return e
}

// TestRegoFailsClosed covers what the Rego contract turns into a deny with
// Error set: runtime errors, an undefined result, and malformed elements.
func TestRegoFailsClosed(t *testing.T) {
	m := githubManifest(t)
	doc := githubDocument(t, m, call{tool: "get_repository"})
	// allowWithApprovals allows, and asks for count approvals (Rego).
	allowWithApprovals := func(count string) string {
		return `package fcd.authz
allow contains {"rule": "r", "reason": "x"}
approvals contains {"rule": "r", "count": ` + count + `, "reason": "x"}`
	}
	tests := []struct {
		note    string
		src     string
		errPart string
	}{
		{
			note: "conflicting complete rule values",
			src: `package fcd.authz
owner := input.tool.name
owner := input.tool.server
allow contains {"rule": "r", "reason": owner}`,
			errPart: "conflict",
		},
		{
			note: "division by zero with strict builtin errors",
			src: `package fcd.authz
allow contains {"rule": "r", "reason": "x"} if 1 / count(input.session.completed) > 0`,
			errPart: "divide by zero",
		},
		{
			note: "builtin type error with strict builtin errors",
			src: `package fcd.authz
allow contains {"rule": "r", "reason": "x"} if to_number(input.tool.name) > 0`,
			errPart: "to_number",
		},
		{
			note:    "package missing: the result is undefined",
			src:     `package other.authz` + "\n" + `allow contains {"rule": "r", "reason": "x"}`,
			errPart: "undefined",
		},
		{
			note:    "allow element is not an object",
			src:     `package fcd.authz` + "\n" + `allow contains "everything"`,
			errPart: "want an object",
		},
		{
			note:    "rule is not a string",
			src:     `package fcd.authz` + "\n" + `allow contains {"rule": 7, "reason": "x"}`,
			errPart: `"rule"`,
		},
		{
			note:    "rule missing",
			src:     `package fcd.authz` + "\n" + `allow contains {"reason": "x"}`,
			errPart: `"rule"`,
		},
		{
			note:    "reason is not a string",
			src:     `package fcd.authz` + "\n" + `allow contains {"rule": "r", "reason": ["x"]}`,
			errPart: `"reason"`,
		},
		{
			note: "malformed deny element denies even with an allow",
			src: `package fcd.authz
allow contains {"rule": "r", "reason": "x"}
deny contains "no"`,
			errPart: "malformed deny",
		},
		{note: "approvals count zero", src: allowWithApprovals(`0`), errPart: `"count"`},
		{note: "approvals count a string", src: allowWithApprovals(`"2"`), errPart: `"count"`},
		{note: "approvals count fractional", src: allowWithApprovals(`1.5`), errPart: `"count"`},
		{note: "approvals count absurd", src: allowWithApprovals(`1000`), errPart: `"count"`},
	}
	for _, tc := range tests {
		t.Run(tc.note, func(t *testing.T) {
			got := regoEngine(t, tc.src).Decide(context.Background(), doc)
			if got.Verdict != record.VerdictDeny || got.Error == "" {
				t.Fatalf("got %s (error %q), want a deny with an error", got.Verdict, got.Error)
			}
			if !strings.Contains(got.Error, tc.errPart) {
				t.Errorf("error %q does not mention %q", got.Error, tc.errPart)
			}
			if got.Rules == nil || got.Reasons == nil {
				t.Errorf("rules/reasons must be empty lists, not null")
			}
		})
	}
}

// TestRegoRejectedAtBuild covers policies NewRegoEngine refuses before
// they can decide anything.
func TestRegoRejectedAtBuild(t *testing.T) {
	tests := []struct {
		note, src, errPart string
	}{
		{"syntax error", "package fcd.authz\nallow contains {", "rego_parse_error"},
		{"Rego v0 syntax", "package fcd.authz\nallow[x] { x := {\"rule\": \"r\"} }", "rego_parse_error"},
		{"allow as a boolean rule", "package fcd.authz\nallow if true", "partial set rule"},
		{"deny as a complete rule", "package fcd.authz\nallow contains {\"rule\": \"r\"}\ndeny := {{\"rule\": \"d\"}}", "partial set rule"},
		{"deny_successor as a complete rule", "package fcd.authz\nallow contains {\"rule\": \"r\"}\ndeny_successor := {{\"rule\": \"d\"}}", "partial set rule"},
		{"strict: unused local variable", "package fcd.authz\nallow contains {\"rule\": \"r\"} if { x := 1 }", "rego_compile_error"},
		{"network builtin", "package fcd.authz\nallow contains {\"rule\": \"r\"} if http.send({\"method\": \"get\", \"url\": \"http://x\"}).status_code == 200", "http.send"},
		{"environment builtin", "package fcd.authz\nallow contains {\"rule\": opa.runtime().env.HOME}", "opa.runtime"},
	}
	for _, tc := range tests {
		t.Run(tc.note, func(t *testing.T) {
			_, err := NewRegoEngine(context.Background(), map[string][]byte{"p.rego": []byte(tc.src)})
			if !errors.Is(err, ErrInvalidPolicy) {
				t.Fatalf("err = %v, want ErrInvalidPolicy", err)
			}
			if !strings.Contains(err.Error(), tc.errPart) {
				t.Errorf("error %q does not mention %q", err, tc.errPart)
			}
		})
	}
}

// TestRegoReasonsMergePerRule checks that a rule with several elements is
// named once, its reasons joined, so Rules and Reasons stay aligned.
func TestRegoReasonsMergePerRule(t *testing.T) {
	m := githubManifest(t)
	in := githubInput(t, m, call{tool: "create_repository", requires: []string{"a", "b"}})
	doc, err := NewDocument(in)
	if err != nil {
		t.Fatal(err)
	}
	got := loadDefaults(t).rego.Decide(context.Background(), doc)
	want := []string{"deny-requires-unmet"}
	if strings.Join(got.Rules, ",") != strings.Join(want, ",") || len(got.Reasons) != 1 {
		t.Fatalf("rules %q reasons %q", got.Rules, got.Reasons)
	}
	for _, tool := range []string{"github/a", "github/b"} {
		if !strings.Contains(got.Reasons[0], "requires "+tool) {
			t.Errorf("reason %q does not name %s", got.Reasons[0], tool)
		}
	}
}

// TestRegoSuccessorFailsClosed: when the engine cannot decide, an input's
// candidate successor is refused with the error recorded, whatever part of
// the query failed; the call is denied as without a successor.
func TestRegoSuccessorFailsClosed(t *testing.T) {
	m := githubManifest(t)
	doc := githubDocument(t, m, call{tool: "get_repository", successor: &successor{}})
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		note    string
		ctx     context.Context
		src     string
		errPart string
	}{
		{
			note: "malformed deny_successor element",
			src: `package fcd.authz
allow contains {"rule": "r", "reason": "x"}
deny_successor contains {"reason": "x"} if input.successor`,
			errPart: "malformed deny_successor",
		},
		{
			note: "deny_successor element is not an object",
			src: `package fcd.authz
allow contains {"rule": "r", "reason": "x"}
deny_successor contains "no"`,
			errPart: "malformed deny_successor",
		},
		{
			note: "evaluation error in deny_successor",
			src: `package fcd.authz
allow contains {"rule": "r", "reason": "x"}
deny_successor contains {"rule": "boom"} if 1 / count(input.session.completed) > 0`,
			errPart: "divide by zero",
		},
		{
			note:    "undefined result",
			src:     "package other.authz\nallow contains {\"rule\": \"r\"}",
			errPart: "undefined",
		},
		{
			note:    "cancelled context",
			ctx:     cancelled,
			src:     "package fcd.authz\nallow contains {\"rule\": \"r\"}",
			errPart: "canceled",
		},
	}
	for _, tc := range tests {
		t.Run(tc.note, func(t *testing.T) {
			ctx := tc.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			got := regoEngine(t, tc.src).Decide(ctx, doc)
			if got.Verdict != record.VerdictDeny || !strings.Contains(got.Error, tc.errPart) {
				t.Errorf("got %s (error %q), want a deny with an error mentioning %q", got.Verdict, got.Error, tc.errPart)
			}
			gs := got.Successor
			if gs == nil || gs.Verdict != record.VerdictDeny || gs.Error != got.Error || gs.Rules == nil || gs.Reasons == nil {
				t.Errorf("successor = %+v, want a deny with the engine's error", gs)
			}
		})
	}
}

// TestRegoDenySuccessorOnlyWithSuccessor: without a candidate successor
// deny_successor is not evaluated, so neither its elements nor its errors
// reach the decision of a call that has none.
func TestRegoDenySuccessorOnlyWithSuccessor(t *testing.T) {
	m := githubManifest(t)
	doc := githubDocument(t, m, call{tool: "get_repository"})
	for _, rule := range []string{
		`deny_successor contains {"rule": "always", "reason": "x"}`,
		`deny_successor contains {"reason": "no rule"}`,
		`deny_successor contains {"rule": "boom"} if 1 / count(input.session.completed) > 0`,
	} {
		src := "package fcd.authz\n" + allowAllRego + rule
		got := regoEngine(t, src).Decide(context.Background(), doc)
		if got.Verdict != record.VerdictAllow || got.Error != "" || got.Successor != nil {
			t.Errorf("%s: got %s (error %q, successor %+v), want allow and no answer on a successor", rule, got.Verdict, got.Error, got.Successor)
		}
	}
}
