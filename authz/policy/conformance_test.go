package policy

import (
	"context"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
)

// This file is the one conformance suite every Engine must pass (in the
// style of SpiceDB's pkg/datastore/test): each behaviour is a fixture with
// the same policy written in Rego and in Cedar, and the suite runs against
// an engine built by a per-language factory. A new engine joins by adding
// its language to the fixtures and a Test…Conformance function.

// fixture is one policy in both languages, under the same rule names.
type fixture struct {
	rego  string // body after "package fcd.authz"
	cedar string
}

// engineFactory builds an engine of one language from a fixture.
type engineFactory func(t *testing.T, f fixture) Engine

func TestRegoConformance(t *testing.T) {
	runConformance(t, func(t *testing.T, f fixture) Engine {
		t.Helper()
		return regoEngine(t, "package fcd.authz\n\n"+f.rego)
	})
}

func TestCedarConformance(t *testing.T) {
	runConformance(t, func(t *testing.T, f fixture) Engine {
		t.Helper()
		return cedarEngine(t, f.cedar)
	})
}

const (
	allowAllRego  = `allow contains {"rule": "allow-all", "reason": "everything is allowed"}` + "\n"
	allowAllCedar = `@id("allow-all") @reason("everything is allowed") permit (principal, action, resource);` + "\n"
)

// want is the expected engine decision; Reasons are compared only when set.
type want struct {
	verdict   record.Verdict
	approvals int
	rules     []string
	reasons   []string
	err       bool
}

func check(t *testing.T, got record.EngineDecision, w want) {
	t.Helper()
	if got.Verdict != w.verdict {
		t.Errorf("verdict = %s, want %s (rules %v, reasons %v, error %q)", got.Verdict, w.verdict, got.Rules, got.Reasons, got.Error)
	}
	if got.Approvals != w.approvals {
		t.Errorf("approvals = %d, want %d", got.Approvals, w.approvals)
	}
	if (got.Error != "") != w.err {
		t.Errorf("error = %q, want error: %v", got.Error, w.err)
	}
	if w.err {
		if got.Verdict != record.VerdictDeny {
			t.Errorf("an evaluation error must deny")
		}
		return
	}
	if w.rules != nil && !reflect.DeepEqual(got.Rules, w.rules) {
		t.Errorf("rules = %q, want %q", got.Rules, w.rules)
	}
	if w.reasons != nil && !reflect.DeepEqual(got.Reasons, w.reasons) {
		t.Errorf("reasons = %q, want %q", got.Reasons, w.reasons)
	}
	if len(got.Rules) != len(got.Reasons) {
		t.Errorf("rules %q and reasons %q are not aligned", got.Rules, got.Reasons)
	}
}

func runConformance(t *testing.T, build engineFactory) {
	m := githubManifest(t)
	ctx := context.Background()
	read := githubInput(t, m, call{tool: "get_repository"})
	write := githubInput(t, m, call{tool: "create_repository"})
	decide := func(t *testing.T, e Engine, in *Input) record.EngineDecision {
		t.Helper()
		doc, err := NewDocument(in)
		if err != nil {
			t.Fatalf("NewDocument: %v", err)
		}
		return e.Decide(ctx, doc)
	}

	t.Run("allow", func(t *testing.T) {
		e := build(t, fixture{rego: allowAllRego, cedar: allowAllCedar})
		check(t, decide(t, e, read), want{verdict: record.VerdictAllow, rules: []string{"allow-all"}, reasons: []string{"everything is allowed"}})
	})

	t.Run("deny overrides allow", func(t *testing.T) {
		e := build(t, fixture{
			rego:  allowAllRego + `deny contains {"rule": "deny-writes", "reason": "no writes"} if input.tool.sideEffects == "write"`,
			cedar: allowAllCedar + `@id("deny-writes") @reason("no writes") forbid (principal, action == Action::"write", resource);`,
		})
		check(t, decide(t, e, read), want{verdict: record.VerdictAllow, rules: []string{"allow-all"}})
		check(t, decide(t, e, write), want{verdict: record.VerdictDeny, rules: []string{"deny-writes"}, reasons: []string{"no writes"}})
	})

	t.Run("no allow denies", func(t *testing.T) {
		e := build(t, fixture{
			rego:  `allow contains {"rule": "only-none", "reason": "r"} if input.tool.sideEffects == "none"`,
			cedar: `@id("only-none") permit (principal, action == Action::"none", resource);`,
		})
		check(t, decide(t, e, read), want{verdict: record.VerdictDeny, rules: []string{ruleDefaultDeny}})
	})

	t.Run("approvals are the largest obligation of the deciding rules, rules sorted", func(t *testing.T) {
		e := build(t, fixture{
			rego: `
allow contains {"rule": "b-rule", "reason": "b"} if input.tool.sideEffects == "write"
approvals contains {"rule": "b-rule", "count": 1, "reason": "b"} if input.tool.sideEffects == "write"
allow contains {"rule": "a-rule", "reason": "a"} if input.tool.sideEffects == "write"
approvals contains {"rule": "a-rule", "count": 3, "reason": "a"} if input.tool.sideEffects == "write"
allow contains {"rule": "c-rule", "reason": "c"} if input.tool.sideEffects == "none"
approvals contains {"rule": "c-rule", "count": 5, "reason": "c"} if input.tool.sideEffects == "none"
`,
			cedar: `
@id("b-rule") @reason("b") @approvals("1") permit (principal, action == Action::"write", resource);
@id("a-rule") @reason("a") @approvals("3") permit (principal, action == Action::"write", resource);
@id("c-rule") @reason("c") @approvals("5") permit (principal, action == Action::"none", resource);
`,
		})
		check(t, decide(t, e, write), want{verdict: record.VerdictAllow, approvals: 3, rules: []string{"a-rule", "b-rule"}, reasons: []string{"a", "b"}})
		check(t, decide(t, e, read), want{verdict: record.VerdictDeny, rules: []string{ruleDefaultDeny}})
	})

	t.Run("every documented input field reaches the policy", func(t *testing.T) {
		e := build(t, fixture{
			rego: `
allow contains {"rule": "facts", "reason": "all facts hold"} if {
	input.formation.principal.id == "alice"
	"repo-admins" in input.formation.principal.attributes.groups
	input.formation.arguments.owner == "octo-org"
	input.formation.arguments.perPage == 50
	"github/get_repository" in input.session.completed
	not "github/create_repository" in input.session.admitted
	input.epoch.state == "ACTIVE"
	input.epoch.artifactPinned == true
	input.formation.source.pool == "github-v1-4"
	input.tool.server == "github"
	input.tool.qualifiedName == "github/delete_repository"
	"github/get_repository" in input.tool.requires
	"github/create_repository" in input.tool.exclusiveWith
	input.tool.sideEffects == "delete"
	input.tool.requiresApproval == true
	input.formation.successor == null
}`,
			cedar: `
@id("facts") @reason("all facts hold")
permit (principal == Principal::"alice", action == Action::"delete", resource in Server::"github")
when {
	principal.groups.contains("repo-admins") &&
	context.principal.groups.contains("repo-admins") &&
	context.arguments.owner == "octo-org" &&
	context.arguments.perPage == 50 &&
	context.session.completed.contains("github/get_repository") &&
	!context.session.admitted.contains("github/create_repository") &&
	context.epoch.state == "ACTIVE" &&
	context.epoch.artifactPinned &&
	context.formation.source.pool == "github-v1-4" &&
	resource.server == "github" &&
	resource == Tool::"github/delete_repository" &&
	resource.requires.contains("github/get_repository") &&
	resource.exclusiveWith.contains("github/create_repository") &&
	resource.sideEffects == "delete" &&
	resource.requiresApproval &&
	!context.formation.hasSuccessor
};`,
		})
		const args = `{"owner":"octo-org","repo":"payroll-exports","perPage":50}`
		base := call{tool: "delete_repository", admin: true, completed: []string{"github/get_repository"}, args: args}
		check(t, decide(t, e, githubInput(t, m, base)), want{verdict: record.VerdictAllow, rules: []string{"facts"}})
		flips := map[string]func(c *call, in *Input){
			"principal id":      func(_ *call, in *Input) { in.Formation.Principal.ID = "bob" },
			"principal groups":  func(c *call, _ *Input) { c.admin = false },
			"argument":          func(c *call, _ *Input) { c.args = `{"owner":"someone-else","repo":"x","perPage":50}` },
			"numeric argument":  func(c *call, _ *Input) { c.args = `{"owner":"octo-org","repo":"x","perPage":51}` },
			"session completed": func(c *call, _ *Input) { c.completed = nil },
			"session admitted":  func(c *call, _ *Input) { c.admitted = []string{"github/create_repository"} },
			"epoch state":       func(c *call, _ *Input) { c.state = record.StateDraining },
			"epoch pinned":      func(c *call, _ *Input) { c.unpinned = true },
			"source pool":       func(_ *call, in *Input) { in.Formation.Source.Pool = "github-v1-3" },
			"tool":              func(c *call, _ *Input) { c.tool, c.effects = "create_repository", manifest.SideEffectDelete },
			"requires":          func(c *call, _ *Input) { c.requires = []string{"list_repositories"} },
			"successor":         func(c *call, _ *Input) { c.successor = &successor{} },
			"side effects":      func(c *call, _ *Input) { c.effects = manifest.SideEffectWrite },
		}
		for name, flip := range flips {
			t.Run(name, func(t *testing.T) {
				c := base
				flip(&c, &Input{})
				in := githubInput(t, m, c)
				flip(&call{}, in)
				got := decide(t, e, in)
				if got.Verdict != record.VerdictDeny || got.Error != "" {
					t.Errorf("flipping %s: got %s (error %q), want a plain deny", name, got.Verdict, got.Error)
				}
			})
		}
	})

	t.Run("a successor is refused by its own rules, never the call", func(t *testing.T) {
		e := build(t, fixture{
			rego: allowAllRego + `
deny_successor contains {"rule": "no-public", "reason": "public"} if input.successor.certificate.effects.visibility == "public"

deny_successor contains {"rule": "no-unpinned", "reason": "unpinned"} if {
	input.successor
	not input.successor.epoch.artifactPinned
}

# Elements without a successor are never an answer on one.
deny_successor contains {"rule": "never-without", "reason": "r"} if not input.successor

# Every documented successor fact reaches the policy.
deny_successor contains {"rule": "facts", "reason": "a successor fact is missing"} if {
	input.successor
	not successor_facts
}

successor_facts if {
	s := input.successor
	f := input.formation.successor
	s.epoch.id == f.epoch
	s.epoch.server == "github"
	s.epoch.release == "v1.3.0"
	s.epoch.pool == "github-v1-3"
	f.pool == "github-v1-3"
	s.epoch.state == "ACTIVE"
	s.epoch.configDigest == f.configDigest
	s.certificate.id == "cert-github-v1-4-to-v1-3"
	f.certificate == s.certificate.id
	s.certificate.issuer == "compat-1"
	f.issuer == "compat-1"
	s.certificate.tool == "create_repository"
	s.certificate.source == input.formation.source.epoch
	s.certificate.target == s.epoch.id
	s.certificate.profile.id == "github-create-repository/1"
	startswith(s.certificate.profile.digest, "sha256:")
	s.certificate.expiresAt == "2027-11-30T00:00:00Z"
	f.effects == s.certificate.effects
}`,
			cedar: allowAllCedar + `
@id("no-public") @reason("public") forbid (principal, action == Action::"substitute", resource)
when { context.successor.certificate.effects has visibility && context.successor.certificate.effects.visibility == "public" };

@id("no-unpinned") @reason("unpinned") forbid (principal, action == Action::"substitute", resource)
unless { context.successor.epoch.artifactPinned };

@id("facts") @reason("a successor fact is missing") forbid (principal, action == Action::"substitute", resource)
unless {
	context.successor.epoch.id == context.formation.successor.epoch &&
	context.successor.epoch.server == "github" &&
	context.successor.epoch.release == "v1.3.0" &&
	context.successor.epoch.pool == "github-v1-3" &&
	context.formation.successor.pool == "github-v1-3" &&
	context.successor.epoch.state == "ACTIVE" &&
	context.successor.epoch.configDigest == context.formation.successor.configDigest &&
	context.successor.certificate.id == "cert-github-v1-4-to-v1-3" &&
	context.formation.successor.certificate == context.successor.certificate.id &&
	context.successor.certificate.issuer == "compat-1" &&
	context.formation.successor.issuer == "compat-1" &&
	context.successor.certificate.tool == "create_repository" &&
	context.successor.certificate.source == context.formation.source.epoch &&
	context.successor.certificate.target == context.successor.epoch.id &&
	context.successor.certificate.profile.id == "github-create-repository/1" &&
	context.successor.certificate.profile.digest like "sha256:*" &&
	context.successor.certificate.expiresAt == "2027-11-30T00:00:00Z" &&
	context.formation.successor.effects == context.successor.certificate.effects
};`,
		})
		public := map[string]any{"visibility": "public"}
		tests := []struct {
			note      string
			successor *successor
			want      *record.SuccessorVerdict
		}{
			{note: "no successor: no answer, whatever deny_successor holds"},
			{
				note: "a successor no rule refuses is allowed", successor: &successor{},
				want: &record.SuccessorVerdict{Verdict: record.VerdictAllow, Rules: []string{}, Reasons: []string{}},
			},
			{
				note: "one refusal", successor: &successor{effects: public},
				want: &record.SuccessorVerdict{Verdict: record.VerdictDeny, Rules: []string{"no-public"}, Reasons: []string{"public"}},
			},
			{
				note: "two refusals, sorted", successor: &successor{effects: public, unpinned: true},
				want: &record.SuccessorVerdict{Verdict: record.VerdictDeny, Rules: []string{"no-public", "no-unpinned"}, Reasons: []string{"public", "unpinned"}},
			},
		}
		for _, tc := range tests {
			t.Run(tc.note, func(t *testing.T) {
				got := decide(t, e, githubInput(t, m, call{tool: "get_repository", successor: tc.successor}))
				check(t, got, want{verdict: record.VerdictAllow, rules: []string{"allow-all"}, reasons: []string{"everything is allowed"}})
				if !reflect.DeepEqual(got.Successor, tc.want) {
					t.Errorf("successor = %+v, want %+v", got.Successor, tc.want)
				}
			})
		}
	})

	t.Run("an evaluation error denies even when an allow matched", func(t *testing.T) {
		e := build(t, fixture{
			rego:  allowAllRego + `deny contains {"rule": "boom", "reason": "r"} if count(input.session.completed) / 0 == 1`,
			cedar: allowAllCedar + `@id("boom") forbid (principal, action, resource) when { context.noSuchAttribute == 1 };`,
		})
		got := decide(t, e, read)
		check(t, got, want{verdict: record.VerdictDeny, err: true})
		if len(got.Rules) != 0 || got.Approvals != 0 {
			t.Errorf("an erroring decision names rules %v / approvals %d", got.Rules, got.Approvals)
		}
	})

	t.Run("a cancelled context denies", func(t *testing.T) {
		e := build(t, fixture{rego: allowAllRego, cedar: allowAllCedar})
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		doc, err := NewDocument(read)
		if err != nil {
			t.Fatal(err)
		}
		check(t, e.Decide(cctx, doc), want{verdict: record.VerdictDeny, err: true})
	})

	t.Run("a nil document denies", func(t *testing.T) {
		e := build(t, fixture{rego: allowAllRego, cedar: allowAllCedar})
		check(t, e.Decide(ctx, nil), want{verdict: record.VerdictDeny, err: true})
	})

	t.Run("strings are compared exactly, not as patterns", func(t *testing.T) {
		e := build(t, fixture{
			rego:  `allow contains {"rule": "exact", "reason": "r"} if input.formation.arguments.owner == "octo-*"`,
			cedar: `@id("exact") permit (principal, action, resource) when { context.arguments.owner == "octo-*" };`,
		})
		check(t, decide(t, e, read), want{verdict: record.VerdictDeny, rules: []string{ruleDefaultDeny}})
	})

	t.Run("decisions are deterministic and safe for concurrent use", func(t *testing.T) {
		e := build(t, fixture{
			rego: allowAllRego + `
allow contains {"rule": "z-rule", "reason": "z"}
allow contains {"rule": "m-rule", "reason": "m"}
approvals contains {"rule": "m-rule", "count": 2, "reason": "m"}`,
			cedar: allowAllCedar + `
@id("z-rule") @reason("z") permit (principal, action, resource);
@id("m-rule") @reason("m") @approvals("2") permit (principal, action, resource);`,
		})
		doc, err := NewDocument(write)
		if err != nil {
			t.Fatal(err)
		}
		first := e.Decide(ctx, doc)
		check(t, first, want{verdict: record.VerdictAllow, approvals: 2, rules: []string{"allow-all", "m-rule", "z-rule"}})
		var wg sync.WaitGroup
		errs := make(chan string, 16)
		for range 16 {
			wg.Go(func() {
				for range 50 {
					if got := e.Decide(ctx, doc); !reflect.DeepEqual(got, first) {
						errs <- strings.Join(got.Rules, ",")
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Errorf("a concurrent decision differs: rules %s", e)
		}
	})
}
