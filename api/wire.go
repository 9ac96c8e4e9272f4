package api

import (
	"encoding/json"
	"time"

	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
)

// The REST representations of fcd's records: what the handlers answer
// and decode, as components/schemas of api/openapi.yaml describe them.
// They are the API's own types, filled from the domain records (package
// record) by the converters below, so that a record field renamed or
// added changes no answer until it is mapped here and in the document
// (TestWireMapsEveryRecordField fails meanwhile); the member order is
// the records' JSON order of before, byte for byte (testdata/wire).
//
// The documents fcd verifies signatures over — a manifest and its Tool+
// descriptors, a compatibility certificate — and the pieces of them a
// record copies (artifact, failure modes, dependencies, profile, side
// effect) are shown as the documents are (package manifest's types): they
// are the signed format, not a record, and their canonical form is theirs.

// wireFormation is a formation record (components/schemas/Formation).
type wireFormation struct {
	wireCall
	Digest            string         `json:"digest"`
	Decision          wireDecision   `json:"decision"`
	Status            string         `json:"status"`
	ApprovalsRequired int            `json:"approvalsRequired"`
	Approvals         []wireApproval `json:"approvals"`
	Lease             string         `json:"lease,omitempty"`
	Outcome           string         `json:"outcome,omitempty"`
	Failure           *wireFailure   `json:"failure,omitempty"`
	UpdatedAt         time.Time      `json:"updatedAt"`
}

// wireCall is the immutable part of a formation: the members from id to
// recovery.
type wireCall struct {
	ID               string          `json:"id"`
	Session          string          `json:"session"`
	Principal        wirePrincipal   `json:"principal"`
	Snapshot         string          `json:"snapshot"`
	Tool             string          `json:"tool"`
	DescriptorDigest string          `json:"descriptorDigest"`
	Arguments        json.RawMessage `json:"arguments"`
	ArgumentDigest   string          `json:"argumentDigest"`
	Source           wireTarget      `json:"source"`
	Successor        *wireSuccessor  `json:"successor"`
	Metadata         wireMetadata    `json:"metadata"`
	CreatedAt        time.Time       `json:"createdAt"`
	ExpiresAt        time.Time       `json:"expiresAt"`
	Recovery         *wireRecovery   `json:"recovery,omitempty"`
}

type wirePrincipal struct {
	ID         string         `json:"id"`
	Attributes map[string]any `json:"attributes,omitempty"`
	Host       string         `json:"host"`
}

// wireTarget is components/schemas/Target.
type wireTarget struct {
	Epoch        string            `json:"epoch"`
	Server       string            `json:"server"`
	Release      string            `json:"release"`
	Pool         string            `json:"pool"`
	Artifact     manifest.Artifact `json:"artifact"`
	ConfigDigest string            `json:"configDigest"`
}

// wireSuccessor is components/schemas/Successor.
type wireSuccessor struct {
	wireTarget
	Certificate string              `json:"certificate"`
	Issuer      string              `json:"issuer"`
	Effects     map[string]any      `json:"effects"`
	Profile     manifest.ProfileRef `json:"profile"`
	ExpiresAt   time.Time           `json:"expiresAt"`
}

type wireMetadata struct {
	Summary          string                 `json:"summary,omitempty"`
	SideEffects      manifest.SideEffect    `json:"sideEffects"`
	RequiresApproval bool                   `json:"requiresApproval"`
	FailureModes     []manifest.FailureMode `json:"failureModes,omitempty"`
	Dependencies     *manifest.Dependencies `json:"dependencies,omitempty"`
}

type wireRecovery struct {
	Of          string                `json:"of"`
	Root        string                `json:"root"`
	Attempt     int                   `json:"attempt"`
	Outcome     string                `json:"outcome"`
	FailureMode *manifest.FailureMode `json:"failureMode"`
}

// wireFailure is components/schemas/Failure: in a formation, and in an
// outcome report (decoded strictly).
type wireFailure struct {
	Code    int64  `json:"code,omitempty"`
	Error   string `json:"error,omitempty"`
	Message string `json:"message,omitempty"`
}

type wireDecision struct {
	Verdict      string                 `json:"verdict"`
	Approvals    int                    `json:"approvals"`
	PolicyDigest string                 `json:"policyDigest"`
	Engines      []wireEngineDecision   `json:"engines"`
	Successor    *wireSuccessorDecision `json:"successor,omitempty"`
	DecidedAt    time.Time              `json:"decidedAt"`
}

type wireEngineDecision struct {
	Engine    string                `json:"engine"`
	Verdict   string                `json:"verdict"`
	Approvals int                   `json:"approvals"`
	Rules     []string              `json:"rules"`
	Reasons   []string              `json:"reasons"`
	Error     string                `json:"error,omitempty"`
	Successor *wireSuccessorVerdict `json:"successor,omitempty"`
}

type wireSuccessorVerdict struct {
	Verdict string   `json:"verdict"`
	Rules   []string `json:"rules"`
	Reasons []string `json:"reasons"`
	Error   string   `json:"error,omitempty"`
}

type wireSuccessorDecision struct {
	Certificate string `json:"certificate"`
	Epoch       string `json:"epoch"`
	Verdict     string `json:"verdict"`
}

type wireApproval struct {
	Approver string    `json:"approver"`
	Decision string    `json:"decision"`
	Digest   string    `json:"digest"`
	Reason   string    `json:"reason,omitempty"`
	At       time.Time `json:"at"`
}

// wireFormationPage is components/schemas/FormationList.
type wireFormationPage struct {
	Formations []*wireFormation `json:"formations"`
	Next       string           `json:"next,omitempty"`
}

// wireEpoch is components/schemas/Epoch.
type wireEpoch struct {
	ID              string             `json:"id"`
	Server          string             `json:"server"`
	Release         string             `json:"release"`
	Pool            string             `json:"pool"`
	Artifact        manifest.Artifact  `json:"artifact"`
	ConfigDigest    string             `json:"configDigest"`
	SignerKeyID     string             `json:"signerKid"`
	RegisteredAt    time.Time          `json:"registeredAt"`
	Tools           []wireEpochTool    `json:"tools"`
	State           string             `json:"state"`
	ActiveLeases    int                `json:"activeLeases"`
	UncertainLeases int                `json:"uncertainLeases"`
	Manifest        *manifest.Manifest `json:"manifest,omitempty"`
	JWS             string             `json:"jws,omitempty"`
}

type wireEpochTool struct {
	Name        string              `json:"name"`
	Digest      string              `json:"digest"`
	SideEffects manifest.SideEffect `json:"sideEffects"`
}

// wireLease is an open lease as operators see it (components/schemas/
// Lease): the lease and the etcd revision of its admission (the token's
// fcd_revision).
type wireLease struct {
	ID             string     `json:"id"`
	State          string     `json:"state"`
	Formation      string     `json:"formation"`
	Session        string     `json:"session"`
	Tool           string     `json:"tool"`
	ArgumentDigest string     `json:"argumentDigest"`
	Target         wireTarget `json:"target"`
	Generation     int64      `json:"generation"`
	AdmittedAt     time.Time  `json:"admittedAt"`
	Certificate    string     `json:"certificate,omitempty"`
	RecoveryOf     string     `json:"recoveryOf,omitempty"`
	Claim          *wireClaim `json:"claim,omitempty"`
	Revision       int64      `json:"revision"`
}

type wireClaim struct {
	ID string    `json:"id"`
	At time.Time `json:"at"`
}

// wireSnapshot is components/schemas/Snapshot (the summary view).
type wireSnapshot struct {
	ID    string             `json:"id"`
	Tools []wireSnapshotTool `json:"tools"`
}

type wireSnapshotTool struct {
	Name             string              `json:"name"`
	Epoch            string              `json:"epoch"`
	DescriptorDigest string              `json:"descriptorDigest"`
	Title            string              `json:"title,omitempty"`
	Summary          string              `json:"summary,omitempty"`
	SideEffects      manifest.SideEffect `json:"sideEffects"`
	RequiresApproval bool                `json:"requiresApproval"`
}

// wireFullTool is components/schemas/FullTool: an entry with its
// descriptor.
type wireFullTool struct {
	wireSnapshotTool
	Descriptor *manifest.Tool `json:"descriptor"`
}

// wireSnapshotFull is components/schemas/SnapshotFull (view=full).
type wireSnapshotFull struct {
	ID    string         `json:"id"`
	Tools []wireFullTool `json:"tools"`
}

// wireCertificate is components/schemas/CertificateRecord.
type wireCertificate struct {
	ID           string                `json:"id"`
	Certificate  *manifest.Certificate `json:"certificate"`
	KeyID        string                `json:"signerKid"`
	JWS          string                `json:"jws"`
	RegisteredAt time.Time             `json:"registeredAt"`
	Revoked      bool                  `json:"revoked"`
	RevokedAt    *time.Time            `json:"revokedAt,omitempty"`
}

// wireGrant is components/schemas/Grant: the dispatch token and where it
// admits the call.
type wireGrant struct {
	Token  string `json:"token"`
	Lease  string `json:"lease"`
	Target struct {
		Epoch string `json:"epoch"`
		Pool  string `json:"pool"`
	} `json:"target"`
	ExpiresAt time.Time `json:"expiresAt"`
}

// wireAdmissionFacts is components/schemas/AdmissionFacts, in an outcome
// report (decoded strictly).
type wireAdmissionFacts struct {
	Epoch     string `json:"epoch"`
	Revision  int64  `json:"revision"`
	Formation string `json:"formation"`
	Session   string `json:"session"`
	Tool      string `json:"tool"`
}

// mapAll is f of each of in, nil for nil (a JSON null stays one).
func mapAll[T, U any](in []T, f func(T) U) []U {
	if in == nil {
		return nil
	}
	out := make([]U, len(in))
	for i, v := range in {
		out[i] = f(v)
	}
	return out
}

func newWireFormation(f *record.Formation) *wireFormation {
	c := &f.Call
	out := &wireFormation{
		wireCall: wireCall{
			ID: c.ID, Session: c.Session, Principal: wirePrincipal{ID: c.Principal.ID, Attributes: c.Principal.Attributes, Host: c.Principal.Host},
			Snapshot: c.Snapshot, Tool: c.Tool, DescriptorDigest: c.DescriptorDigest, Arguments: c.Arguments,
			ArgumentDigest: c.ArgumentDigest, Source: newWireTarget(c.Source), Successor: newWireSuccessor(c.Successor),
			Metadata: wireMetadata{Summary: c.Metadata.Summary, SideEffects: c.Metadata.SideEffects,
				RequiresApproval: c.Metadata.RequiresApproval, FailureModes: c.Metadata.FailureModes, Dependencies: c.Metadata.Dependencies},
			CreatedAt: c.CreatedAt, ExpiresAt: c.ExpiresAt, Recovery: newWireRecovery(c.Recovery),
		},
		Digest: f.Digest, Decision: newWireDecision(f.Decision), Status: string(f.Status), ApprovalsRequired: f.ApprovalsRequired,
		Approvals: mapAll(f.Approvals, func(a record.Approval) wireApproval {
			return wireApproval{Approver: a.Approver, Decision: string(a.Decision), Digest: a.Digest, Reason: a.Reason, At: a.At}
		}),
		Lease: f.Lease, Outcome: string(f.Outcome), UpdatedAt: f.UpdatedAt,
	}
	if fl := f.Failure; fl != nil {
		out.Failure = &wireFailure{Code: fl.Code, Error: fl.Error, Message: fl.Message}
	}
	return out
}

func newWireTarget(t record.Target) wireTarget {
	return wireTarget{Epoch: t.Epoch, Server: t.Server, Release: t.Release, Pool: t.Pool, Artifact: t.Artifact, ConfigDigest: t.ConfigDigest}
}

func newWireSuccessor(s *record.Successor) *wireSuccessor {
	if s == nil {
		return nil
	}
	return &wireSuccessor{wireTarget: newWireTarget(s.Target), Certificate: s.Certificate, Issuer: s.Issuer, Effects: s.Effects,
		Profile: s.Profile, ExpiresAt: s.ExpiresAt}
}

func newWireRecovery(r *record.Recovery) *wireRecovery {
	if r == nil {
		return nil
	}
	return &wireRecovery{Of: r.Of, Root: r.Root, Attempt: r.Attempt, Outcome: string(r.Outcome), FailureMode: r.FailureMode}
}

func newWireDecision(d record.Decision) wireDecision {
	out := wireDecision{Verdict: string(d.Verdict), Approvals: d.Approvals, PolicyDigest: d.PolicyDigest, DecidedAt: d.DecidedAt,
		Engines: mapAll(d.Engines, func(e record.EngineDecision) wireEngineDecision {
			w := wireEngineDecision{Engine: e.Engine, Verdict: string(e.Verdict), Approvals: e.Approvals, Rules: e.Rules,
				Reasons: e.Reasons, Error: e.Error}
			if s := e.Successor; s != nil {
				w.Successor = &wireSuccessorVerdict{Verdict: string(s.Verdict), Rules: s.Rules, Reasons: s.Reasons, Error: s.Error}
			}
			return w
		})}
	if s := d.Successor; s != nil {
		out.Successor = &wireSuccessorDecision{Certificate: s.Certificate, Epoch: s.Epoch, Verdict: string(s.Verdict)}
	}
	return out
}

func newWireFormationPage(p *authz.FormationPage) wireFormationPage {
	return wireFormationPage{Formations: mapAll(p.Formations, newWireFormation), Next: p.Next}
}

func newWireEpoch(e *record.Epoch) *wireEpoch {
	return &wireEpoch{ID: e.ID, Server: e.Server, Release: e.Release, Pool: e.Pool, Artifact: e.Artifact, ConfigDigest: e.ConfigDigest,
		SignerKeyID: e.SignerKeyID, RegisteredAt: e.RegisteredAt,
		Tools: mapAll(e.Tools, func(t record.EpochTool) wireEpochTool {
			return wireEpochTool{Name: t.Name, Digest: t.Digest, SideEffects: t.SideEffects}
		}),
		State: string(e.State), ActiveLeases: e.ActiveLeases, UncertainLeases: e.UncertainLeases, Manifest: e.Manifest, JWS: e.JWS}
}

func newWireLease(l *record.Lease) wireLease {
	out := wireLease{ID: l.ID, State: string(l.State), Formation: l.Formation, Session: l.Session, Tool: l.Tool,
		ArgumentDigest: l.ArgumentDigest, Target: newWireTarget(l.Target), Generation: l.Generation, AdmittedAt: l.AdmittedAt,
		Certificate: l.Certificate, RecoveryOf: l.RecoveryOf, Revision: l.Revision}
	if c := l.Claim; c != nil {
		out.Claim = &wireClaim{ID: c.ID, At: c.At}
	}
	return out
}

func newWireSnapshot(s *record.Snapshot) *wireSnapshot {
	return &wireSnapshot{ID: s.ID, Tools: mapAll(s.Tools, newWireSnapshotTool)}
}

func newWireSnapshotTool(t record.SnapshotTool) wireSnapshotTool {
	return wireSnapshotTool{Name: t.Name, Epoch: t.Epoch, DescriptorDigest: t.DescriptorDigest, Title: t.Title, Summary: t.Summary,
		SideEffects: t.SideEffects, RequiresApproval: t.RequiresApproval}
}

func newWireFullTool(t record.FullTool) wireFullTool {
	return wireFullTool{wireSnapshotTool: newWireSnapshotTool(t.SnapshotTool), Descriptor: t.Descriptor}
}

func newWireCertificate(c *record.Certificate) *wireCertificate {
	return &wireCertificate{ID: c.ID, Certificate: c.Certificate, KeyID: c.KeyID, JWS: c.JWS, RegisteredAt: c.RegisteredAt,
		Revoked: c.Revoked, RevokedAt: c.RevokedAt}
}

func newWireGrant(a *authz.Grant) wireGrant {
	out := wireGrant{Token: a.Token, Lease: a.Lease, ExpiresAt: a.ExpiresAt}
	out.Target.Epoch, out.Target.Pool = a.Target.Epoch, a.Target.Pool
	return out
}

// admission is the record of the facts an outcome report repeats, nil
// when it repeats none.
func (a *wireAdmissionFacts) admission() *record.Admission {
	if a == nil {
		return nil
	}
	return &record.Admission{Epoch: a.Epoch, Revision: a.Revision, Formation: a.Formation, Session: a.Session, Tool: a.Tool}
}

// failure is the record of what a report says the backend answered, nil
// when it says nothing.
func (f *wireFailure) failure() *record.Failure {
	if f == nil {
		return nil
	}
	return &record.Failure{Code: f.Code, Error: f.Error, Message: f.Message}
}

// wireComparison is components/schemas/Comparison: a formation's tool
// as its source, its successor and the server's active epoch declare it,
// and the members in which they differ.
type wireComparison struct {
	Formation   string             `json:"formation"`
	Tool        string             `json:"tool"`
	Arguments   json.RawMessage    `json:"arguments"`
	Omitted     []string           `json:"omitted"`
	Source      wireComparedEpoch  `json:"source"`
	Successor   *wireComparedEpoch `json:"successor"`
	Active      *wireComparedEpoch `json:"active"`
	Differences []wireDifference   `json:"differences"`
}

// wireComparedEpoch is components/schemas/ComparedEpoch. Its member
// names are what a difference's pointer names (authz.ComparedEpoch's).
type wireComparedEpoch struct {
	Epoch        string                 `json:"epoch"`
	Release      string                 `json:"release"`
	State        string                 `json:"state"`
	Pool         string                 `json:"pool"`
	Artifact     manifest.Artifact      `json:"artifact"`
	Config       manifest.Config        `json:"config"`
	FeatureFlags *manifest.FeatureFlags `json:"featureFlags,omitempty"`
	Downstream   []manifest.Downstream  `json:"downstream,omitempty"`
	Tool         *wireComparedTool      `json:"tool"`
	Certificate  *wireComparedCert      `json:"certificate,omitempty"`
}

type wireComparedTool struct {
	DescriptorDigest string                 `json:"descriptorDigest"`
	Title            string                 `json:"title,omitempty"`
	Description      string                 `json:"description,omitempty"`
	InputSchema      json.RawMessage        `json:"inputSchema"`
	SideEffects      manifest.SideEffect    `json:"sideEffects"`
	RequiresApproval bool                   `json:"requiresApproval"`
	FailureModes     []manifest.FailureMode `json:"failureModes,omitempty"`
	Dependencies     *manifest.Dependencies `json:"dependencies,omitempty"`
}

type wireComparedCert struct {
	ID        string              `json:"id"`
	Effects   map[string]any      `json:"effects"`
	Profile   manifest.ProfileRef `json:"profile"`
	ExpiresAt time.Time           `json:"expiresAt"`
	Revoked   bool                `json:"revoked"`
}

type wireDifference struct {
	Column  string          `json:"column"`
	Pointer string          `json:"pointer"`
	Source  json.RawMessage `json:"source,omitempty"`
	Other   json.RawMessage `json:"other,omitempty"`
}

func newWireComparison(c *authz.Comparison) *wireComparison {
	return &wireComparison{Formation: c.Formation, Tool: c.Tool, Arguments: c.Arguments, Omitted: c.Omitted,
		Source: *newWireComparedEpoch(&c.Source), Successor: newWireComparedEpoch(c.Successor), Active: newWireComparedEpoch(c.Active),
		Differences: mapAll(c.Differences, func(d authz.Difference) wireDifference {
			return wireDifference{Column: d.Column, Pointer: d.Pointer, Source: d.Source, Other: d.Other}
		})}
}

func newWireComparedEpoch(e *authz.ComparedEpoch) *wireComparedEpoch {
	if e == nil {
		return nil
	}
	out := &wireComparedEpoch{Epoch: e.Epoch, Release: e.Release, State: string(e.State), Pool: e.Pool, Artifact: e.Artifact,
		Config: e.Config, FeatureFlags: e.FeatureFlags, Downstream: e.Downstream}
	if t := e.Tool; t != nil {
		out.Tool = &wireComparedTool{DescriptorDigest: t.DescriptorDigest, Title: t.Title, Description: t.Description,
			InputSchema: t.InputSchema, SideEffects: t.SideEffects, RequiresApproval: t.RequiresApproval,
			FailureModes: t.FailureModes, Dependencies: t.Dependencies}
	}
	if c := e.Certificate; c != nil {
		out.Certificate = &wireComparedCert{ID: c.ID, Effects: c.Effects, Profile: c.Profile, ExpiresAt: c.ExpiresAt, Revoked: c.Revoked}
	}
	return out
}
