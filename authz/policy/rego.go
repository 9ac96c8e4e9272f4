package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/fcd-authz/fcd/record"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/metrics"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
)

// RegoPackage is the package every Rego policy of a set contributes to.
// Its partial sets allow, deny, approvals and deny_successor are the whole
// contract between fcd and an operator's Rego (see policies/README.md).
const RegoPackage = "fcd.authz"

// The partial sets of the Rego contract. deny_successor refuses the
// candidate successor (input.successor) without touching the verdict on
// the call.
const (
	regoAllow         = "allow"
	regoDeny          = "deny"
	regoApprovals     = "approvals"
	regoDenySuccessor = "deny_successor"
)

// ruleDefaultDeny names the finding of an engine that denied because no
// allow rule (Rego) or permit policy (Cedar) matched and nothing forbade:
// a deny needs a name in the record like any other decision.
const ruleDefaultDeny = "default-deny"

// unsafeBuiltin reports the built-ins refused in policies: a decision must
// not wait on the network (authzd decides inline with a gateway's request)
// nor read the server's environment (opa.runtime exposes environment
// variables).
func unsafeBuiltin(name string) bool {
	switch name {
	case "http.send", "net.lookup_ip_addr", "opa.runtime":
		return true
	}
	return false
}

// newRegoCompiler returns the compiler configuration shared by the engine
// and the test runner, so tests exercise exactly what production compiles.
func newRegoCompiler(withPrint bool) *ast.Compiler {
	caps := ast.CapabilitiesForThisVersion()
	caps.Builtins = slices.DeleteFunc(slices.Clone(caps.Builtins), func(b *ast.Builtin) bool {
		return unsafeBuiltin(b.Name)
	})
	return ast.NewCompiler().
		WithStrict(true).
		WithCapabilities(caps).
		WithDefaultRegoVersion(ast.RegoV1).
		WithEnablePrintStatements(withPrint)
}

// parseRego parses Rego v1 source files, sorted by name so that errors and
// compilation are deterministic.
func parseRego(files map[string][]byte) (map[string]*ast.Module, error) {
	mods := make(map[string]*ast.Module, len(files))
	for _, name := range slices.Sorted(maps.Keys(files)) {
		m, err := ast.ParseModuleWithOpts(name, string(files[name]), ast.ParserOptions{RegoVersion: ast.RegoV1})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidPolicy, err)
		}
		mods[name] = m
	}
	return mods, nil
}

// RegoEngine evaluates Rego policies of package [RegoPackage] through OPA
// queries prepared when the engine is built, one evaluation per decision.
// It is immutable and safe for concurrent use.
type RegoEngine struct {
	// query binds allow, deny and approvals: it decides inputs without a
	// successor, which so pay nothing for deny_successor.
	query rego.PreparedEvalQuery
	// successorQuery binds deny_successor too, in the same evaluation: it
	// decides inputs with a candidate successor.
	successorQuery rego.PreparedEvalQuery
	// defined tells which of the contract's sets the policies define;
	// Load refuses a set whose Rego defines no allow rule.
	defined map[string]bool
}

// NewRegoEngine parses, compiles (strict mode, Rego v1) and prepares the
// given Rego files (name → source; test files are not expected here). The
// contract's sets, where defined, must be partial set rules ("contains").
// A missing package is not an error here: such an engine denies every
// call with an undefined-result error, which is what a caller that skips
// Load's checks should get.
func NewRegoEngine(ctx context.Context, files map[string][]byte) (*RegoEngine, error) {
	mods, err := parseRego(files)
	if err != nil {
		return nil, err
	}
	c := newRegoCompiler(false)
	if c.Compile(mods); c.Failed() {
		return nil, fmt.Errorf("%w: %w", ErrInvalidPolicy, c.Errors)
	}
	e := &RegoEngine{defined: map[string]bool{}}
	// deny_successor is bound last, so the query without it is a prefix.
	sets := []string{regoAllow, regoDeny, regoApprovals, regoDenySuccessor}
	bindings := make([]string, 0, len(sets))
	for _, set := range sets {
		ref := ast.MustParseRef("data." + RegoPackage + "." + set)
		rules := c.GetRulesExact(ref)
		for _, r := range rules {
			if r.Head.RuleKind() != ast.MultiValue {
				return nil, fmt.Errorf("%w: %s:%d: %s must be a partial set rule (%s contains {...} if ...)",
					ErrInvalidPolicy, r.Location.File, r.Location.Row, ref, set)
			}
		}
		if len(rules) > 0 {
			e.defined[set] = true
			bindings = append(bindings, set+" := "+ref.String())
			continue
		}
		// An undefined deny, approvals or deny_successor set is empty; an
		// undefined allow set leaves the query undefined, which denies.
		if set == regoAllow {
			bindings = append(bindings, set+" := "+ref.String())
		} else {
			bindings = append(bindings, set+" := set()")
		}
	}
	prepare := func(bindings []string) (rego.PreparedEvalQuery, error) {
		r := rego.New(
			rego.Query(strings.Join(bindings, "; ")),
			rego.Compiler(c),
			rego.Store(inmem.New()),
			rego.Strict(true),
			rego.StrictBuiltinErrors(true),
			rego.SetRegoVersion(ast.RegoV1),
		)
		q, err := r.PrepareForEval(ctx)
		if err != nil {
			return q, fmt.Errorf("%w: prepare: %w", ErrInvalidPolicy, err)
		}
		return q, nil
	}
	if e.query, err = prepare(bindings[:len(bindings)-1]); err != nil {
		return nil, err
	}
	if e.successorQuery, err = prepare(bindings); err != nil {
		return nil, err
	}
	return e, nil
}

// Name returns EngineRego.
func (e *RegoEngine) Name() string { return EngineRego }

// Decide evaluates one prepared query with doc as input. Deny elements
// override allow elements; without an allow element the call is denied;
// the approval obligation is the largest approvals count. When the input
// has a candidate successor, deny_successor is evaluated in the same
// query and any element refuses the successor; the verdict on the call
// does not depend on it. Any evaluation error or malformed element, in
// deny_successor too, fails the whole decision closed. Without a
// successor deny_successor is not evaluated at all.
func (e *RegoEngine) Decide(ctx context.Context, doc *Document) record.EngineDecision {
	// OPA only notices cancellation while a long evaluation runs; a caller
	// that has given up must never get an allow.
	if err := ctx.Err(); err != nil {
		return failed(EngineRego, doc, err)
	}
	if doc == nil {
		return failed(EngineRego, doc, ErrInvalidInput)
	}
	q := &e.query
	if doc.in.Successor != nil {
		q = &e.successorQuery
	}
	rs, err := q.Eval(ctx, rego.EvalParsedInput(doc.value), rego.EvalMetrics(metrics.NoOp()))
	if err != nil {
		return failed(EngineRego, doc, fmt.Errorf("evaluation: %w", err))
	}
	if len(rs) != 1 {
		return failed(EngineRego, doc, fmt.Errorf("undefined result: package %s defines no allow set", RegoPackage))
	}
	b := rs[0].Bindings
	deny, err := regoFindings(b[regoDeny], regoDeny, false)
	if err != nil {
		return failed(EngineRego, doc, err)
	}
	allow, err := regoFindings(b[regoAllow], regoAllow, false)
	if err != nil {
		return failed(EngineRego, doc, err)
	}
	obligations, err := regoFindings(b[regoApprovals], regoApprovals, true)
	if err != nil {
		return failed(EngineRego, doc, err)
	}
	var refusals []regoElement
	if doc.in.Successor != nil {
		if refusals, err = regoFindings(b[regoDenySuccessor], regoDenySuccessor, false); err != nil {
			return failed(EngineRego, doc, err)
		}
	}
	var d record.EngineDecision
	switch {
	case len(deny) > 0:
		d = decision(EngineRego, record.VerdictDeny, 0, mergeFindings(findingsOf(deny)))
	case len(allow) == 0:
		d = decision(EngineRego, record.VerdictDeny, 0,
			[]finding{{ruleDefaultDeny, "no allow rule of package " + RegoPackage + " matched"}})
	default:
		n := 0
		for _, o := range obligations {
			n = max(n, o.count)
		}
		d = decision(EngineRego, record.VerdictAllow, n, mergeFindings(append(findingsOf(allow), findingsOf(obligations)...)))
	}
	if doc.in.Successor != nil {
		d.Successor = successorVerdict(mergeFindings(findingsOf(refusals)))
	}
	return d
}

// regoElement is one element of allow, deny, approvals or deny_successor.
type regoElement struct {
	finding
	count int
}

func findingsOf(es []regoElement) []finding {
	out := make([]finding, len(es))
	for i, e := range es {
		out[i] = e.finding
	}
	return out
}

// regoFindings validates one of the contract's sets as evaluated: a set
// (JSON array) of objects with a non-empty string "rule", an optional
// string "reason" and, for approvals, a positive integer "count". Anything
// else is a malformed policy output, which denies.
func regoFindings(v any, set string, counted bool) ([]regoElement, error) {
	elems, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("malformed %s: want a set of objects, got %T", set, v)
	}
	out := make([]regoElement, 0, len(elems))
	for _, el := range elems {
		obj, ok := el.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("malformed %s element %v: want an object", set, el)
		}
		rule, ok := obj["rule"].(string)
		if !ok || rule == "" {
			return nil, fmt.Errorf("malformed %s element %v: want a non-empty string \"rule\"", set, el)
		}
		e := regoElement{finding: finding{rule: rule, reason: rule}}
		if r, present := obj["reason"]; present {
			s, ok := r.(string)
			if !ok {
				return nil, fmt.Errorf("malformed %s element %v: \"reason\" must be a string", set, el)
			}
			if s != "" {
				e.reason = s
			}
		}
		if counted {
			n, err := positiveCount(obj["count"])
			if err != nil {
				return nil, fmt.Errorf("malformed %s element %v: %w", set, el, err)
			}
			e.count = n
		}
		out = append(out, e)
	}
	return out, nil
}

// maxApprovals bounds an approval obligation: a count above it is a
// policy bug (nobody has a thousand distinct approvers), not a request.
const maxApprovals = 100

func positiveCount(v any) (int, error) {
	var n int64
	switch x := v.(type) {
	case json.Number:
		i, err := x.Int64()
		if err != nil {
			return 0, errors.New("\"count\" must be an integer")
		}
		n = i
	default:
		return 0, fmt.Errorf("\"count\" must be a positive integer, got %T", v)
	}
	if n < 1 || n > maxApprovals {
		return 0, fmt.Errorf("\"count\" must be between 1 and %d, got %d", maxApprovals, n)
	}
	return int(n), nil
}
