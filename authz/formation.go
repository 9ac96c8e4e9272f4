package authz

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fcd-authz/fcd/authz/policy"
	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/internal/bounded"
	"github.com/fcd-authz/fcd/internal/public"
	"github.com/fcd-authz/fcd/internal/tracing"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.opentelemetry.io/otel/attribute"
)

// Errors of formations and approvals.
var (
	// ErrBadReference: a formation names a snapshot or tool that does not
	// exist; the request cannot be processed as given.
	ErrBadReference = public.New("authz", "formation references an unknown snapshot or tool")
	// ErrBadRequest: a request field is missing or malformed.
	ErrBadRequest = public.New("authz", "invalid request")
	// ErrDigestMismatch: the approver approved another record than this one.
	ErrDigestMismatch = public.New("authz", "digest does not match the formation")
	// ErrNotPending: the formation is not waiting for approval.
	ErrNotPending = public.New("authz", "formation is not pending approval")
	// ErrExpired: the formation expired before it was approved or admitted.
	ErrExpired = public.New("authz", "formation expired")
	// ErrSelfApproval: the principal who formed a call cannot approve it.
	ErrSelfApproval = public.New("authz", "the principal who formed the call cannot approve it")
	// ErrDuplicateApprover: this approver already decided on the formation.
	ErrDuplicateApprover = public.New("authz", "approver already decided on this formation")
)

// Decider decides a formation by policy. Implementations never fail: an
// evaluation error is a deny recorded in the decision.
type Decider interface {
	Decide(ctx context.Context, in *policy.Input) record.Decision
	// Digest names the policy set Decide would use now (the decision's
	// PolicyDigest); an admission evaluates a formation again when it
	// differs from the one that decided it. "" means unknown: always
	// evaluate again.
	Digest() string
}

// CallerBinding is how a gateway's admission is bound to its caller.
type CallerBinding string

// Caller bindings.
const (
	// CallerPrincipal: a call is admitted through a gateway only for the
	// caller the gateway authenticated (GateRequest.Caller, from its
	// mTLS, JWT or basic authentication), and only if that caller is the
	// formation's principal (SameIdentity). Knowing a formation id is not
	// enough to run it.
	CallerPrincipal CallerBinding = "principal"
	// CallerOff: any caller that reaches the gateway may have a formation
	// admitted by its id (fcd before the binding).
	CallerOff CallerBinding = "off"
)

// Formations is the use case of hosts and approvers: record a formed call
// against the snapshot the model saw, decide it by policy once, and bind
// human approvals to its digest.
type Formations struct {
	store      *lease.Store
	decider    Decider
	successors *successors
	schemas    *schemaCache
	inputs     *policy.InputCache
	ready      *readyCache
	metrics    *metrics
	decisions  DecisionLogger
	ttl        time.Duration
	// keep is how long a formation's record is stored from its creation:
	// see formationKeep.
	keep time.Duration
	now  func() time.Time
	log  *slog.Logger
}

// FormRequest is a formed call as a host reports it.
type FormRequest struct {
	Snapshot  string
	Session   string
	Tool      string // "server/tool"
	Arguments json.RawMessage
	// PrincipalID and Attributes describe who the call is for, as vouched
	// by the host; an empty PrincipalID means the host itself.
	PrincipalID string
	Attributes  map[string]any
	// Host is the authenticated host credential id.
	Host string
}

const maxIDLength = 256

// jsonSpace is the whitespace RFC 8259 allows around a JSON value; only it
// is trimmed from JSON input, as fencecheck does at the backend
// (bytes.TrimSpace would also drop \v, \f and Unicode spaces and so read
// bytes that are not JSON).
const jsonSpace = " \t\n\r"

func (r *FormRequest) validate() error {
	var errs []string
	check := func(name, v string) {
		if v == "" || len(v) > maxIDLength || strings.ContainsAny(v, "\x00\n\r") {
			errs = append(errs, fmt.Sprintf("%s must be 1-%d characters without control characters", name, maxIDLength))
		}
	}
	check("snapshot", r.Snapshot)
	check("session", r.Session)
	check("tool", r.Tool)
	check("host", r.Host)
	if r.PrincipalID != "" {
		check("principal.id", r.PrincipalID)
	}
	if server, tool, ok := strings.Cut(r.Tool, "/"); !ok || server == "" || tool == "" {
		errs = append(errs, `tool must be "server/tool"`)
	}
	if a := bytes.Trim(r.Arguments, jsonSpace); len(a) > 0 && a[0] != '{' && !bytes.Equal(a, []byte("null")) {
		errs = append(errs, "arguments must be a JSON object")
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %s", ErrBadRequest, strings.Join(errs, "; "))
	}
	return nil
}

// Form records a formed call and decides it. A call the policy denies is
// stored too (status denied, kept for audit) and returned without error;
// the caller tells the outcome from Status.
func (f *Formations) Form(ctx context.Context, req FormRequest) (*record.Formation, error) {
	ctx, span := tracing.Start(ctx, tracerScope, "authz.form", attribute.String("fcd.tool", req.Tool))
	rec, err := f.form(ctx, req, nil)
	if rec != nil {
		span.SetAttributes(attribute.String("fcd.formation", rec.ID), attribute.String("fcd.status", string(rec.Status)))
	}
	tracing.End(span, err)
	return rec, err
}

// form is Form, of a recovery when recovery is set.
func (f *Formations) form(ctx context.Context, req FormRequest, recovery *record.Recovery) (*record.Formation, error) {
	if err := req.validate(); err != nil {
		return nil, err
	}
	tool, epoch, err := f.store.ResolveTool(ctx, req.Snapshot, req.Tool)
	if err != nil {
		if errors.Is(err, record.ErrSnapshotNotFound) || errors.Is(err, record.ErrToolNotFound) {
			return nil, fmt.Errorf("%w: %w", ErrBadReference, err)
		}
		return nil, fmt.Errorf("authz: form: %w", err)
	}
	args := bytes.Trim(req.Arguments, jsonSpace)
	if len(args) == 0 || bytes.Equal(args, []byte("null")) {
		args = []byte("{}")
	}
	schema, err := f.schemas.get(tool.DescriptorDigest, tool.Descriptor.InputSchema)
	if err != nil {
		return nil, fmt.Errorf("authz: form: %w", err)
	}
	if err := manifest.ValidateArguments(schema, args); err != nil {
		if errors.Is(err, manifest.ErrMalformed) {
			return nil, fmt.Errorf("%w: arguments: %v", ErrBadRequest, err)
		}
		return nil, fmt.Errorf("authz: form: %w", err)
	}
	// The digest comes first, over the arguments as received: it refuses
	// what canonical JSON could not carry exactly (a number beyond a
	// double's precision, trailing data), so the stored canonical form
	// below is the same call.
	argDigest, err := fencecheck.ArgumentDigest(req.Tool, args)
	if err != nil {
		return nil, fmt.Errorf("%w: arguments: %v", ErrBadRequest, err)
	}
	canonArgs, err := manifest.CanonicalJSON(args)
	if err != nil {
		return nil, fmt.Errorf("%w: arguments: %v", ErrBadRequest, err)
	}
	history, err := f.store.SessionHistory(ctx, req.Session)
	if err != nil {
		return nil, fmt.Errorf("authz: form: %w", err)
	}
	now := f.now().UTC()
	cand, err := f.successors.candidate(ctx, epoch, tool.Descriptor.Name, canonArgs, now)
	if err != nil {
		return nil, fmt.Errorf("authz: form: %w", err)
	}
	id, err := lease.NewFormationID()
	if err != nil {
		return nil, err
	}
	principal := record.Principal{ID: req.PrincipalID, Attributes: req.Attributes, Host: req.Host}
	if principal.ID == "" {
		principal.ID = req.Host
	}
	d := tool.Descriptor
	rec := &record.Formation{Call: record.Call{
		ID: id, Session: req.Session, Principal: principal, Snapshot: req.Snapshot, Tool: req.Tool,
		DescriptorDigest: tool.DescriptorDigest, Arguments: canonArgs, ArgumentDigest: argDigest,
		Source: epoch.Target(),
		Metadata: record.Metadata{
			Summary: d.Summary, SideEffects: d.SideEffects, RequiresApproval: d.RequiresApproval,
			FailureModes: d.FailureModes, Dependencies: d.Dependencies,
		},
		CreatedAt: now, ExpiresAt: now.Add(f.ttl), Recovery: recovery,
	}, Approvals: []record.Approval{}}
	in := &policy.Input{
		Phase:   policy.PhaseFormation,
		Tool:    f.inputs.Tool(tool.DescriptorDigest, epoch.Server, d),
		Epoch:   f.inputs.Epoch(epoch),
		Session: *history,
	}
	if err := f.decide(ctx, rec, in, cand); err != nil {
		return nil, err
	}
	rec.ApprovalsRequired = requiredApprovals(rec)
	switch {
	case !rec.Decision.Allowed():
		rec.Status = record.StatusDenied
	case rec.ApprovalsRequired > 0:
		rec.Status = record.StatusPendingApproval
	default:
		rec.Status = record.StatusReady
	}
	logDecision(ctx, f.decisions, in, rec.Decision, rec)
	rec.UpdatedAt = now
	rev, err := f.store.CreateFormation(ctx, rec, f.keep)
	if err != nil {
		if errors.Is(err, record.ErrRecoveryExists) {
			return nil, fmt.Errorf("authz: recover: %w", err)
		}
		return nil, fmt.Errorf("authz: form: %w", err)
	}
	f.ready.put(rec, rev)
	var successor string
	if rec.Successor != nil {
		successor = rec.Successor.Epoch
	}
	f.metrics.formations.WithLabelValues(string(rec.Status), fmt.Sprint(rec.Successor != nil)).Inc()
	f.log.Info("formation", "id", rec.ID, "tool", rec.Tool, "session", rec.Session, "status", rec.Status,
		"approvals", rec.ApprovalsRequired, "policy", rec.Decision.PolicyDigest, "successor", successor)
	return rec, nil
}

// requiredApprovals is the number of distinct approvers a formation needs:
// the larger of the policy's obligation and one for requiresApproval —
// and, whatever the policy or the descriptor says, at least one for a
// write or delete. This is the code-level MCP+ invariant.
func requiredApprovals(f *record.Formation) int {
	n := f.Decision.Approvals
	if (f.Metadata.RequiresApproval || f.Metadata.SideEffects.Mutating() || promptsUser(f)) && n < 1 {
		n = 1
	}
	return n
}

// promptsUser: f recovers a call whose failure mode says to ask the user,
// so it runs only once a person approved it.
func promptsUser(f *record.Formation) bool {
	r := f.Recovery
	return r != nil && r.FailureMode != nil && r.FailureMode.Recovery == manifest.RecoveryPromptUser
}

// approvedBy counts the distinct approvers that approved f.
func approvedBy(f *record.Formation) int {
	seen := map[string]bool{}
	for _, a := range f.Approvals {
		if a.Decision == record.Approve && a.Digest == f.Digest {
			seen[NormalizeIdentity(a.Approver)] = true
		}
	}
	return len(seen)
}

// ready reports whether f may be admitted as far as approvals go: allowed
// by policy and approved by enough distinct approvers, never fewer than
// one for a write or delete.
func ready(f *record.Formation) bool {
	return f.Decision.Allowed() && approvedBy(f) >= requiredApprovals(f)
}

// view returns f as callers should see it now: a formation past its
// expiry that was not admitted is expired.
func (f *Formations) view(rec *record.Formation) *record.Formation {
	if rec.Status.Expires() && !f.now().Before(rec.ExpiresAt) {
		rec.Status = record.StatusExpired
	}
	return rec
}

// Get returns one formation.
func (f *Formations) Get(ctx context.Context, id string) (*record.Formation, error) {
	rec, err := f.store.GetFormation(ctx, id)
	if err != nil {
		return nil, err
	}
	return f.view(rec), nil
}

// Page bounds of Formations.List.
const (
	// DefaultListLimit is how many formations a page holds when the
	// request says nothing.
	DefaultListLimit = 100
	// MaxListLimit is the most formations one page may hold: one page's
	// records are held in memory and encoded at once.
	MaxListLimit = 1000
)

// ErrBadPage: a listing's page parameters (limit, after) are out of range.
var ErrBadPage = public.New("authz", "invalid page parameter")

// ListRequest asks for one page of formations.
type ListRequest struct {
	// Status keeps only formations in this status as callers see it (an
	// unadmitted formation past its expiry is expired); empty keeps all.
	Status record.Status
	// After is the formation id the page starts after, in id order; empty
	// starts at the first. It need not be a stored id.
	After string
	// Limit is the most formations the page holds: 1 to MaxListLimit, 0
	// meaning DefaultListLimit.
	Limit int
}

// FormationPage is one page of formations, in id order.
type FormationPage struct {
	Formations []*record.Formation `json:"formations"`
	// Next is the After of the next page, empty when no formation
	// follows. A page may hold fewer than Limit formations, none even,
	// and still have a Next: a filtered page stops after reading a bounded
	// number of records, so one request never reads the whole store.
	Next string `json:"next,omitempty"`
}

// List returns one page of the formations in req.Status, in id order.
// Formation ids are random, so the order says nothing about age; it is
// the store's key order, in which a page is read without what precedes it.
func (f *Formations) List(ctx context.Context, req ListRequest) (*FormationPage, error) {
	if req.Status != "" && !req.Status.Valid() {
		return nil, fmt.Errorf("%w: unknown status %q", ErrBadRequest, req.Status)
	}
	switch {
	case req.Limit == 0:
		req.Limit = DefaultListLimit
	case req.Limit < 0 || req.Limit > MaxListLimit:
		return nil, fmt.Errorf("%w: limit must be 1 to %d, not %d", ErrBadPage, MaxListLimit, req.Limit)
	}
	if len(req.After) > maxIDLength || strings.ContainsAny(req.After, "\x00\n\r") {
		return nil, fmt.Errorf("%w: after is a formation id, at most %d characters without control characters", ErrBadPage, maxIDLength)
	}
	keep := func(rec *record.Formation) bool {
		rec = f.view(rec)
		return req.Status == "" || rec.Status == req.Status
	}
	page := lease.FormationPage{After: req.After, Limit: req.Limit}
	var recs []*record.Formation
	var next string
	var err error
	if req.Status == record.StatusPendingApproval {
		// An index, not a scan. It holds what waits past its expiry
		// too, which keep leaves out.
		recs, next, err = f.store.PendingApproval(ctx, page)
		recs = slices.DeleteFunc(recs, func(rec *record.Formation) bool { return !keep(rec) })
	} else {
		recs, next, err = f.store.ListFormations(ctx, page, keep)
	}
	if err != nil {
		return nil, err
	}
	if recs == nil {
		recs = []*record.Formation{}
	}
	return &FormationPage{Formations: recs, Next: next}, nil
}

// ApprovalRequest is an approver's decision on a formation.
type ApprovalRequest struct {
	// Approver is the authenticated approver credential id.
	Approver string
	Decision record.ApprovalDecision
	// Digest is the formation digest the approver saw.
	Digest string
	Reason string
}

// Approve records an approver's decision. The digest must equal the
// formation's; approvers must be distinct and may not be the principal who
// formed the call; one deny ends the formation as denied; an expired
// formation cannot be approved. Concurrent decisions are ordered by etcd
// and none is lost.
func (f *Formations) Approve(ctx context.Context, id string, req ApprovalRequest) (*record.Formation, error) {
	if req.Decision != record.Approve && req.Decision != record.Deny {
		return nil, fmt.Errorf("%w: decision must be approve or deny", ErrBadRequest)
	}
	if req.Approver == "" || req.Digest == "" || len(req.Reason) > 4096 {
		return nil, fmt.Errorf("%w: approver and digest are required, reason at most 4096 bytes", ErrBadRequest)
	}
	var expired bool
	rec, rev, err := f.store.UpdateFormation(ctx, id, func(rec *record.Formation) error {
		now := f.now().UTC()
		expired = false
		if rec.Status.Expires() && !now.Before(rec.ExpiresAt) {
			// Persist what the clock already decided, then refuse.
			rec.Status, rec.UpdatedAt, expired = record.StatusExpired, now, true
			return nil
		}
		switch {
		case rec.Status == record.StatusExpired:
			return ErrExpired
		case rec.Status != record.StatusPendingApproval:
			return fmt.Errorf("%w: status is %s", ErrNotPending, rec.Status)
		case req.Digest != rec.Digest:
			return ErrDigestMismatch
		case SameIdentity(req.Approver, rec.Principal.ID):
			return ErrSelfApproval
		}
		for _, a := range rec.Approvals {
			if SameIdentity(a.Approver, req.Approver) {
				return ErrDuplicateApprover
			}
		}
		rec.Approvals = append(rec.Approvals, record.Approval{
			Approver: req.Approver, Decision: req.Decision, Digest: req.Digest, Reason: req.Reason, At: now,
		})
		switch {
		case req.Decision == record.Deny:
			rec.Status = record.StatusDenied
		case ready(rec):
			rec.Status = record.StatusReady
		}
		rec.UpdatedAt = now
		return nil
	})
	if err != nil {
		return rec, fmt.Errorf("authz: approve %s: %w", id, err)
	}
	if expired {
		return rec, fmt.Errorf("authz: approve %s: %w", id, ErrExpired)
	}
	f.ready.put(rec, rev)
	f.metrics.approvals.WithLabelValues(string(req.Decision)).Inc()
	f.log.Info("approval", "formation", id, "approver", req.Approver, "decision", req.Decision, "status", rec.Status)
	return rec, nil
}

// readyCache remembers formations this replica made or saw become ready,
// with the etcd revision they were written at, so that the common
// admission is one etcd transaction and nothing else. It is only ever
// trusted for "ready": the admission transaction compares the formation's
// revision, so a stale entry (approved, admitted or expired elsewhere)
// costs one failed compare and a fresh read, never a wrong answer; any
// other status is read from etcd.
type readyCache struct {
	entries bounded.Cache[string, readyEntry]
}

type readyEntry struct {
	rec *record.Formation
	rev int64
}

const maxReadyCache = 1 << 16

func (c *readyCache) put(rec *record.Formation, rev int64) {
	if rec.Status != record.StatusReady {
		c.entries.Delete(rec.ID)
		return
	}
	c.entries.Put(rec.ID, readyEntry{rec: rec, rev: rev})
}

// take returns a copy of a cached ready formation and its revision.
func (c *readyCache) take(id string) (*record.Formation, int64, bool) {
	e, ok := c.entries.Get(id)
	if !ok {
		return nil, 0, false
	}
	cp := *e.rec // admission sets top-level fields only
	return &cp, e.rev, true
}

func (c *readyCache) drop(id string) { c.entries.Delete(id) }

// schemaCache holds compiled input schemas by descriptor digest. A
// descriptor never changes under its digest, so entries never go stale;
// the set is bounded by the registered descriptors.
type schemaCache struct {
	mu sync.RWMutex
	m  map[string]*jsonschema.Schema
}

func (c *schemaCache) get(digest string, raw json.RawMessage) (*jsonschema.Schema, error) {
	c.mu.RLock()
	s, ok := c.m[digest]
	c.mu.RUnlock()
	if ok {
		return s, nil
	}
	s, err := manifest.CompileSchema(raw)
	if err != nil {
		return nil, fmt.Errorf("input schema of %s: %w", digest, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]*jsonschema.Schema{}
	}
	c.m[digest] = s
	return s, nil
}
