package authz

import (
	"encoding/json"
	"time"

	"github.com/fcd-authz/fcd/authz/policy"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
)

// TrailSchema is the version of the trail events' data this package
// writes: each event's kind and data are as docs/audit.md describes them
// for this version, and the trail keeps the version with every event
// (audit.Entry.Schema). The data types below are the trail's own, not
// record's: a record field renamed or added changes no trail event until
// its converter here maps it, and a change of an event's members is a new
// version. Events written before the version was kept have none; their
// data is version 1's.
const TrailSchema = 1

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

// manifestEvent is a registration: the epoch a signed manifest created.
type manifestEvent struct {
	Epoch   string `json:"epoch"`
	Server  string `json:"server"`
	Release string `json:"release"`
	Pool    string `json:"pool"`
	Signer  string `json:"signer"`
}

func newManifestEvent(ep *record.Epoch) manifestEvent {
	return manifestEvent{Epoch: ep.ID, Server: ep.Server, Release: ep.Release, Pool: ep.Pool, Signer: ep.SignerKeyID}
}

// epochEvent is a drain or a retirement: the state the epoch went to, and
// who changed it.
type epochEvent struct {
	Epoch string `json:"epoch"`
	State string `json:"state"`
	By    string `json:"by"`
}

// snapshotEvent is a new snapshot and the servers its tools are of.
type snapshotEvent struct {
	Snapshot string   `json:"snapshot"`
	Servers  []string `json:"servers"`
}

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
	Arguments json.RawMessage `json:"arguments,omitempty"`
	Source    trailTarget     `json:"source"`
	Successor *trailSuccessor `json:"successor"`
	Recovery  *trailRecovery  `json:"recovery,omitempty"`
	Digest    string          `json:"digest"`
	Status    string          `json:"status"`
	Approvals int             `json:"approvalsRequired"`
	Decision  trailDecision   `json:"decision"`
}

func newFormationEvent(rec *record.Formation) formationEvent {
	return formationEvent{
		ID: rec.ID, Session: rec.Session, Principal: rec.Principal.ID, Host: rec.Principal.Host, Tool: rec.Tool,
		Snapshot: rec.Snapshot, DescriptorDigest: rec.DescriptorDigest, ArgumentDigest: rec.ArgumentDigest,
		Source: newTrailTarget(rec.Source), Successor: newTrailSuccessor(rec.Successor), Recovery: newTrailRecovery(rec.Recovery),
		Digest: rec.Digest, Status: string(rec.Status), Approvals: rec.ApprovalsRequired, Decision: newTrailDecision(rec.Decision),
	}
}

// trailTarget is where a call may run (record.Target).
type trailTarget struct {
	Epoch        string        `json:"epoch"`
	Server       string        `json:"server"`
	Release      string        `json:"release"`
	Pool         string        `json:"pool"`
	Artifact     trailArtifact `json:"artifact"`
	ConfigDigest string        `json:"configDigest"`
}

// trailArtifact is a target's code: its image, its digest, or both.
type trailArtifact struct {
	Image  string `json:"image,omitempty"`
	Digest string `json:"digest,omitempty"`
}

func newTrailTarget(t record.Target) trailTarget {
	return trailTarget{Epoch: t.Epoch, Server: t.Server, Release: t.Release, Pool: t.Pool,
		Artifact: trailArtifact{Image: t.Artifact.Image, Digest: t.Artifact.Digest}, ConfigDigest: t.ConfigDigest}
}

// trailSuccessor is the successor a formation captured (record.Successor).
type trailSuccessor struct {
	trailTarget
	Certificate string         `json:"certificate"`
	Issuer      string         `json:"issuer"`
	Effects     map[string]any `json:"effects"`
	Profile     trailProfile   `json:"profile"`
	ExpiresAt   time.Time      `json:"expiresAt"`
}

// trailProfile names a compatibility profile.
type trailProfile struct {
	ID     string `json:"id"`
	Digest string `json:"digest"`
}

func newTrailSuccessor(s *record.Successor) *trailSuccessor {
	if s == nil {
		return nil
	}
	return &trailSuccessor{trailTarget: newTrailTarget(s.Target), Certificate: s.Certificate, Issuer: s.Issuer,
		Effects: s.Effects, Profile: trailProfile{ID: s.Profile.ID, Digest: s.Profile.Digest}, ExpiresAt: s.ExpiresAt}
}

// trailRecovery is what a recovery formation recovers (record.Recovery).
type trailRecovery struct {
	Of          string            `json:"of"`
	Root        string            `json:"root"`
	Attempt     int               `json:"attempt"`
	Outcome     string            `json:"outcome"`
	FailureMode *trailFailureMode `json:"failureMode"`
}

// trailFailureMode is a declared failure mode (manifest.FailureMode).
type trailFailureMode struct {
	Error       string `json:"error"`
	Description string `json:"description,omitempty"`
	Recovery    string `json:"recovery,omitempty"`
	MaxAttempts int    `json:"maxAttempts,omitempty"`
	Fallback    string `json:"fallback,omitempty"`
}

func newTrailRecovery(r *record.Recovery) *trailRecovery {
	if r == nil {
		return nil
	}
	out := &trailRecovery{Of: r.Of, Root: r.Root, Attempt: r.Attempt, Outcome: string(r.Outcome)}
	if fm := r.FailureMode; fm != nil {
		out.FailureMode = &trailFailureMode{Error: fm.Error, Description: fm.Description, Recovery: string(fm.Recovery),
			MaxAttempts: fm.MaxAttempts, Fallback: fm.Fallback}
	}
	return out
}

// trailDecision is a formation's policy decision (record.Decision).
type trailDecision struct {
	Verdict      string                  `json:"verdict"`
	Approvals    int                     `json:"approvals"`
	PolicyDigest string                  `json:"policyDigest"`
	Engines      []trailEngineDecision   `json:"engines"`
	Successor    *trailSuccessorDecision `json:"successor,omitempty"`
	DecidedAt    time.Time               `json:"decidedAt"`
}

// trailEngineDecision is one engine's answer (record.EngineDecision).
type trailEngineDecision struct {
	Engine    string                 `json:"engine"`
	Verdict   string                 `json:"verdict"`
	Approvals int                    `json:"approvals"`
	Rules     []string               `json:"rules"`
	Reasons   []string               `json:"reasons"`
	Error     string                 `json:"error,omitempty"`
	Successor *trailSuccessorVerdict `json:"successor,omitempty"`
}

// trailSuccessorVerdict is one engine's answer on the candidate successor.
type trailSuccessorVerdict struct {
	Verdict string   `json:"verdict"`
	Rules   []string `json:"rules"`
	Reasons []string `json:"reasons"`
	Error   string   `json:"error,omitempty"`
}

// trailSuccessorDecision is the combined answer on the candidate.
type trailSuccessorDecision struct {
	Certificate string `json:"certificate"`
	Epoch       string `json:"epoch"`
	Verdict     string `json:"verdict"`
}

func newTrailDecision(d record.Decision) trailDecision {
	out := trailDecision{Verdict: string(d.Verdict), Approvals: d.Approvals, PolicyDigest: d.PolicyDigest, DecidedAt: d.DecidedAt}
	if d.Engines != nil {
		out.Engines = make([]trailEngineDecision, len(d.Engines))
	}
	for i, e := range d.Engines {
		out.Engines[i] = trailEngineDecision{Engine: e.Engine, Verdict: string(e.Verdict), Approvals: e.Approvals,
			Rules: e.Rules, Reasons: e.Reasons, Error: e.Error}
		if s := e.Successor; s != nil {
			out.Engines[i].Successor = &trailSuccessorVerdict{Verdict: string(s.Verdict), Rules: s.Rules, Reasons: s.Reasons, Error: s.Error}
		}
	}
	if s := d.Successor; s != nil {
		out.Successor = &trailSuccessorDecision{Certificate: s.Certificate, Epoch: s.Epoch, Verdict: string(s.Verdict)}
	}
	return out
}

// approvalEvent is an approver's answer and the status it led to.
type approvalEvent struct {
	Formation string `json:"formation"`
	Approver  string `json:"approver"`
	Decision  string `json:"decision"`
	Digest    string `json:"digest"`
	Reason    string `json:"reason,omitempty"`
	Status    string `json:"status"`
}

func newApprovalEvent(ch lease.FormationApproved) approvalEvent {
	a := ch.Approval
	return approvalEvent{Formation: ch.Formation, Approver: a.Approver, Decision: string(a.Decision), Digest: a.Digest,
		Reason: a.Reason, Status: string(ch.Status)}
}

// admissionEvent is an admission; the token is never in it, its id (the
// lease) and expiry are.
type admissionEvent struct {
	Formation  string      `json:"formation"`
	Lease      string      `json:"lease"`
	Session    string      `json:"session"`
	Tool       string      `json:"tool"`
	Target     trailTarget `json:"target"`
	Generation int64       `json:"generation"`
	Successor  bool        `json:"successor"`
	// Certificate is the certificate a successor admission relied on.
	Certificate string `json:"certificate,omitempty"`
	// Requires and Exclusive are the session dependencies the admission
	// checked ("server/tool" names).
	Requires  []string `json:"requires,omitempty"`
	Exclusive []string `json:"exclusiveWith,omitempty"`
	// AdmittedAt is when the admission was made (the store's clock).
	AdmittedAt time.Time `json:"admittedAt"`
}

func newAdmissionEvent(ch lease.LeaseAdmitted) admissionEvent {
	l := ch.Lease
	return admissionEvent{Formation: l.Formation, Lease: l.ID, Session: l.Session, Tool: l.Tool, Target: newTrailTarget(l.Target),
		Generation: l.Generation, Successor: l.Certificate != "", Certificate: l.Certificate, Requires: ch.Requires,
		Exclusive: ch.Excludes, AdmittedAt: l.AdmittedAt}
}

// readmissionEvent is a dispatch token issued again for an open lease.
type readmissionEvent struct {
	Lease        string    `json:"lease"`
	Formation    string    `json:"formation"`
	TokenExpires time.Time `json:"tokenExpires"`
}

type claimEvent struct {
	Lease string `json:"lease"`
	Claim string `json:"claim"`
	Epoch string `json:"epoch"`
	// Admission is the admission's revision (the token's fcd_revision).
	Admission int64 `json:"admission"`
}

type outcomeEvent struct {
	Lease     string `json:"lease"`
	Formation string `json:"formation,omitempty"`
	Outcome   string `json:"outcome"`
	Claim     string `json:"claim,omitempty"`
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

// newOutcomeEvent is a close's event and its kind: a resolution when an
// operator closed the lease (its claim is not repeated), an outcome
// otherwise. The signed resolution is the caller's to add.
func newOutcomeEvent(ch lease.LeaseClosed) (string, outcomeEvent) {
	ev := outcomeEvent{Lease: ch.Lease, Formation: ch.Formation, Outcome: string(ch.Outcome), Claim: ch.Claim, By: ch.By,
		Generation: ch.Generation}
	if ch.By != "operator" {
		return EventOutcome, ev
	}
	ev.Operator, ev.Reason, ev.Claim = ch.Operator, ch.Reason, ""
	return EventResolution, ev
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

func newSignedResolutionEvent(sr *manifest.SignedResolution) *signedResolutionEvent {
	return &signedResolutionEvent{KeyID: sr.KeyID, Operator: sr.Resolution.Operator, Digest: sr.Digest,
		IssuedAt: sr.Resolution.IssuedAt, JWS: sr.JWS}
}

// generationEvent is a newer backend generation of a pool.
type generationEvent struct {
	Pool       string `json:"pool"`
	Generation int64  `json:"generation"`
	By         string `json:"by"`
}

// certificateEvent is a registered compatibility certificate.
type certificateEvent struct {
	Certificate string    `json:"certificate"`
	Source      string    `json:"source"`
	Target      string    `json:"target"`
	Tool        string    `json:"tool"`
	Signer      string    `json:"signer"`
	ExpiresAt   time.Time `json:"expiresAt"`
}

func newCertificateEvent(rec *record.Certificate) certificateEvent {
	c := rec.Certificate
	return certificateEvent{Certificate: rec.ID, Source: c.Source, Target: c.Target, Tool: c.Tool, Signer: rec.KeyID,
		ExpiresAt: c.ExpiresAt}
}

// revocationEvent is a revoked certificate and who revoked it.
type revocationEvent struct {
	Certificate string `json:"certificate"`
	By          string `json:"by"`
}

// policyLoadedEvent and policyRefusedEvent are a replica's policy events:
// the policy manager's (authz/policy) data and the replica it names.
// Revision, a set from an OPA bundle's only, is its .manifest's revision:
// an optional member, absent from every event of a directory's set, so
// such events are version 1's byte for byte and version 1's readers pass
// it by (docs/audit.md, on versions).
type (
	policyLoadedEvent struct {
		Source   string   `json:"source"`
		Digest   string   `json:"digest"`
		Revision string   `json:"revision,omitempty"`
		Files    []string `json:"files"`
		Replica  string   `json:"replica"`
	}
	policyRefusedEvent struct {
		Source  string `json:"source"`
		InForce string `json:"inForce"`
		Error   string `json:"error"`
		Replica string `json:"replica"`
	}
)

// newPolicyEvent is the event of a replica's policy event as the store
// kept it: the manager's data, with the replica. A kind of neither shape
// keeps the data's members as they are.
func newPolicyEvent(ch lease.PolicyRecorded) (any, error) {
	switch ch.Kind {
	case EventPolicy:
		var ev policyLoadedEvent
		err := json.Unmarshal(ch.Data, &ev)
		ev.Replica = ch.Replica
		return ev, err
	case EventPolicyRefused:
		var ev policyRefusedEvent
		err := json.Unmarshal(ch.Data, &ev)
		ev.Replica = ch.Replica
		return ev, err
	}
	data := map[string]any{}
	err := json.Unmarshal(ch.Data, &data)
	data["replica"] = ch.Replica
	return data, err
}

// gapEvent is history the trail could not follow: revisions from..to,
// compacted before the follower read them.
type gapEvent struct {
	From int64 `json:"from"`
	To   int64 `json:"to"`
}

// restoreEvent is the store restored from a snapshot of revision
// SnapshotRevision, its revisions raised by RevisionBump: from..to never
// existed in the restored store.
type restoreEvent struct {
	SnapshotRevision int64  `json:"snapshotRevision"`
	RevisionBump     uint64 `json:"revisionBump"`
	From             int64  `json:"from"`
	To               int64  `json:"to"`
}
