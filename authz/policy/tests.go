package policy

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/tester"

	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
)

// regoTestTimeout bounds one Rego test; a policy test that runs longer is
// almost certainly looping over a generated set.
const regoTestTimeout = 10 * time.Second

// TestResult is the outcome of one Rego test rule or one Cedar case.
type TestResult struct {
	// Engine is EngineRego or EngineCedar.
	Engine string `json:"engine"`
	// File is the file that holds the test.
	File string `json:"file"`
	// Name is the Rego rule (data.pkg.test_x) or the Cedar case name.
	Name    string `json:"name"`
	Passed  bool   `json:"passed"`
	Skipped bool   `json:"skipped,omitempty"`
	// Message says why a test failed.
	Message  string        `json:"message,omitempty"`
	Duration time.Duration `json:"duration"`
}

// TestReport is the outcome of running a policy set's own tests: every
// Rego test (*_test.rego, run by OPA's tester) and every Cedar case
// (*.cases.json, run by the Cedar engine alone), sorted by engine, file
// and name.
type TestReport struct {
	// Digest is the policy digest of the files tested.
	Digest  string       `json:"digest"`
	Results []TestResult `json:"results"`
}

// Passed reports whether no test failed. Skipped Rego tests (todo_test_)
// do not fail a set.
func (r *TestReport) Passed() bool {
	for i := range r.Results {
		if !r.Results[i].Passed && !r.Results[i].Skipped {
			return false
		}
	}
	return true
}

// Failures returns the failed results.
func (r *TestReport) Failures() []TestResult {
	var out []TestResult
	for _, t := range r.Results {
		if !t.Passed && !t.Skipped {
			out = append(out, t)
		}
	}
	return out
}

// counts returns passed, failed and skipped tests of one engine.
func (r *TestReport) counts(engine string) (passed, failed, skipped int) {
	for _, t := range r.Results {
		switch {
		case t.Engine != engine:
		case t.Skipped:
			skipped++
		case t.Passed:
			passed++
		default:
			failed++
		}
	}
	return passed, failed, skipped
}

func (r *TestReport) summary() string {
	parts := make([]string, 0, 2)
	for _, e := range []string{EngineRego, EngineCedar} {
		p, f, s := r.counts(e)
		part := fmt.Sprintf("%s: %d passed, %d failed", e, p, f)
		if s > 0 {
			part += fmt.Sprintf(", %d skipped", s)
		}
		parts = append(parts, part)
	}
	// The summary ends up in logs and /readyz: name the first failures and
	// why, on one line.
	const shown = 3
	var failed []string
	fs := r.Failures()
	for _, t := range fs[:min(len(fs), shown)] {
		msg, _, _ := strings.Cut(t.Message, "\n")
		failed = append(failed, fmt.Sprintf("%s: %s: %s", t.File, t.Name, msg))
	}
	if len(fs) > shown {
		failed = append(failed, fmt.Sprintf("and %d more", len(fs)-shown))
	}
	s := strings.Join(parts, "; ")
	if len(failed) > 0 {
		s += " — " + strings.Join(failed, "; ")
	}
	return s
}

// Print writes a readable report to w — every result when verbose, else
// only failures — followed by a summary line, and returns whether all
// tests passed. It is what `authzd policy test` prints.
func (r *TestReport) Print(w io.Writer, verbose bool) bool {
	for _, t := range r.Results {
		status := "PASS"
		switch {
		case t.Skipped:
			status = "SKIP"
		case !t.Passed:
			status = "FAIL"
		}
		if status != "FAIL" && !verbose {
			continue
		}
		fmt.Fprintf(w, "%s  %-5s  %s  %s (%s)\n", status, t.Engine, t.File, t.Name, t.Duration.Round(time.Microsecond))
		if t.Message != "" {
			for line := range strings.SplitSeq(strings.TrimRight(t.Message, "\n"), "\n") {
				fmt.Fprintf(w, "      %s\n", line)
			}
		}
	}
	ok := r.Passed()
	verdict := "PASS"
	if !ok {
		verdict = "FAIL"
	}
	var parts []string
	for _, e := range []string{EngineRego, EngineCedar} {
		p, f, s := r.counts(e)
		part := fmt.Sprintf("%s %d passed, %d failed", e, p, f)
		if s > 0 {
			part += fmt.Sprintf(", %d skipped", s)
		}
		if p+f+s == 0 {
			part += " (no tests)"
		}
		parts = append(parts, part)
	}
	fmt.Fprintf(w, "%s  policy %s: %s\n", verdict, r.Digest, strings.Join(parts, "; "))
	return ok
}

// RunTests reads and compiles the policy set in fsys like [Load] and runs
// its tests, returning the report whether or not they pass. The error is
// for a set that cannot be tested at all (unreadable, does not compile, a
// malformed cases file).
func RunTests(ctx context.Context, fsys fs.FS) (*TestReport, error) {
	pf, err := readPolicyFiles(fsys)
	if err != nil {
		return nil, err
	}
	s, err := compileSet(ctx, pf)
	if err != nil {
		return nil, err
	}
	return runSetTests(ctx, s, pf)
}

func runSetTests(ctx context.Context, s *Set, pf *policyFiles) (*TestReport, error) {
	rep := &TestReport{Digest: pf.digest, Results: []TestResult{}}
	rr, err := runRegoTests(ctx, pf)
	if err != nil {
		return nil, err
	}
	rep.Results = append(rep.Results, rr...)
	for _, name := range engineFiles(pf.cases) {
		cr, err := runCedarCases(ctx, s.cedar, name, pf.cases[name])
		if err != nil {
			return nil, err
		}
		rep.Results = append(rep.Results, cr...)
	}
	slices.SortStableFunc(rep.Results, func(a, b TestResult) int {
		return cmp.Or(
			cmp.Compare(engineOrder(a.Engine), engineOrder(b.Engine)),
			cmp.Compare(a.File, b.File),
		)
	})
	return rep, nil
}

func engineOrder(e string) int {
	if e == EngineRego {
		return 0
	}
	return 1
}

// runRegoTests runs every test_ rule of the Rego policies and test files
// with OPA's tester, compiled exactly as the engine compiles (strict, the
// same capabilities), with builtin errors raised as in production.
func runRegoTests(ctx context.Context, pf *policyFiles) ([]TestResult, error) {
	all := maps.Clone(pf.rego)
	maps.Copy(all, pf.regoTests)
	mods, err := parseRego(all)
	if err != nil {
		return nil, err
	}
	ch, err := tester.NewRunner().
		SetCompiler(newRegoCompiler(true)).
		SetModules(mods).
		RaiseBuiltinErrors(true).
		SetTimeout(regoTestTimeout).
		RunTests(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: compile Rego tests: %w", ErrInvalidPolicy, err)
	}
	var out []TestResult
	for r := range ch {
		tr := TestResult{Engine: EngineRego, Name: r.Package + "." + r.Name, Passed: r.Pass(), Skipped: r.Skip, Duration: r.Duration}
		if r.Location != nil {
			tr.File = r.Location.File
		}
		switch {
		case r.Error != nil:
			tr.Message = "error: " + r.Error.Error()
		case r.Fail:
			tr.Message = "the test rule is false or undefined"
			if r.Location != nil {
				tr.Message += fmt.Sprintf(" (%s:%d)", r.Location.File, r.Location.Row)
			}
		}
		if !tr.Passed && len(r.Output) > 0 {
			tr.Message += "\nprint output:\n" + string(r.Output)
		}
		out = append(out, tr)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("policy: Rego tests: %w", err)
	}
	slices.SortFunc(out, func(a, b TestResult) int { return cmp.Or(cmp.Compare(a.File, b.File), cmp.Compare(a.Name, b.Name)) })
	return out, nil
}

// CedarCase is one entry of a *.cases.json file: an Input and the decision
// the Cedar policies must reach on it.
type CedarCase struct {
	Name   string          `json:"name"`
	Input  json.RawMessage `json:"input"`
	Expect CedarExpect     `json:"expect"`
}

// CedarExpect is what a Cedar case expects.
type CedarExpect struct {
	Verdict record.Verdict `json:"verdict"`
	// Approvals, when set, must equal the engine's obligation.
	Approvals *int `json:"approvals,omitempty"`
	// Rules must all be among the deciding policy ids (a subset check).
	Rules []string `json:"rules,omitempty"`
	// Error expects an evaluation error (and so a deny), of the decision or
	// of the answer on the successor. Without it an evaluation error fails
	// the case even when a deny was expected: a policy that only denies
	// because it is broken is not tested.
	Error bool `json:"error,omitempty"`
	// Successor, when set ("allow" or "deny"), is the expected answer on
	// the input's candidate successor; the input must have one.
	Successor *record.Verdict `json:"successor,omitempty"`
	// SuccessorRules must all be among the policy ids that refused the
	// successor (a subset check).
	SuccessorRules []string `json:"successorRules,omitempty"`
}

func runCedarCases(ctx context.Context, e *CedarEngine, file string, data []byte) ([]TestResult, error) {
	var cases []CedarCase
	if err := manifest.DecodeStrict(data, &cases); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInvalidPolicy, file, err)
	}
	seen := map[string]bool{}
	out := make([]TestResult, 0, len(cases))
	for i, c := range cases {
		switch {
		case c.Name == "":
			return nil, fmt.Errorf("%w: %s: case %d has no name", ErrInvalidPolicy, file, i)
		case seen[c.Name]:
			return nil, fmt.Errorf("%w: %s: duplicate case name %q", ErrInvalidPolicy, file, c.Name)
		case c.Expect.Verdict != record.VerdictAllow && c.Expect.Verdict != record.VerdictDeny:
			return nil, fmt.Errorf("%w: %s: case %q: expect.verdict must be \"allow\" or \"deny\"", ErrInvalidPolicy, file, c.Name)
		case c.Expect.Successor != nil && *c.Expect.Successor != record.VerdictAllow && *c.Expect.Successor != record.VerdictDeny:
			return nil, fmt.Errorf("%w: %s: case %q: expect.successor must be \"allow\" or \"deny\"", ErrInvalidPolicy, file, c.Name)
		case len(c.Expect.SuccessorRules) > 0 && c.Expect.Successor == nil:
			return nil, fmt.Errorf("%w: %s: case %q: expect.successorRules needs expect.successor", ErrInvalidPolicy, file, c.Name)
		}
		seen[c.Name] = true
		start := time.Now()
		msg := checkCedarCase(ctx, e, &c)
		out = append(out, TestResult{
			Engine: EngineCedar, File: file, Name: c.Name, Passed: msg == "",
			Message: msg, Duration: time.Since(start),
		})
	}
	return out, nil
}

// checkCedarCase returns why the case fails, or "".
func checkCedarCase(ctx context.Context, e Engine, c *CedarCase) string {
	in, err := DecodeInput(c.Input)
	if err != nil {
		return err.Error()
	}
	var d record.EngineDecision
	if doc, err := NewDocument(in); err != nil {
		d = errorDecision(e.Name(), err)
	} else {
		d = e.Decide(ctx, doc)
	}
	return expectationMismatch(&c.Expect, &d)
}

// expectationMismatch compares a decision with an expectation.
func expectationMismatch(want *CedarExpect, got *record.EngineDecision) string {
	var problems []string
	gs := got.Successor
	switch {
	case got.Error != "" && !want.Error:
		return "evaluation error: " + got.Error
	case gs != nil && gs.Error != "" && !want.Error:
		return "evaluation error on the successor: " + gs.Error
	case got.Error == "" && (gs == nil || gs.Error == "") && want.Error:
		problems = append(problems, "want an evaluation error, got none")
	}
	switch {
	case want.Successor == nil:
	case gs == nil:
		problems = append(problems, fmt.Sprintf("want successor %s, but the input has no successor", *want.Successor))
	default:
		if gs.Verdict != *want.Successor {
			problems = append(problems, fmt.Sprintf("want successor %s, got %s (by %v: %v)", *want.Successor, gs.Verdict, gs.Rules, gs.Reasons))
		}
		for _, r := range want.SuccessorRules {
			if !slices.Contains(gs.Rules, r) {
				problems = append(problems, fmt.Sprintf("want rule %q among the rules refusing the successor", r))
			}
		}
	}
	if got.Verdict != want.Verdict {
		problems = append(problems, fmt.Sprintf("want %s, got %s", want.Verdict, got.Verdict))
	}
	if want.Approvals != nil && *want.Approvals != got.Approvals {
		problems = append(problems, fmt.Sprintf("want %d approvals, got %d", *want.Approvals, got.Approvals))
	}
	for _, r := range want.Rules {
		if !slices.Contains(got.Rules, r) {
			problems = append(problems, fmt.Sprintf("want rule %q among the deciding rules", r))
		}
	}
	if len(problems) == 0 {
		return ""
	}
	return strings.Join(problems, "; ") + fmt.Sprintf(" (decided %s by %v: %v)", got.Verdict, got.Rules, got.Reasons)
}
