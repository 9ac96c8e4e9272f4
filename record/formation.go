package record

import (
	"encoding/json"
	"slices"
	"time"

	"github.com/fcd-authz/fcd/manifest"
)

// Status is a formation's place in its lifecycle:
// pending_approval → ready → admitted → completed | failed | rejected |
// uncertain, or denied, or expired.
type Status string

// Formation statuses.
const (
	StatusPendingApproval Status = "pending_approval"
	StatusReady           Status = "ready"
	StatusAdmitted        Status = "admitted"
	StatusCompleted       Status = "completed"
	StatusFailed          Status = "failed"
	StatusRejected        Status = "rejected"
	StatusUncertain       Status = "uncertain"
	StatusDenied          Status = "denied"
	StatusExpired         Status = "expired"
)

// Valid reports whether s is a formation status.
func (s Status) Valid() bool {
	switch s {
	case StatusPendingApproval, StatusReady, StatusAdmitted, StatusCompleted, StatusFailed, StatusRejected,
		StatusUncertain, StatusDenied, StatusExpired:
		return true
	}
	return false
}

// Expires reports whether a formation in this status lapses at its
// ExpiresAt: only calls not yet admitted do.
func (s Status) Expires() bool { return s == StatusPendingApproval || s == StatusReady }

// Principal is who a call is formed for: an id and attributes vouched for
// by the authenticated host credential named in Host.
type Principal struct {
	ID         string         `json:"id"`
	Attributes map[string]any `json:"attributes,omitempty"`
	// Host is the id of the host credential that formed the call.
	Host string `json:"host"`
}

// Target is where a call may run: an epoch and what identifies it.
type Target struct {
	Epoch        string            `json:"epoch"`
	Server       string            `json:"server"`
	Release      string            `json:"release"`
	Pool         string            `json:"pool"`
	Artifact     manifest.Artifact `json:"artifact"`
	ConfigDigest string            `json:"configDigest"`
}

// Equal reports whether t and o are the same target.
func (t Target) Equal(o Target) bool { return t == o }

// Metadata is the MCP+ metadata of the formed tool, copied into the record
// so that the record alone tells what was decided over.
type Metadata struct {
	Summary          string                 `json:"summary,omitempty"`
	SideEffects      manifest.SideEffect    `json:"sideEffects"`
	RequiresApproval bool                   `json:"requiresApproval"`
	FailureModes     []manifest.FailureMode `json:"failureModes,omitempty"`
	Dependencies     *manifest.Dependencies `json:"dependencies,omitempty"`
}

// Equal reports whether m and o are the same metadata, member by member
// (a nil and an empty list, which convert alike, are equal).
func (m Metadata) Equal(o Metadata) bool {
	if m.Summary != o.Summary || m.SideEffects != o.SideEffects || m.RequiresApproval != o.RequiresApproval ||
		!slices.Equal(m.FailureModes, o.FailureModes) || (m.Dependencies == nil) != (o.Dependencies == nil) {
		return false
	}
	d, e := m.Dependencies, o.Dependencies
	return d == nil || slices.Equal(d.Requires, e.Requires) && slices.Equal(d.ProducesInputFor, e.ProducesInputFor) &&
		slices.Equal(d.ExclusiveWith, e.ExclusiveWith)
}

// Call is the immutable part of a formation record: exactly what the model
// formed, against which snapshot and target. Its digest is what an
// approver approves.
type Call struct {
	ID               string          `json:"id"`
	Session          string          `json:"session"`
	Principal        Principal       `json:"principal"`
	Snapshot         string          `json:"snapshot"`
	Tool             string          `json:"tool"`
	DescriptorDigest string          `json:"descriptorDigest"`
	Arguments        json.RawMessage `json:"arguments"`
	ArgumentDigest   string          `json:"argumentDigest"`
	Source           Target          `json:"source"`
	// Successor is the one target captured at formation, or nil. It is
	// part of the digest: an approver approves the successor too.
	Successor *Successor `json:"successor"`
	Metadata  Metadata   `json:"metadata"`
	CreatedAt time.Time  `json:"createdAt"`
	ExpiresAt time.Time  `json:"expiresAt"`
	// Recovery links a recovery to the call it recovers; nil for a first
	// call. Part of the digest: an approver approves a recovery as one.
	Recovery *Recovery `json:"recovery,omitempty"`
}

// Recovery is what a recovery formation recovers from.
type Recovery struct {
	// Of is the formation recovered (the previous attempt); Root is the
	// first formation of the chain, which every attempt's token carries so
	// a backend can deduplicate across attempts.
	Of   string `json:"of"`
	Root string `json:"root"`
	// Attempt numbers the calls of the chain: the first call is 1, its
	// first recovery 2.
	Attempt int `json:"attempt"`
	// Outcome is how the recovered call's lease ended: rejected, failed,
	// no_effect (uncertain, resolved) or released (uncertain, released by
	// a newer pool generation).
	Outcome Outcome `json:"outcome"`
	// FailureMode is the declared failure mode the backend's answer
	// matched, nil when none matched (or nothing ran).
	FailureMode *manifest.FailureMode `json:"failureMode"`
}

// Failure is what a backend answered when a call failed or was refused,
// as the fence reported it with the outcome: a JSON-RPC error's code, or
// for a tool error (a result with isError) none; the error name the
// answer states (the error's data.error, or the result's
// structuredContent.error); and its message (the error's message, or the
// result's first text), cut short. Recovery matches it against the
// tool's declared failure modes.
type Failure struct {
	Code    int64  `json:"code,omitempty"`
	Error   string `json:"error,omitempty"`
	Message string `json:"message,omitempty"`
}

// Successor is the one target a call may run on once its source epoch is
// STALE, captured at formation from the compatibility certificate that
// covers the call's arguments. It names the certificate, so admission can
// check that it is still unrevoked and unexpired, and carries what the
// certificate models, so the record shows an approver what the call would
// do there.
type Successor struct {
	Target
	// Certificate is the id of the certificate that covers the call.
	Certificate string `json:"certificate"`
	// Issuer is the kid of the key that signed the certificate.
	Issuer string `json:"issuer"`
	// Effects are the certificate's modeled effects of the target for
	// calls inside its envelope.
	Effects map[string]any `json:"effects"`
	// Profile names what produced the certificate.
	Profile manifest.ProfileRef `json:"profile"`
	// ExpiresAt is the certificate's expiry; after it the successor is
	// gone.
	ExpiresAt time.Time `json:"expiresAt"`
}

// Digest returns the digest of the call: canonical JSON of every field.
func (c *Call) Digest() (string, error) { return manifest.Digest(c) }

// Verdict is one engine's or the combined answer.
type Verdict string

// Verdicts.
const (
	VerdictAllow Verdict = "allow"
	VerdictDeny  Verdict = "deny"
)

// EngineDecision is what one policy engine decided and why.
type EngineDecision struct {
	// Engine is "rego" or "cedar".
	Engine  string  `json:"engine"`
	Verdict Verdict `json:"verdict"`
	// Approvals is the number of distinct approvers this engine requires.
	Approvals int `json:"approvals"`
	// Rules are the deciding Rego rule names or Cedar policy ids.
	Rules []string `json:"rules"`
	// Reasons are human-readable reasons, in rule order.
	Reasons []string `json:"reasons"`
	// Error is set when evaluation failed; the verdict is then deny.
	Error string `json:"error,omitempty"`
	// Successor is this engine's answer on the candidate successor; nil
	// when the call had none.
	Successor *SuccessorVerdict `json:"successor,omitempty"`
}

// SuccessorVerdict is one engine's answer on a candidate successor: allow
// unless a rule refused it (Rego deny_successor, a Cedar forbid on
// Action::"substitute") or evaluation failed.
type SuccessorVerdict struct {
	Verdict Verdict  `json:"verdict"`
	Rules   []string `json:"rules"`
	Reasons []string `json:"reasons"`
	Error   string   `json:"error,omitempty"`
}

// SuccessorDecision is the combined answer on the candidate successor a
// formation was decided with: deny if any engine refused it. A refused
// candidate is not captured; the decision keeps which one it was.
type SuccessorDecision struct {
	Certificate string  `json:"certificate"`
	Epoch       string  `json:"epoch"`
	Verdict     Verdict `json:"verdict"`
}

// Decision is the combined policy decision of a formation: deny-overrides
// over the engines; any engine error denies.
type Decision struct {
	Verdict Verdict `json:"verdict"`
	// Approvals is the largest approval obligation of the engines (before
	// MCP+ requiresApproval and the code-level minimum are applied).
	Approvals int `json:"approvals"`
	// PolicyDigest identifies the policy set in force.
	PolicyDigest string `json:"policyDigest"`
	// PolicyRevision is the revision of the bundle the policy set came
	// from (its .manifest's), empty for a directory. It is not stored or
	// answered with the record (the trail's policy event names it beside
	// the digest); decision logs write it as bundles.fcd.revision.
	PolicyRevision string           `json:"-"`
	Engines        []EngineDecision `json:"engines"`
	// Successor is the answer on the candidate successor; nil when there
	// was no candidate.
	Successor *SuccessorDecision `json:"successor,omitempty"`
	DecidedAt time.Time          `json:"decidedAt"`
}

// Allowed reports whether the decision allows the call.
func (d *Decision) Allowed() bool { return d != nil && d.Verdict == VerdictAllow }

// ApprovalDecision is an approver's answer.
type ApprovalDecision string

// Approval decisions.
const (
	Approve ApprovalDecision = "approve"
	Deny    ApprovalDecision = "deny"
)

// Approval is one human decision bound to the formation digest the
// approver saw.
type Approval struct {
	Approver string           `json:"approver"`
	Decision ApprovalDecision `json:"decision"`
	Digest   string           `json:"digest"`
	Reason   string           `json:"reason,omitempty"`
	At       time.Time        `json:"at"`
}

// Formation is a formation record: the immutable call, its digest, the
// policy decision, and its mutable lifecycle.
type Formation struct {
	Call
	Digest   string   `json:"digest"`
	Decision Decision `json:"decision"`
	Status   Status   `json:"status"`
	// ApprovalsRequired is the number of distinct approvers needed.
	ApprovalsRequired int        `json:"approvalsRequired"`
	Approvals         []Approval `json:"approvals"`
	// Lease is the lease id once admitted.
	Lease string `json:"lease,omitempty"`
	// Outcome is how the lease ended (or that it is uncertain), and
	// Failure what the backend answered when it failed or refused.
	Outcome   Outcome   `json:"outcome,omitempty"`
	Failure   *Failure  `json:"failure,omitempty"`
	UpdatedAt time.Time `json:"updatedAt"`
}

// SessionHistory is what a session has done: the tools ("server/tool")
// whose effect completed, and those admitted and not yet completed.
type SessionHistory struct {
	Session   string   `json:"session"`
	Completed []string `json:"completed"`
	Admitted  []string `json:"admitted"`
}
