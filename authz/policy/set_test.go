package policy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/fcd-authz/fcd/record"
)

// tinySet is a small valid policy set whose write approvals are n and whose
// reasons name variant, so tests can tell two sets apart by their decisions.
func tinySet(variant string, n int) fstest.MapFS {
	return fstest.MapFS{
		"p.rego": {Data: fmt.Appendf(nil, `package fcd.authz

allow contains {"rule": "allow-all", "reason": "variant %[1]s"}

approvals contains {"rule": "allow-all", "count": %[2]d, "reason": "variant %[1]s"} if input.tool.sideEffects == "write"
`, variant, n)},
		"p_test.rego": {Data: fmt.Appendf(nil, `package fcd.authz_test

import data.fcd.authz

test_write_approvals if {
	{a.count | some a in authz.approvals} == {%d} with input as {"tool": {"sideEffects": "write"}}
}
`, n)},
		"p.cedar": {Data: fmt.Appendf(nil, `
@id("allow-all") @reason("variant %[1]s") @approvals("%[2]d")
permit (principal, action, resource);
`, variant, n)},
		"p.cases.json": {Data: fmt.Appendf(nil, `[
  {"name": "write", "input": {"tool": {"name": "x", "server": "s", "qualifiedName": "s/x", "sideEffects": "write",
     "requiresApproval": true, "requires": [], "producesInputFor": [], "exclusiveWith": []}},
   "expect": {"verdict": "allow", "approvals": %d, "rules": ["allow-all"]}}
]`, n)},
	}
}

// with returns a copy of fsys with name set to data (nil data deletes).
func with(fsys fstest.MapFS, name string, data []byte) fstest.MapFS {
	out := fstest.MapFS{}
	for k, v := range fsys {
		out[k] = v
	}
	if data == nil {
		delete(out, name)
	} else {
		out[name] = &fstest.MapFile{Data: data}
	}
	return out
}

func TestLoad(t *testing.T) {
	ctx := context.Background()
	a := tinySet("A", 1)
	s, err := Load(ctx, a)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if got := strings.Join(s.Files(), ","); got != "p.cases.json,p.cedar,p.rego,p_test.rego" {
		t.Errorf("Files() = %s", got)
	}

	t.Run("digest covers policy and test files only", func(t *testing.T) {
		same := with(with(with(a, "README.md", []byte("notes")), ".p.rego.swp", []byte("x")), "sub/x.rego", []byte("package x"))
		s2, err := Load(ctx, same)
		if err != nil {
			t.Fatal(err)
		}
		if s2.Digest() != s.Digest() {
			t.Errorf("README, hidden files or subdirectories changed the digest")
		}
		changed := with(a, "p_test.rego", append(a["p_test.rego"].Data, "\n# comment\n"...))
		s3, err := Load(ctx, changed)
		if err != nil {
			t.Fatal(err)
		}
		if s3.Digest() == s.Digest() {
			t.Errorf("a changed test file did not change the digest")
		}
	})

	invalid := []struct {
		note string
		fsys fstest.MapFS
		want error
	}{
		{"no Cedar policy", with(with(a, "p.cedar", nil), "p.cases.json", nil), ErrInvalidPolicy},
		{"no Rego policy, only tests", with(a, "p.rego", nil), ErrInvalidPolicy},
		{"Rego package without allow", with(a, "p.rego", []byte("package fcd.authz\n\ndeny contains {\"rule\": \"d\"} if false\n")), ErrInvalidPolicy},
		{"Rego in another package", with(a, "p.rego", []byte("package other\n\nallow contains {\"rule\": \"a\"}\n")), ErrInvalidPolicy},
		{"Rego syntax error", with(a, "p.rego", []byte("package fcd.authz\nallow contains {\n")), ErrInvalidPolicy},
		{"Rego test does not compile", with(a, "p_test.rego", []byte("package fcd.authz_test\ntest_x if { y := 1 }\n")), ErrInvalidPolicy},
		{"Cedar syntax error", with(a, "p.cedar", []byte(`@id("a") permit (principal, action`)), ErrInvalidPolicy},
		{"Cedar policy without @id", with(a, "p.cedar", []byte(`permit (principal, action, resource);`)), ErrInvalidPolicy},
		{"data document", with(a, "data.json", []byte(`{}`)), ErrInvalidPolicy},
		{"cases with an unknown member", with(a, "p.cases.json", []byte(`[{"name": "x", "input": {}, "expect": {"verdict": "allow"}, "extra": 1}]`)), ErrInvalidPolicy},
		{"case input with an unknown field fails the case", with(a, "p.cases.json", []byte(`[{"name": "x", "input": {"tool": {"sideEfects": "write"}}, "expect": {"verdict": "allow"}}]`)), ErrTestsFailed},
		{"case with a bad verdict", with(a, "p.cases.json", []byte(`[{"name": "x", "input": {}, "expect": {"verdict": "maybe"}}]`)), ErrInvalidPolicy},
		{"case with a bad successor verdict", with(a, "p.cases.json", []byte(`[{"name": "x", "input": {}, "expect": {"verdict": "allow", "successor": "maybe"}}]`)), ErrInvalidPolicy},
		{"case with successorRules but no successor", with(a, "p.cases.json", []byte(`[{"name": "x", "input": {}, "expect": {"verdict": "allow", "successorRules": ["r"]}}]`)), ErrInvalidPolicy},
		{"case expecting a successor answer of an input without one", with(a, "p.cases.json", []byte(`[{"name": "x", "input": {"tool": {"sideEffects": "write"}}, "expect": {"verdict": "allow", "successor": "allow"}}]`)), ErrTestsFailed},
		{"failing Rego test", tinyMix("A", 1, 2), ErrTestsFailed},
		{"failing Cedar case", with(a, "p.cases.json", []byte(`[{"name": "x", "input": {}, "expect": {"verdict": "deny"}}]`)), ErrTestsFailed},
		{"a Cedar deny caused by an error fails its case", with(a, "p.cedar", []byte(`@id("a") permit (principal, action, resource) when { context.nope };`)), ErrTestsFailed},
	}
	for _, tc := range invalid {
		t.Run(tc.note, func(t *testing.T) {
			s, err := Load(ctx, tc.fsys)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Load = %v, %v; want %v", s, err, tc.want)
			}
			t.Log(err)
		})
	}
}

// tinyMix is tinySet with its Rego test expecting testN approvals while the
// policy grants n: a set whose own test fails.
func tinyMix(variant string, n, testN int) fstest.MapFS {
	return with(tinySet(variant, n), "p_test.rego", tinySet(variant, testN)["p_test.rego"].Data)
}

func TestRunTestsReport(t *testing.T) {
	ctx := context.Background()
	rep, err := RunTests(ctx, tinySet("A", 1))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if !rep.Print(&out, true) {
		t.Fatalf("a passing set printed a failure:\n%s", &out)
	}
	for _, part := range []string{"PASS  rego", "test_write_approvals", "PASS  cedar", "p.cases.json  write", "rego 1 passed, 0 failed; cedar 1 passed, 0 failed"} {
		if !strings.Contains(out.String(), part) {
			t.Errorf("verbose report lacks %q:\n%s", part, &out)
		}
	}

	rep, err = RunTests(ctx, with(tinyMix("A", 1, 2), "p.cases.json", []byte(`[{"name": "x", "input": {}, "expect": {"verdict": "deny"}}]`)))
	if err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if rep.Print(&out, false) || rep.Passed() {
		t.Fatalf("a failing set printed success:\n%s", &out)
	}
	if n := len(rep.Failures()); n != 2 {
		t.Errorf("%d failures, want 2", n)
	}
	for _, part := range []string{"FAIL  rego", "p_test.rego", "FAIL  cedar", "want deny, got allow", "FAIL  policy sha256:"} {
		if !strings.Contains(out.String(), part) {
			t.Errorf("report lacks %q:\n%s", part, &out)
		}
	}
	if strings.Contains(out.String(), "PASS  ") {
		t.Errorf("a non-verbose report lists passing tests:\n%s", &out)
	}
}

func TestSetDecide(t *testing.T) {
	m := githubManifest(t)
	ctx := context.Background()
	at := time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
	clock := func() time.Time { return at }

	t.Run("combination is deny-overrides with the largest obligation", func(t *testing.T) {
		fsys := with(tinySet("A", 2), "p.cedar", []byte(`
@id("allow-all") @reason("variant A") @approvals("2") permit (principal, action, resource);
@id("no-deletes") forbid (principal, action == Action::"delete", resource);
`))
		fsys = with(fsys, "p.cases.json", nil)
		s, err := Load(ctx, fsys)
		if err != nil {
			t.Fatal(err)
		}
		s = s.WithClock(clock)
		d := s.Decide(ctx, githubInput(t, m, call{tool: "create_repository"}))
		if d.Verdict != record.VerdictAllow || d.Approvals != 2 || !d.DecidedAt.Equal(at) || d.PolicyDigest != s.Digest() {
			t.Errorf("write: %+v", d)
		}
		d = s.Decide(ctx, githubInput(t, m, call{tool: "delete_repository"}))
		if d.Verdict != record.VerdictDeny || d.Approvals != 0 {
			t.Errorf("delete: %s with %d approvals, want deny with 0", d.Verdict, d.Approvals)
		}
		if d.Engines[0].Verdict != record.VerdictAllow || d.Engines[1].Verdict != record.VerdictDeny ||
			d.Engines[1].Rules[0] != "no-deletes" {
			t.Errorf("engines: %+v", d.Engines)
		}
	})

	t.Run("an inconsistent input denies in every engine", func(t *testing.T) {
		s := loadDefaults(t)
		in := githubInput(t, m, call{tool: "get_repository"})
		in.Formation.Metadata.SideEffects = "delete"
		d := s.Decide(ctx, in)
		if d.Verdict != record.VerdictDeny || len(d.Engines) != 2 {
			t.Fatalf("got %+v", d)
		}
		for _, e := range d.Engines {
			if e.Error == "" || e.Verdict != record.VerdictDeny {
				t.Errorf("%s: %+v", e.Engine, e)
			}
		}
	})

	t.Run("invalid raw arguments deny", func(t *testing.T) {
		in := githubInput(t, m, call{tool: "get_repository"})
		in.Formation.Arguments = []byte(`{"owner":`)
		if d := loadDefaults(t).Decide(ctx, in); d.Verdict != record.VerdictDeny || d.Engines[0].Error == "" {
			t.Errorf("got %+v", d)
		}
	})

	t.Run("a nil or zero set denies", func(t *testing.T) {
		var s *Set
		if d := s.Decide(ctx, githubInput(t, m, call{tool: "get_repository"})); d.Verdict != record.VerdictDeny {
			t.Errorf("nil set: got %+v", d)
		}
		if d := new(Set).Decide(ctx, githubInput(t, m, call{tool: "get_repository"})); d.Verdict != record.VerdictDeny {
			t.Errorf("zero set: got %+v", d)
		}
	})
}
