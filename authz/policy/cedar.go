package policy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cedar-policy/cedar-go"
	"github.com/cedar-policy/cedar-go/types"
	"github.com/fcd-authz/fcd/record"
	"github.com/open-policy-agent/opa/v1/ast"
)

// Cedar entity types of the mapping documented in policies/README.md.
const (
	cedarPrincipal = cedar.EntityType("Principal")
	cedarAction    = cedar.EntityType("Action")
	cedarTool      = cedar.EntityType("Tool")
	cedarServer    = cedar.EntityType("Server")
)

// actionSubstitute is the action of the second request made when the
// input has a candidate successor: a forbid that matches it refuses the
// successor. Permits of it mean nothing (no permit is not a refusal).
var actionSubstitute = cedar.NewEntityUID(cedarAction, "substitute")

// Cedar policy annotations fcd reads.
const (
	// annID names a policy in decisions; every policy must have one.
	annID = "id"
	// annApprovals is a permit policy's approval obligation, "1".."100".
	annApprovals = "approvals"
	// annReason is the human-readable reason recorded when the policy
	// decides; without it the id is used.
	annReason = "reason"
)

// cedarPolicy is one parsed policy with the annotations fcd uses.
type cedarPolicy struct {
	id        cedar.PolicyID
	policy    *cedar.Policy
	approvals int
	reason    string
}

// cedarPolicies iterates policies in id order, so that Cedar evaluates
// them in the same order every time (a cedar.PolicySet iterates a map).
type cedarPolicies []cedarPolicy

// All implements cedar.PolicyIterator.
func (ps cedarPolicies) All() iter.Seq2[cedar.PolicyID, *cedar.Policy] {
	return func(yield func(cedar.PolicyID, *cedar.Policy) bool) {
		for _, p := range ps {
			if !yield(p.id, p.policy) {
				return
			}
		}
	}
}

// CedarEngine evaluates Cedar policies with cedar-go under the mapping of
// policies/README.md: principal Principal::"<id>", action
// Action::"<sideEffects>", resource Tool::"<server/tool>" in
// Server::"<server>", and the formation, epoch and session in context.
// It is immutable and safe for concurrent use.
type CedarEngine struct {
	policies cedarPolicies
	byID     map[cedar.PolicyID]*cedarPolicy
}

// NewCedarEngine parses the given Cedar files (name → source). Every
// policy must carry a unique @id("...") annotation, because decisions name
// the deciding policies by id; @approvals("N") is allowed on permit
// policies only.
func NewCedarEngine(files map[string][]byte) (*CedarEngine, error) {
	e := &CedarEngine{byID: map[cedar.PolicyID]*cedarPolicy{}}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		list, err := cedar.NewPolicyListFromBytes(name, files[name])
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrInvalidPolicy, name, err)
		}
		for _, p := range list {
			cp, err := newCedarPolicy(p)
			if err != nil {
				pos := p.Position()
				return nil, fmt.Errorf("%w: %s:%d: %w", ErrInvalidPolicy, name, pos.Line, err)
			}
			if _, dup := e.byID[cp.id]; dup {
				return nil, fmt.Errorf("%w: %s:%d: duplicate policy id %q", ErrInvalidPolicy, name, p.Position().Line, cp.id)
			}
			e.policies = append(e.policies, cp)
			e.byID[cp.id] = nil
		}
	}
	slices.SortFunc(e.policies, func(a, b cedarPolicy) int { return cmp.Compare(a.id, b.id) })
	for i := range e.policies {
		e.byID[e.policies[i].id] = &e.policies[i]
	}
	return e, nil
}

func newCedarPolicy(p *cedar.Policy) (cedarPolicy, error) {
	ann := p.Annotations()
	id := strings.TrimSpace(string(ann[annID]))
	if id == "" {
		return cedarPolicy{}, errors.New(`policy has no @id("...") annotation`)
	}
	cp := cedarPolicy{id: cedar.PolicyID(id), policy: p, reason: string(ann[annReason])}
	if cp.reason == "" {
		cp.reason = id
	}
	if a, ok := ann[annApprovals]; ok {
		if p.Effect() != cedar.Permit {
			return cedarPolicy{}, fmt.Errorf("policy %q: @approvals is only meaningful on a permit policy", id)
		}
		n, err := strconv.Atoi(string(a))
		if err != nil || n < 1 || n > maxApprovals {
			return cedarPolicy{}, fmt.Errorf("policy %q: @approvals(%q) must be an integer from 1 to %d", id, a, maxApprovals)
		}
		cp.approvals = n
	}
	return cp, nil
}

// Name returns EngineCedar.
func (e *CedarEngine) Name() string { return EngineCedar }

// Decide maps doc to a Cedar request and authorizes it. Forbid wins; no
// permit denies; any diagnostic error denies even if a permit matched
// (fail closed: an erroring forbid might have applied). The approval
// obligation is the largest @approvals of the determining permits.
//
// When the input has a candidate successor, a second request with the
// same principal, resource and context and the action
// Action::"substitute" decides it: a matching forbid or any diagnostic
// error refuses it; no matching permit does not. The verdict on the call
// is the first request's alone.
func (e *CedarEngine) Decide(ctx context.Context, doc *Document) record.EngineDecision {
	if err := ctx.Err(); err != nil {
		return failed(EngineCedar, doc, err)
	}
	if doc == nil {
		return failed(EngineCedar, doc, ErrInvalidInput)
	}
	entities, req, err := cedarRequest(doc)
	if err != nil {
		return failed(EngineCedar, doc, fmt.Errorf("input: %w", err))
	}
	d := e.decide(entities, req)
	if doc.in.Successor != nil {
		req.Action = actionSubstitute
		d.Successor = e.substitute(entities, req)
	}
	return d
}

// decide authorizes the call's own request.
func (e *CedarEngine) decide(entities cedar.EntityMap, req cedar.Request) record.EngineDecision {
	verdict, diag := cedar.Authorize(e.policies, entities, req)
	if len(diag.Errors) > 0 {
		return errorDecision(EngineCedar, diagnosticError(diag))
	}
	if verdict == cedar.Deny && len(diag.Reasons) == 0 {
		return decision(EngineCedar, record.VerdictDeny, 0,
			[]finding{{ruleDefaultDeny, "no permit policy matched"}})
	}
	fs := make([]finding, 0, len(diag.Reasons))
	n := 0
	for _, r := range diag.Reasons {
		p := e.byID[r.PolicyID]
		fs = append(fs, finding{string(p.id), p.reason})
		n = max(n, p.approvals)
	}
	if verdict == cedar.Deny {
		return decision(EngineCedar, record.VerdictDeny, 0, mergeFindings(fs))
	}
	return decision(EngineCedar, record.VerdictAllow, n, mergeFindings(fs))
}

// substitute authorizes req, whose action is Action::"substitute", and
// answers on the candidate successor: refused by the matching forbids, or
// by any diagnostic error (fail closed: an erroring forbid might have
// applied); allowed otherwise, whether or not a permit matched.
func (e *CedarEngine) substitute(entities cedar.EntityMap, req cedar.Request) *record.SuccessorVerdict {
	verdict, diag := cedar.Authorize(e.policies, entities, req)
	if len(diag.Errors) > 0 {
		return successorError(diagnosticError(diag))
	}
	if verdict != cedar.Deny {
		return successorVerdict(nil)
	}
	// A deny with reasons lists the matching forbids; one without is
	// Cedar's default deny (no permit of substitute), not a refusal.
	fs := make([]finding, 0, len(diag.Reasons))
	for _, r := range diag.Reasons {
		p := e.byID[r.PolicyID]
		fs = append(fs, finding{string(p.id), p.reason})
	}
	return successorVerdict(mergeFindings(fs))
}

// diagnosticError joins Cedar's diagnostic errors, sorted, into one.
func diagnosticError(diag cedar.Diagnostic) error {
	msgs := make([]string, len(diag.Errors))
	for i, de := range diag.Errors {
		msgs[i] = de.String()
	}
	slices.Sort(msgs)
	return errors.New(strings.Join(msgs, "; "))
}

// cedarRequest builds the entities and request of the mapping. Fixed fields
// come from the typed Input; arguments and principal attributes, which are
// free-form JSON, from the document's value tree.
func cedarRequest(doc *Document) (cedar.EntityMap, cedar.Request, error) {
	in := doc.in
	args, err := cedarRecordAt(doc.value, "arguments", "formation", "arguments")
	if err != nil {
		return nil, cedar.Request{}, err
	}
	attrs, err := cedarRecordAt(doc.value, "principal attributes", "formation", "principal", "attributes")
	if err != nil {
		return nil, cedar.Request{}, err
	}
	t := &in.Tool
	principal := cedar.NewEntityUID(cedarPrincipal, cedar.String(in.Formation.Principal.ID))
	server := cedar.NewEntityUID(cedarServer, cedar.String(t.Server))
	tool := cedar.NewEntityUID(cedarTool, cedar.String(t.QualifiedName))
	entities := cedar.EntityMap{
		principal: {UID: principal, Attributes: attrs},
		server:    {UID: server, Attributes: cedar.NewRecord(cedar.RecordMap{"name": cedar.String(t.Server)})},
		tool:      {UID: tool, Parents: cedar.NewEntityUIDSet(server), Attributes: cedarToolOf(t)},
	}
	f := &in.Formation
	formation := cedar.RecordMap{
		"id":               cedar.String(f.ID),
		"digest":           cedar.String(f.Digest),
		"session":          cedar.String(f.Session),
		"snapshot":         cedar.String(f.Snapshot),
		"tool":             cedar.String(f.Tool),
		"argumentDigest":   cedar.String(f.ArgumentDigest),
		"descriptorDigest": cedar.String(f.DescriptorDigest),
		"source":           cedar.NewRecord(cedarTarget(&f.Source)),
		"hasSuccessor":     cedar.Boolean(f.Successor != nil),
		"hasRecovery":      cedar.Boolean(f.Recovery != nil),
	}
	if r := f.Recovery; r != nil {
		mode := cedar.RecordMap{"error": cedar.String(""), "recovery": cedar.String("")}
		if m := r.FailureMode; m != nil {
			mode = cedar.RecordMap{"error": cedar.String(m.Error), "recovery": cedar.String(m.Recovery)}
		}
		formation["recovery"] = cedar.NewRecord(cedar.RecordMap{
			"of": cedar.String(r.Of), "root": cedar.String(r.Root), "attempt": cedar.Long(r.Attempt),
			"outcome": cedar.String(r.Outcome), "failureMode": cedar.NewRecord(mode),
		})
	}
	reqContext := cedar.RecordMap{
		"arguments": args,
		"epoch":     cedarEpochOf(&in.Epoch),
		"session": cedar.NewRecord(cedar.RecordMap{
			"id":        cedar.String(in.Session.Session),
			"completed": cedarStrings(in.Session.Completed),
			"admitted":  cedarStrings(in.Session.Admitted),
		}),
		"principal": attrs,
	}
	if fs := f.Successor; fs != nil {
		effects, err := cedarRecordAt(doc.value, "formation successor effects", "formation", "successor", "effects")
		if err != nil {
			return nil, cedar.Request{}, err
		}
		target := cedarTarget(&fs.Target)
		target["certificate"] = cedar.String(fs.Certificate)
		target["issuer"] = cedar.String(fs.Issuer)
		target["effects"] = effects
		formation["successor"] = cedar.NewRecord(target)
	}
	if s := in.Successor; s != nil {
		succ, err := cedarSuccessor(doc, s)
		if err != nil {
			return nil, cedar.Request{}, err
		}
		reqContext["successor"] = succ
	}
	reqContext["formation"] = cedar.NewRecord(formation)
	req := cedar.Request{
		Principal: principal,
		Action:    cedar.NewEntityUID(cedarAction, cedar.String(t.SideEffects)),
		Resource:  tool,
		Context:   cedar.NewRecord(reqContext),
	}
	return entities, req, nil
}

// cedarSuccessor is context.successor: the target epoch, described like
// context.epoch, and the certificate that covers the call, its modeled
// effects converted from the free-form JSON.
func cedarSuccessor(doc *Document, s *SuccessorInput) (cedar.Record, error) {
	effects, err := cedarRecordAt(doc.value, "successor certificate effects", "successor", "certificate", "effects")
	if err != nil {
		return cedar.Record{}, err
	}
	c := &s.Certificate
	return cedar.NewRecord(cedar.RecordMap{
		"epoch": cedarEpoch(&s.Epoch),
		"certificate": cedar.NewRecord(cedar.RecordMap{
			"id":      cedar.String(c.ID),
			"issuer":  cedar.String(c.Issuer),
			"source":  cedar.String(c.Source),
			"target":  cedar.String(c.Target),
			"tool":    cedar.String(c.Tool),
			"effects": effects,
			"profile": cedar.NewRecord(cedar.RecordMap{
				"id":     cedar.String(c.Profile.ID),
				"digest": cedar.String(c.Profile.Digest),
			}),
			// The same RFC 3339 text the JSON input (and so Rego) has.
			"expiresAt": cedar.String(c.ExpiresAt.Format(time.RFC3339Nano)),
		}),
	}), nil
}

// cedarToolOf is the tool entity's attributes: as an [InputCache] made
// them, or made now.
func cedarToolOf(t *ToolInput) cedar.Record {
	if t.cedar != nil {
		return *t.cedar
	}
	return cedarToolAttributes(t)
}

func cedarToolAttributes(t *ToolInput) cedar.Record {
	return cedar.NewRecord(cedar.RecordMap{
		"name":             cedar.String(t.Name),
		"server":           cedar.String(t.Server),
		"qualifiedName":    cedar.String(t.QualifiedName),
		"sideEffects":      cedar.String(t.SideEffects),
		"requiresApproval": cedar.Boolean(t.RequiresApproval),
		"requires":         cedarStrings(t.Requires),
		"exclusiveWith":    cedarStrings(t.ExclusiveWith),
		"producesInputFor": cedarStrings(t.ProducesInputFor),
	})
}

// cedarEpochOf is the epoch's record in the request context: as an
// [InputCache] made it, or made now.
func cedarEpochOf(ep *EpochInput) cedar.Record {
	if ep.cedar != nil {
		return *ep.cedar
	}
	return cedarEpoch(ep)
}

func cedarEpoch(ep *EpochInput) cedar.Record {
	return cedar.NewRecord(cedar.RecordMap{
		"id":             cedar.String(ep.ID),
		"server":         cedar.String(ep.Server),
		"release":        cedar.String(ep.Release),
		"pool":           cedar.String(ep.Pool),
		"state":          cedar.String(ep.State),
		"artifactPinned": cedar.Boolean(ep.ArtifactPinned),
		"configDigest":   cedar.String(ep.ConfigDigest),
	})
}

func cedarTarget(t *record.Target) cedar.RecordMap {
	return cedar.RecordMap{
		"epoch":          cedar.String(t.Epoch),
		"server":         cedar.String(t.Server),
		"release":        cedar.String(t.Release),
		"pool":           cedar.String(t.Pool),
		"artifactPinned": cedar.Boolean(t.Artifact.Pinned()),
		"configDigest":   cedar.String(t.ConfigDigest),
	}
}

func cedarStrings(ss []string) cedar.Set {
	vs := make([]cedar.Value, len(ss))
	for i, s := range ss {
		vs[i] = cedar.String(s)
	}
	return cedar.NewSet(vs...)
}

// cedarRecordAt converts the JSON object at path to a record; an absent or
// null member is the empty record, anything but an object an error.
func cedarRecordAt(doc ast.Value, what string, path ...string) (cedar.Record, error) {
	switch v := lookup(doc, path...).(type) {
	case nil, ast.Null:
		return cedar.NewRecord(nil), nil
	case ast.Object:
		r, err := cedarRecord(v, what)
		if err != nil {
			return cedar.Record{}, err
		}
		return r, nil
	default:
		return cedar.Record{}, fmt.Errorf("%s: want a JSON object, got %s", what, ast.ValueName(v))
	}
}

func cedarRecord(obj ast.Object, path string) (cedar.Record, error) {
	rm := make(cedar.RecordMap, obj.Len())
	err := obj.Iter(func(k, v *ast.Term) error {
		key, ok := k.Value.(ast.String)
		if !ok {
			return fmt.Errorf("%s: non-string key %v", path, k)
		}
		if _, null := v.Value.(ast.Null); null {
			return nil // null members are absent: `has` is false
		}
		cv, err := cedarValue(v.Value, path+"."+string(key))
		if err != nil {
			return err
		}
		rm[cedar.String(key)] = cv
		return nil
	})
	if err != nil {
		return cedar.Record{}, err
	}
	return cedar.NewRecord(rm), nil
}

// cedarValue maps a JSON value to Cedar: objects → records (null members
// dropped), arrays → sets, integers → Long, numbers with at most four
// decimal places → decimal, strings, bools. Anything Cedar cannot hold
// exactly (a null in an array, a number out of range or too precise) is an
// error, and the engine denies: a lossy conversion could flip a decision.
func cedarValue(v ast.Value, path string) (cedar.Value, error) {
	switch x := v.(type) {
	case ast.String:
		return cedar.String(x), nil
	case ast.Boolean:
		return cedar.Boolean(x), nil
	case ast.Number:
		n, err := cedarNumber(string(x))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return n, nil
	case ast.Object:
		return cedarRecord(x, path)
	case *ast.Array:
		vs := make([]cedar.Value, x.Len())
		for i := range x.Len() {
			e := x.Elem(i).Value
			if _, null := e.(ast.Null); null {
				return nil, fmt.Errorf("%s[%d]: null has no Cedar value", path, i)
			}
			cv, err := cedarValue(e, path+"["+strconv.Itoa(i)+"]")
			if err != nil {
				return nil, err
			}
			vs[i] = cv
		}
		return cedar.NewSet(vs...), nil
	default:
		return nil, fmt.Errorf("%s: unexpected JSON value %s", path, ast.ValueName(v))
	}
}

func cedarNumber(s string) (cedar.Value, error) {
	if i, err := strconv.ParseInt(s, 10, 64); err == nil {
		return cedar.Long(i), nil
	}
	if strings.ContainsAny(s, "eE") {
		// Exponent notation: accepted only for integers a float64 holds
		// exactly, as RFC 8785 prints large integral values this way.
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
			return nil, fmt.Errorf("number %s has no exact Cedar value", s)
		}
		return cedar.Long(int64(f)), nil
	}
	whole, frac, ok := strings.Cut(s, ".")
	if !ok {
		return nil, fmt.Errorf("number %s is out of the range of a Cedar Long", s)
	}
	frac = strings.TrimRight(frac, "0")
	if frac == "" {
		i, err := strconv.ParseInt(whole, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("number %s is out of the range of a Cedar Long", s)
		}
		return cedar.Long(i), nil
	}
	d, err := types.ParseDecimal(whole + "." + frac)
	if err != nil {
		return nil, fmt.Errorf("number %s has no exact Cedar decimal (at most four decimal places): %w", s, err)
	}
	return d, nil
}
