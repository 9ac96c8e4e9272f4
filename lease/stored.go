package lease

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
)

// The stored format: what the store writes into etcd is its own, not
// package record's JSON (which is what the API and the trail show), so
// that record, the REST API and the store can each change apart. Every
// JSON value the store writes is one of the stored* types below, converted
// from and to records at the store's boundary, and carries its format
// version in a member "v":
//
//   - version 1: what fcd wrote before the stored format was versioned,
//     with no "v" (record's JSON of the day); read as it was then, members
//     that version 1 wrote and version 2 no longer has (a formation call's
//     empty status, say) ignored;
//   - version 2 (storedVersion): the types below; members named as in
//     version 1.
//
// A value of any other version, or not a JSON object, or a version 2
// value with a member the type does not have, is refused, with the key,
// as record.ErrCorrupt (a *VersionError for an unknown version): never
// read as empty or as far as it goes. Version 2 is strict because a
// member this build does not know is one whose meaning it cannot honour —
// written by a newer fcd, or by someone editing etcd — and the store
// decides admissions on these values. A change of members is therefore a
// new version: bump storedVersion, keep reading the old one, and update
// the golden files (stored_test.go). The raw values of keys.go (states,
// generations, ledger entries, JWS, JWKs) are not JSON of the store's and
// carry no version: their bytes are their format.

// storedVersion is the format version of the values the store writes.
const storedVersion = 2

// VersionError is a stored value of a format version this build does not
// read (one written by a newer fcd). It is record.ErrCorrupt: what it says
// cannot be relied on, so whoever reads it fails closed.
type VersionError struct {
	Key     string
	Version int
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("lease: %s: stored format version %d is not one this build reads (1-%d)", e.Key, e.Version, storedVersion)
}

// Unwrap makes a VersionError record.ErrCorrupt.
func (e *VersionError) Unwrap() error { return record.ErrCorrupt }

// versioned is a stored type: version is its "v" (0 when absent).
type versioned interface{ version() int }

// encodeStored encodes a stored value; v's "v" is set by its maker.
func encodeStored(what string, v versioned) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("lease: encode %s: %w", what, err)
	}
	return string(b), nil
}

// decodeStored decodes the stored value b of key into v: a version 2
// value strictly, a version 1 value as version 1 was read. See the
// comment at the top of this file for what it refuses.
func decodeStored(key []byte, b []byte, v versioned) error {
	corrupt := func(err error) error { return fmt.Errorf("%w: %s: %v", record.ErrCorrupt, key, err) }
	if t := bytes.TrimLeft(b, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return corrupt(errors.New("not a JSON object"))
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			return corrupt(errors.New("data after the value"))
		}
		switch ver := v.version(); ver {
		case 0, 1, storedVersion:
			return nil
		default:
			return &VersionError{Key: string(key), Version: ver}
		}
	}
	var head struct {
		V *int `json:"v"`
	}
	if json.Unmarshal(b, &head) != nil {
		return corrupt(err)
	}
	switch {
	case head.V == nil || *head.V == 1:
		if err := json.Unmarshal(b, v); err != nil {
			return corrupt(err)
		}
		return nil
	case *head.V == storedVersion:
		return corrupt(err)
	default:
		return &VersionError{Key: string(key), Version: *head.V}
	}
}

// ver is the version member every stored type embeds first.
type ver struct {
	V int `json:"v"`
}

func (x ver) version() int { return x.V }

// current is the version member of a value written now.
var current = ver{V: storedVersion}

// Targets, and the parts of a formation's call.

type storedTarget struct {
	Epoch        string            `json:"epoch"`
	Server       string            `json:"server"`
	Release      string            `json:"release"`
	Pool         string            `json:"pool"`
	Artifact     manifest.Artifact `json:"artifact"`
	ConfigDigest string            `json:"configDigest"`
}

type storedPrincipal struct {
	ID         string         `json:"id"`
	Attributes map[string]any `json:"attributes,omitempty"`
	Host       string         `json:"host"`
}

type storedMetadata struct {
	Summary          string                 `json:"summary,omitempty"`
	SideEffects      manifest.SideEffect    `json:"sideEffects"`
	RequiresApproval bool                   `json:"requiresApproval"`
	FailureModes     []manifest.FailureMode `json:"failureModes,omitempty"`
	Dependencies     *manifest.Dependencies `json:"dependencies,omitempty"`
}

type storedSuccessor struct {
	storedTarget
	Certificate string              `json:"certificate"`
	Issuer      string              `json:"issuer"`
	Effects     map[string]any      `json:"effects"`
	Profile     manifest.ProfileRef `json:"profile"`
	ExpiresAt   time.Time           `json:"expiresAt"`
}

type storedRecovery struct {
	Of          string                `json:"of"`
	Root        string                `json:"root"`
	Attempt     int                   `json:"attempt"`
	Outcome     record.Outcome        `json:"outcome"`
	FailureMode *manifest.FailureMode `json:"failureMode"`
}

type storedFailure struct {
	Code    int64  `json:"code,omitempty"`
	Error   string `json:"error,omitempty"`
	Message string `json:"message,omitempty"`
}

type storedEngineDecision struct {
	Engine    string                  `json:"engine"`
	Verdict   record.Verdict          `json:"verdict"`
	Approvals int                     `json:"approvals"`
	Rules     []string                `json:"rules"`
	Reasons   []string                `json:"reasons"`
	Error     string                  `json:"error,omitempty"`
	Successor *storedSuccessorVerdict `json:"successor,omitempty"`
}

type storedSuccessorVerdict struct {
	Verdict record.Verdict `json:"verdict"`
	Rules   []string       `json:"rules"`
	Reasons []string       `json:"reasons"`
	Error   string         `json:"error,omitempty"`
}

type storedSuccessorDecision struct {
	Certificate string         `json:"certificate"`
	Epoch       string         `json:"epoch"`
	Verdict     record.Verdict `json:"verdict"`
}

type storedDecision struct {
	Verdict      record.Verdict           `json:"verdict"`
	Approvals    int                      `json:"approvals"`
	PolicyDigest string                   `json:"policyDigest"`
	Engines      []storedEngineDecision   `json:"engines"`
	Successor    *storedSuccessorDecision `json:"successor,omitempty"`
	DecidedAt    time.Time                `json:"decidedAt"`
}

type storedApproval struct {
	Approver string                  `json:"approver"`
	Decision record.ApprovalDecision `json:"decision"`
	Digest   string                  `json:"digest"`
	Reason   string                  `json:"reason,omitempty"`
	At       time.Time               `json:"at"`
}

// storedCall is a formation's immutable part (formations/<id>): the call,
// its record digest, decision and approvals required.
type storedCall struct {
	ver
	ID                string           `json:"id"`
	Session           string           `json:"session"`
	Principal         storedPrincipal  `json:"principal"`
	Snapshot          string           `json:"snapshot"`
	Tool              string           `json:"tool"`
	DescriptorDigest  string           `json:"descriptorDigest"`
	Arguments         json.RawMessage  `json:"arguments"`
	ArgumentDigest    string           `json:"argumentDigest"`
	Source            storedTarget     `json:"source"`
	Successor         *storedSuccessor `json:"successor"`
	Metadata          storedMetadata   `json:"metadata"`
	CreatedAt         time.Time        `json:"createdAt"`
	ExpiresAt         time.Time        `json:"expiresAt"`
	Recovery          *storedRecovery  `json:"recovery,omitempty"`
	Digest            string           `json:"digest"`
	Decision          storedDecision   `json:"decision"`
	ApprovalsRequired int              `json:"approvalsRequired"`
}

// storedFormationState is a formation's mutable part
// (formation-states/<id>).
type storedFormationState struct {
	ver
	Status    record.Status    `json:"status"`
	Approvals []storedApproval `json:"approvals"`
	Lease     string           `json:"lease,omitempty"`
	UpdatedAt time.Time        `json:"updatedAt"`
}

// storedOutcome is the status a lease's outcome gave its formation
// (formation-outcomes/<id>), and how the lease closed.
type storedOutcome struct {
	ver
	Status    record.Status  `json:"status"`
	Outcome   record.Outcome `json:"outcome,omitempty"`
	Failure   *storedFailure `json:"failure,omitempty"`
	UpdatedAt time.Time      `json:"updatedAt"`
	// Closure says how the lease closed; absent in values written before
	// the audit trail followed the store.
	Closure *closure `json:"closure,omitempty"`
}

// closure is what the audit trail records of a lease's close besides its
// outcome: which lease, under which claim, by whom. It is written into the
// outcome's value in the close's own transaction, so the trail, which
// follows etcd's history (follow.go), records it whether or not the
// request that closed the lease got its answer.
type closure struct {
	Lease string `json:"lease"`
	Claim string `json:"claim,omitempty"`
	// By is byBackend, byRelease, bySweep, byGeneration or byOperator.
	By string `json:"by"`
	// Operator and Reason: a resolution's.
	Operator string `json:"operator,omitempty"`
	Reason   string `json:"reason,omitempty"`
	// Generation is the pool generation that released the lease.
	Generation int64 `json:"generation,omitempty"`
}

// How a lease closed (closure.By).
const (
	byBackend    = "backend"    // a report under the claim
	byRelease    = "release"    // a report without a claim: nothing ran
	bySweep      = "sweep"      // never reported: marked uncertain
	byGeneration = "generation" // released by a newer pool generation
	byOperator   = "operator"   // an operator's resolution
)

func toStoredTarget(t record.Target) storedTarget { return storedTarget(t) }
func (t storedTarget) record() record.Target      { return record.Target(t) }

func toStoredFailure(f *record.Failure) *storedFailure {
	if f == nil {
		return nil
	}
	s := storedFailure(*f)
	return &s
}

func (f *storedFailure) record() *record.Failure {
	if f == nil {
		return nil
	}
	r := record.Failure(*f)
	return &r
}

func toStoredApprovals(as []record.Approval) []storedApproval {
	if as == nil {
		return nil
	}
	out := make([]storedApproval, len(as))
	for i, a := range as {
		out[i] = storedApproval(a)
	}
	return out
}

func recordApprovals(as []storedApproval) []record.Approval {
	if as == nil {
		return nil
	}
	out := make([]record.Approval, len(as))
	for i, a := range as {
		out[i] = record.Approval(a)
	}
	return out
}

// toStoredCall is f's immutable part as stored.
func toStoredCall(f *record.Formation) *storedCall {
	c := &storedCall{ver: current,
		ID: f.ID, Session: f.Session, Principal: storedPrincipal(f.Principal), Snapshot: f.Snapshot, Tool: f.Tool,
		DescriptorDigest: f.DescriptorDigest, Arguments: f.Arguments, ArgumentDigest: f.ArgumentDigest,
		Source: toStoredTarget(f.Source), Metadata: storedMetadata(f.Metadata), CreatedAt: f.CreatedAt, ExpiresAt: f.ExpiresAt,
		Digest: f.Digest, ApprovalsRequired: f.ApprovalsRequired,
		Decision: storedDecision{Verdict: f.Decision.Verdict, Approvals: f.Decision.Approvals, PolicyDigest: f.Decision.PolicyDigest,
			DecidedAt: f.Decision.DecidedAt},
	}
	if s := f.Successor; s != nil {
		c.Successor = &storedSuccessor{storedTarget: toStoredTarget(s.Target), Certificate: s.Certificate, Issuer: s.Issuer,
			Effects: s.Effects, Profile: s.Profile, ExpiresAt: s.ExpiresAt}
	}
	if r := f.Recovery; r != nil {
		sr := storedRecovery(*r)
		c.Recovery = &sr
	}
	if es := f.Decision.Engines; es != nil {
		c.Decision.Engines = make([]storedEngineDecision, len(es))
		for i, e := range es {
			c.Decision.Engines[i] = storedEngineDecision{Engine: e.Engine, Verdict: e.Verdict, Approvals: e.Approvals,
				Rules: e.Rules, Reasons: e.Reasons, Error: e.Error}
			if sv := e.Successor; sv != nil {
				v := storedSuccessorVerdict(*sv)
				c.Decision.Engines[i].Successor = &v
			}
		}
	}
	if sd := f.Decision.Successor; sd != nil {
		d := storedSuccessorDecision(*sd)
		c.Decision.Successor = &d
	}
	return c
}

// formation is the record of the call, its state not yet joined.
func (c *storedCall) formation() *record.Formation {
	f := &record.Formation{
		Call: record.Call{ID: c.ID, Session: c.Session, Principal: record.Principal(c.Principal), Snapshot: c.Snapshot, Tool: c.Tool,
			DescriptorDigest: c.DescriptorDigest, Arguments: c.Arguments, ArgumentDigest: c.ArgumentDigest,
			Source: c.Source.record(), Metadata: record.Metadata(c.Metadata), CreatedAt: c.CreatedAt, ExpiresAt: c.ExpiresAt},
		Digest: c.Digest, ApprovalsRequired: c.ApprovalsRequired,
		Decision: record.Decision{Verdict: c.Decision.Verdict, Approvals: c.Decision.Approvals, PolicyDigest: c.Decision.PolicyDigest,
			DecidedAt: c.Decision.DecidedAt},
	}
	if s := c.Successor; s != nil {
		f.Successor = &record.Successor{Target: s.storedTarget.record(), Certificate: s.Certificate, Issuer: s.Issuer,
			Effects: s.Effects, Profile: s.Profile, ExpiresAt: s.ExpiresAt}
	}
	if r := c.Recovery; r != nil {
		rr := record.Recovery(*r)
		f.Recovery = &rr
	}
	if es := c.Decision.Engines; es != nil {
		f.Decision.Engines = make([]record.EngineDecision, len(es))
		for i, e := range es {
			f.Decision.Engines[i] = record.EngineDecision{Engine: e.Engine, Verdict: e.Verdict, Approvals: e.Approvals,
				Rules: e.Rules, Reasons: e.Reasons, Error: e.Error}
			if sv := e.Successor; sv != nil {
				v := record.SuccessorVerdict(*sv)
				f.Decision.Engines[i].Successor = &v
			}
		}
	}
	if sd := c.Decision.Successor; sd != nil {
		d := record.SuccessorDecision(*sd)
		f.Decision.Successor = &d
	}
	return f
}

// Leases.

// storedMarker is a lease marker (markers/<epoch>/<lease>): the lease as
// admitted, and the session dependencies the admission's compares checked
// (which the audit trail records with the admission; a marker rewritten
// uncertain holds the lease alone). A lease's claim has a key of its own.
type storedMarker struct {
	ver
	ID             string            `json:"id"`
	State          record.LeaseState `json:"state"`
	Formation      string            `json:"formation"`
	Session        string            `json:"session"`
	Tool           string            `json:"tool"`
	ArgumentDigest string            `json:"argumentDigest"`
	Target         storedTarget      `json:"target"`
	Generation     int64             `json:"generation"`
	AdmittedAt     time.Time         `json:"admittedAt"`
	Certificate    string            `json:"certificate,omitempty"`
	RecoveryOf     string            `json:"recoveryOf,omitempty"`
	Requires       []string          `json:"requires,omitempty"`
	Exclusive      []string          `json:"exclusiveWith,omitempty"`
}

func toStoredMarker(l *record.Lease, requires, exclusive []string) *storedMarker {
	return &storedMarker{ver: current, ID: l.ID, State: l.State, Formation: l.Formation, Session: l.Session, Tool: l.Tool,
		ArgumentDigest: l.ArgumentDigest, Target: toStoredTarget(l.Target), Generation: l.Generation, AdmittedAt: l.AdmittedAt,
		Certificate: l.Certificate, RecoveryOf: l.RecoveryOf, Requires: requires, Exclusive: exclusive}
}

// lease is the marker's lease, without its claim, revision or cluster.
func (m *storedMarker) lease() *record.Lease {
	return &record.Lease{ID: m.ID, State: m.State, Formation: m.Formation, Session: m.Session, Tool: m.Tool,
		ArgumentDigest: m.ArgumentDigest, Target: m.Target.record(), Generation: m.Generation, AdmittedAt: m.AdmittedAt,
		Certificate: m.Certificate, RecoveryOf: m.RecoveryOf}
}

// decodeMarker decodes a lease marker.
func decodeMarker(key, b []byte) (*storedMarker, error) {
	var m storedMarker
	if err := decodeStored(key, b, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// storedIndex is a lease's index (leases/<id>): its epoch and formation.
// A report's compare proves both by the value's bytes, so it is encoded
// one way only (indexValue). Version 1 wrote the same members without
// "v", and before them the bare epoch id.
type storedIndex struct {
	ver
	Epoch     string `json:"epoch"`
	Formation string `json:"formation"`
}

// storedClaim is a lease's claim (claims/<lease>/<claim>): the claim, and
// the epoch and admission revision it was made for (which the audit trail
// records).
type storedClaim struct {
	ver
	ID        string    `json:"id"`
	At        time.Time `json:"at"`
	Epoch     string    `json:"epoch"`
	Admission int64     `json:"admission"`
}

// decodeClaim decodes a claim; the claim's Revision is the caller's.
func decodeClaim(key, b []byte) (*storedClaim, error) {
	var c storedClaim
	if err := decodeStored(key, b, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

func (c *storedClaim) claim() *record.Claim { return &record.Claim{ID: c.ID, At: c.At} }

// storedReissue is the last dispatch token issued again for an open
// admission (reissues/<lease>).
type storedReissue struct {
	ver
	Formation string    `json:"formation"`
	At        time.Time `json:"at"`
	Expires   time.Time `json:"tokenExpires"`
}

// Catalog and certificates.

type storedSnapshotTool struct {
	Name             string              `json:"name"`
	Epoch            string              `json:"epoch"`
	DescriptorDigest string              `json:"descriptorDigest"`
	Title            string              `json:"title,omitempty"`
	Summary          string              `json:"summary,omitempty"`
	SideEffects      manifest.SideEffect `json:"sideEffects"`
	RequiresApproval bool                `json:"requiresApproval"`
}

// storedSnapshot is a catalog snapshot (snapshots/<id>).
type storedSnapshot struct {
	ver
	ID    string               `json:"id"`
	Tools []storedSnapshotTool `json:"tools"`
}

func toStoredSnapshot(s *record.Snapshot) *storedSnapshot {
	out := &storedSnapshot{ver: current, ID: s.ID}
	if s.Tools != nil {
		out.Tools = make([]storedSnapshotTool, len(s.Tools))
		for i, t := range s.Tools {
			out.Tools[i] = storedSnapshotTool(t)
		}
	}
	return out
}

func (s *storedSnapshot) snapshot() *record.Snapshot {
	out := &record.Snapshot{ID: s.ID}
	if s.Tools != nil {
		out.Tools = make([]record.SnapshotTool, len(s.Tools))
		for i, t := range s.Tools {
			out.Tools[i] = record.SnapshotTool(t)
		}
	}
	return out
}

// storedCertificate is a compatibility certificate as registered
// (certificates/<source>/<tool>/<id>).
type storedCertificate struct {
	ver
	ID           string                `json:"id"`
	Certificate  *manifest.Certificate `json:"certificate"`
	KeyID        string                `json:"signerKid"`
	JWS          string                `json:"jws"`
	RegisteredAt time.Time             `json:"registeredAt"`
	Revoked      bool                  `json:"revoked"`
	RevokedAt    *time.Time            `json:"revokedAt,omitempty"`
}

func toStoredCertificate(c *record.Certificate) *storedCertificate {
	return &storedCertificate{ver: current, ID: c.ID, Certificate: c.Certificate, KeyID: c.KeyID, JWS: c.JWS,
		RegisteredAt: c.RegisteredAt, Revoked: c.Revoked, RevokedAt: c.RevokedAt}
}

func (c *storedCertificate) certificate(rev int64) *record.Certificate {
	return &record.Certificate{ID: c.ID, Certificate: c.Certificate, KeyID: c.KeyID, JWS: c.JWS,
		RegisteredAt: c.RegisteredAt, Revoked: c.Revoked, RevokedAt: c.RevokedAt, Revision: rev}
}

// For the audit trail and compaction.

// storedNote is a notes/<kind>/<subject> value: who made the change it is
// written with, and the state, generation or revocation it made.
type storedNote struct {
	ver
	By         string `json:"by,omitempty"`
	State      string `json:"state,omitempty"`
	Generation int64  `json:"generation,omitempty"`
}

// storedRestore is a restore of the store (notes/restores/<revision>).
type storedRestore struct {
	ver
	Revision int64  `json:"snapshotRevision"`
	Bump     uint64 `json:"revisionBump"`
}

// storedCursor is a replica's trail cursor (trail-cursors/<replica>).
type storedCursor struct {
	ver
	Revision int64     `json:"revision"`
	At       time.Time `json:"at"`
}

// storedPolicyEvent is a replica's last policy event
// (policy-events/<replica>).
type storedPolicyEvent struct {
	ver
	Kind string          `json:"kind"`
	Data json.RawMessage `json:"data"`
}
