package policy

import (
	"cmp"
	"context"
	"slices"

	"github.com/fcd-authz/fcd/record"
)

// Engine names, as recorded in [record.EngineDecision.Engine]. A [Set]
// always lists its engines in this order.
const (
	EngineRego  = "rego"
	EngineCedar = "cedar"
)

// Engine is one policy language's compiled policies. Decide never fails:
// any evaluation error, undefined result or malformed policy output is a
// deny with [record.EngineDecision.Error] set, so a caller cannot forget to
// fail closed. An Engine is immutable once built and safe for concurrent
// use by any number of goroutines; it is swapped, never mutated, on
// reload.
type Engine interface {
	// Name is EngineRego or EngineCedar.
	Name() string
	// Decide evaluates the policies over one prepared input document.
	// When the input has a candidate successor, the decision's Successor
	// is the engine's answer on it (a refusal never changes the verdict on
	// the call itself); without one it is nil.
	Decide(ctx context.Context, doc *Document) record.EngineDecision
}

// errorDecision is the fail-closed answer of an engine that could not
// evaluate.
func errorDecision(engine string, err error) record.EngineDecision {
	return record.EngineDecision{
		Engine: engine, Verdict: record.VerdictDeny,
		Rules: []string{}, Reasons: []string{}, Error: err.Error(),
	}
}

// failed is the fail-closed answer of an engine that could not evaluate
// doc: errorDecision, and, when doc has a candidate successor, a refusal of
// it carrying the same error (an engine that could not decide has not
// allowed the successor either).
func failed(engine string, doc *Document, err error) record.EngineDecision {
	d := errorDecision(engine, err)
	if doc != nil && doc.in.Successor != nil {
		d.Successor = successorError(err)
	}
	return d
}

// successorError is the fail-closed answer on a candidate successor whose
// evaluation failed.
func successorError(err error) *record.SuccessorVerdict {
	return &record.SuccessorVerdict{
		Verdict: record.VerdictDeny, Rules: []string{}, Reasons: []string{}, Error: err.Error(),
	}
}

// successorVerdict is the answer on a candidate successor from the merged
// findings that refuse it: deny naming them, or allow with none.
func successorVerdict(fs []finding) *record.SuccessorVerdict {
	v := &record.SuccessorVerdict{
		Verdict: record.VerdictAllow,
		Rules:   make([]string, 0, len(fs)), Reasons: make([]string, 0, len(fs)),
	}
	if len(fs) > 0 {
		v.Verdict = record.VerdictDeny
	}
	for _, f := range fs {
		v.Rules = append(v.Rules, f.rule)
		v.Reasons = append(v.Reasons, f.reason)
	}
	return v
}

// finding is one deciding rule with its reason.
type finding struct{ rule, reason string }

// mergeFindings sorts findings by rule and merges those of the same rule,
// joining their distinct reasons with "; ", so that Rules names each
// deciding rule once and a decision is reproducible byte for byte.
func mergeFindings(fs []finding) []finding {
	slices.SortFunc(fs, func(a, b finding) int {
		return cmp.Or(cmp.Compare(a.rule, b.rule), cmp.Compare(a.reason, b.reason))
	})
	fs = slices.Compact(fs)
	out := fs[:0]
	for _, f := range fs {
		if n := len(out); n > 0 && out[n-1].rule == f.rule {
			out[n-1].reason += "; " + f.reason
			continue
		}
		out = append(out, f)
	}
	return out
}

// decision assembles an engine decision from merged findings, keeping
// Rules and Reasons index-aligned.
func decision(engine string, v record.Verdict, approvals int, fs []finding) record.EngineDecision {
	d := record.EngineDecision{
		Engine: engine, Verdict: v, Approvals: approvals,
		Rules: make([]string, 0, len(fs)), Reasons: make([]string, 0, len(fs)),
	}
	for _, f := range fs {
		d.Rules = append(d.Rules, f.rule)
		d.Reasons = append(d.Reasons, f.reason)
	}
	return d
}
