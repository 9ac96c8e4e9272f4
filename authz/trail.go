package authz

import (
	"encoding/json"
	"time"

	"github.com/fcd-authz/fcd/authz/policy"
	"github.com/fcd-authz/fcd/record"
)

// Event kinds of the trail.
const (
	EventManifest  = "manifest"
	EventSnapshot  = "snapshot"
	EventFormation = "formation"
	EventApproval  = "approval"
	EventAdmission = "admission"
	// EventReadmission: a dispatch token issued again for an open lease.
	EventReadmission = "readmission"
	EventClaim       = "claim"
	EventOutcome     = "outcome"
	EventResolution  = "resolution"
	EventGeneration  = "generation"
	EventDrain       = "drain"
	EventRetire      = "retire"
	// EventCertificate and EventRevocation: a compatibility certificate
	// registered, revoked.
	EventCertificate = "certificate"
	EventRevocation  = "revocation"
	// EventPolicy and EventPolicyRefused: a policy set loaded (put in
	// force on this replica), or refused (the one in force stays).
	EventPolicy        = policy.EventLoaded
	EventPolicyRefused = policy.EventRefused
)

// formationEvent is a formation and its decision. Its arguments are their
// digest, and the arguments themselves only as configured.
type formationEvent struct {
	ID               string `json:"id"`
	Session          string `json:"session"`
	Principal        string `json:"principal"`
	Host             string `json:"host,omitempty"`
	Tool             string `json:"tool"`
	Snapshot         string `json:"snapshot"`
	DescriptorDigest string `json:"descriptorDigest"`
	ArgumentDigest   string `json:"argumentDigest"`
	// Arguments are kept only as Config.TrailArguments says (none by
	// default), their sensitive members masked.
	Arguments json.RawMessage   `json:"arguments,omitempty"`
	Source    record.Target     `json:"source"`
	Successor *record.Successor `json:"successor"`
	Recovery  *record.Recovery  `json:"recovery,omitempty"`
	Digest    string            `json:"digest"`
	Status    record.Status     `json:"status"`
	Approvals int               `json:"approvalsRequired"`
	Decision  record.Decision   `json:"decision"`
}

func newFormationEvent(rec *record.Formation) formationEvent {
	return formationEvent{
		ID: rec.ID, Session: rec.Session, Principal: rec.Principal.ID, Host: rec.Principal.Host, Tool: rec.Tool,
		Snapshot: rec.Snapshot, DescriptorDigest: rec.DescriptorDigest, ArgumentDigest: rec.ArgumentDigest,
		Source: rec.Source, Successor: rec.Successor, Recovery: rec.Recovery, Digest: rec.Digest, Status: rec.Status,
		Approvals: rec.ApprovalsRequired, Decision: rec.Decision,
	}
}

type approvalEvent struct {
	Formation string                  `json:"formation"`
	Approver  string                  `json:"approver"`
	Decision  record.ApprovalDecision `json:"decision"`
	Digest    string                  `json:"digest"`
	Reason    string                  `json:"reason,omitempty"`
	Status    record.Status           `json:"status"`
}

// admissionEvent is an admission; the token is never in it, its id (the
// lease) and expiry are.
type admissionEvent struct {
	Formation  string        `json:"formation"`
	Lease      string        `json:"lease"`
	Session    string        `json:"session"`
	Tool       string        `json:"tool"`
	Target     record.Target `json:"target"`
	Generation int64         `json:"generation"`
	Successor  bool          `json:"successor"`
	// Certificate is the certificate a successor admission relied on.
	Certificate string `json:"certificate,omitempty"`
	// Requires and Exclusive are the session dependencies the admission
	// checked ("server/tool" names).
	Requires  []string `json:"requires,omitempty"`
	Exclusive []string `json:"exclusiveWith,omitempty"`
	// AdmittedAt is when the admission was made (the store's clock).
	AdmittedAt time.Time `json:"admittedAt"`
}

type claimEvent struct {
	Lease string `json:"lease"`
	Claim string `json:"claim"`
	Epoch string `json:"epoch"`
	// Admission is the admission's revision (the token's fcd_revision).
	Admission int64 `json:"admission"`
}

type outcomeEvent struct {
	Lease     string         `json:"lease"`
	Formation string         `json:"formation,omitempty"`
	Outcome   record.Outcome `json:"outcome"`
	Claim     string         `json:"claim,omitempty"`
	// By is "backend" (under a claim), "release" (no claim: nothing ran),
	// "sweep" (never reported: marked uncertain), "operator" (a
	// resolution) or "generation" (a newer pool generation).
	By string `json:"by"`
	// Operator is the credential id of the operator who resolved.
	Operator string `json:"operator,omitempty"`
	Reason   string `json:"reason,omitempty"`
	// Generation is the pool generation that released the lease.
	Generation int64 `json:"generation,omitempty"`
	// Signed is the operator's signed resolution a resolution closed the
	// lease with, when it was signed.
	Signed *signedResolutionEvent `json:"signed,omitempty"`
}

// signedResolutionEvent is what the trail keeps of a signed resolution:
// who signed it (the operator key's kid, the person the document names),
// its digest (the canonical payload's) and the document itself, which
// holds no secret and verifies again against the operator keys.
type signedResolutionEvent struct {
	KeyID    string    `json:"kid"`
	Operator string    `json:"operator"`
	Digest   string    `json:"digest"`
	IssuedAt time.Time `json:"issuedAt"`
	JWS      string    `json:"jws"`
}
