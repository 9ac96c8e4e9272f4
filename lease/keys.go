package lease

import (
	"net/url"
	"strings"
)

// The keyspace: every key the store reads or writes, built here and
// nowhere else. Each key sits under the store's prefix (Config.Prefix,
// "/fcd/" by default); the first segment after it names the kind, and the
// audit trail's follower (follow.go) tells the kinds apart by it. The
// layout is the stored data's address: renaming a segment strands every
// value written under the old name. TestStoredValuesGolden pins it: its
// golden files (testdata/stored) are named by the keys they were read
// from, and TestStoredVersion1IsRead finds version 1 data under them.
//
// What a key holds is one of:
//
//   - a JSON value of the store's own, versioned (stored.go): written by
//     this package only, read back through decodeStored, which accepts
//     the versions it knows and refuses any other;
//   - a raw value that a transaction compares byte for byte (an epoch's
//     state, a pool generation), or that is a plain name or a document
//     of someone else's format (a ledger entry, a certificate's key, a
//     signed resolution, a published JWK): no version, its bytes are the
//     format.
//
// Lifetimes: "kept" is for as long as the store exists (such keys are few
// a deployment: epochs, certificates, pools, replicas); "retention" is the
// etcd lease of a formation's keep or a closed record's retention
// (formation.go's retention), after which etcd deletes the key itself.
//
// Segments, in the order the table below documents them:
const (
	segEpochs            = "epochs"
	segStates            = "states"
	segSnapshots         = "snapshots"
	segFormations        = "formations"
	segFormationStates   = "formation-states"
	segFormationOutcomes = "formation-outcomes"
	segPendingApproval   = "pending-approval"
	segRecoveries        = "recoveries"
	segMarkers           = "markers"
	segLeases            = "leases"
	segClaims            = "claims"
	segReissues          = "reissues"
	segResolutions       = "resolutions"
	segSessions          = "sessions"
	segPools             = "pools"
	segCertificates      = "certificates"
	segCertificateIDs    = "certificate-ids"
	segNotes             = "notes"
	segTrailCursors      = "trail-cursors"
	segPolicyEvents      = "policy-events"
	segJWKS              = "jwks"
	segPing              = "ping"
)

// keys is the one place that builds etcd keys; p is the store's prefix.
type keys struct{ p string }

// under is the prefix of every key of a segment.
func (k keys) under(seg string) string { return k.p + seg + "/" }

// kind splits a key of the store into its segment and the rest (the ids
// after it); ok is false for a key outside the prefix.
func (k keys) kind(key string) (seg, rest string, ok bool) {
	r, ok := strings.CutPrefix(key, k.p)
	if !ok {
		return "", "", false
	}
	seg, rest, _ = strings.Cut(r, "/")
	return seg, rest, true
}

// Epochs.

// epoch holds an epoch's immutable record (storedEpoch: the signed
// manifest, its JWS, signer and registration time). Written once by
// RegisterEpoch; kept. epochs is the prefix of every epoch.
func (k keys) epoch(id string) string { return k.epochs() + id }
func (k keys) epochs() string         { return k.under(segEpochs) }

// state holds an epoch's lifecycle state, raw ("ACTIVE", "DRAINING",
// "STALE"): admissions compare it byte for byte. Written by RegisterEpoch
// (ACTIVE), Drain and Retire; kept. states is the prefix of every state.
func (k keys) state(id string) string { return k.states() + id }
func (k keys) states() string         { return k.under(segStates) }

// snapshot holds an immutable catalog snapshot (storedSnapshot), under its
// content digest. Written once by CreateSnapshot; kept.
func (k keys) snapshot(id string) string { return k.under(segSnapshots) + id }

// Formations: a formation is stored under up to four keys (formation.go
// says why), which share its retention.

// formation holds a formation's immutable call (storedCall: arguments,
// snapshot, decision, digest, captured successor). Written once by
// CreateFormation; retention (the formation's keep; detached while its
// lease is uncertain; from its close once closed). formations is the
// prefix of every formation, which ListFormations pages through.
func (k keys) formation(id string) string { return k.formations() + id }
func (k keys) formations() string         { return k.under(segFormations) }

// formationState holds a formation's small mutable state
// (storedFormationState: status, approvals, lease). Written by
// CreateFormation, UpdateFormation (approvals) and Admit; the call's
// retention.
func (k keys) formationState(id string) string { return k.formationStates() + id }
func (k keys) formationStates() string         { return k.under(segFormationStates) }

// formationOutcome holds the status its lease's outcome gave a formation,
// and how the lease closed (storedOutcome). Written by every close of
// the lease (CloseLease, SetGeneration's releases, the sweep); the call's
// retention. Its absence is what Admit compares: no outcome yet.
func (k keys) formationOutcome(id string) string { return k.formationOutcomes() + id }
func (k keys) formationOutcomes() string         { return k.under(segFormationOutcomes) }

// pendingApproval is present, empty, while a formation waits for approval:
// the index PendingApproval lists. Written by CreateFormation and
// UpdateFormation, deleted when the formation leaves pending_approval;
// the formation's retention.
func (k keys) pendingApproval(id string) string { return k.pendingApprovals() + id }
func (k keys) pendingApprovals() string         { return k.under(segPendingApproval) }

// recovery holds, raw, the id of the live recovery of formation id: one
// recovery a formation. Written by CreateFormation of a recovery; the
// recovery's retention.
func (k keys) recovery(id string) string { return k.under(segRecoveries) + id }

// Leases.

// marker is an open lease's marker under its target epoch (storedMarker:
// the lease, and the session dependencies its admission checked): one
// key per admission, whose existence holds the epoch's retirement back.
// Written by Admit, rewritten once if the lease turns uncertain, deleted
// when it is released; no etcd lease. markers is the prefix of an epoch's
// markers, allMarkers of every marker (the sweep and generation changes
// scan it).
func (k keys) marker(epoch, lease string) string { return k.markers(epoch) + lease }
func (k keys) markers(epoch string) string       { return k.allMarkers() + epoch + "/" }
func (k keys) allMarkers() string                { return k.under(segMarkers) }

// epochOfMarker returns the epoch id a marker key sits under.
func (k keys) epochOfMarker(key string) string {
	rest := strings.TrimPrefix(key, k.allMarkers())
	if i := strings.LastIndexByte(rest, '/'); i >= 0 {
		return rest[:i]
	}
	return ""
}

// lease is a lease's index (storedIndex: its epoch and formation, in one
// fixed encoding that a report's compare proves both by). Written by
// Admit with no etcd lease; rewritten at the close, with the retention of
// the outcome.
func (k keys) lease(id string) string { return k.under(segLeases) + id }

// claim holds a lease's claim under its claim id (storedClaim: the claim,
// and the epoch and admission revision it was made for), written once by
// ClaimLease and deleted when the lease is released (kept while it is
// uncertain). claims is the prefix of a lease's claims, of which there is
// at most one, allClaims of every claim. The id is in the key so that a
// report's compare proves the claim is the reporter's without reading it.
func (k keys) claim(lease, claim string) string { return k.claims(lease) + url.PathEscape(claim) }
func (k keys) claims(lease string) string       { return k.allClaims() + lease + "/" }
func (k keys) allClaims() string                { return k.under(segClaims) }

// reissue holds the last dispatch token issued again for an open
// admission (storedReissue). Written by RecordReissue, deleted when the
// lease is released.
func (k keys) reissue(lease string) string { return k.under(segReissues) + lease }

// resolution holds, raw, the operator's signed resolution (a verified
// JWS) of the lease it closed. Written in the close's transaction; the
// outcome's retention.
func (k keys) resolution(lease string) string { return k.under(segResolutions) + lease }

// Session ledgers: a session's keys, its id path-escaped.
func (k keys) session(id string) string { return k.under(segSessions) + url.PathEscape(id) + "/" }

// completed holds, raw, the tool's name once its effect completed in the
// session; failed, once it ran and answered an error. Written by the
// lease's release (releaseOps); kept. sessionCompleted is the prefix of a
// session's completed tools.
func (k keys) completed(session, tool string) string { return k.sessionCompleted(session) + tool }
func (k keys) failed(session, tool string) string    { return k.session(session) + "failed/" + tool }
func (k keys) sessionCompleted(id string) string     { return k.session(id) + "completed/" }

// admitted holds, raw, the tool's name while a lease of it is open in the
// session. Written by Admit, deleted at the release. admittedTool is the
// prefix of the admissions of tool in session, sessionAdmitted of all the
// session's.
func (k keys) admitted(session, tool, lease string) string {
	return k.admittedTool(session, tool) + lease
}
func (k keys) admittedTool(session, tool string) string {
	return k.sessionAdmitted(session) + tool + "/"
}
func (k keys) sessionAdmitted(id string) string { return k.session(id) + "admitted/" }

// generation holds a pool's backend generation, raw and zero-padded to
// 20 digits, so that etcd's byte-wise compare orders generations as
// numbers. Written by SetGeneration; kept.
func (k keys) generation(pool string) string { return k.under(segPools) + pool + "/generation" }

// Certificates.

// certificate holds a compatibility certificate under its source epoch
// and tool (storedCertificate: the signed document, its JWS, signer,
// registration and revocation). Written by RegisterCertificate, rewritten
// once by RevokeCertificate; kept. certificates is the prefix of those of
// tool on source; of every tool on source when tool is empty; of all when
// source is empty.
func (k keys) certificate(source, tool, id string) string { return k.certificates(source, tool) + id }
func (k keys) certificates(source, tool string) string {
	p := k.under(segCertificates)
	if source == "" {
		return p
	}
	if p += source + "/"; tool == "" {
		return p
	}
	return p + tool + "/"
}

// certificateIndex holds, raw, the whole key (prefix included) of
// certificate id.
// Written by RegisterCertificate; kept.
func (k keys) certificateIndex(id string) string { return k.under(segCertificateIDs) + id }

// What only a request knew, for the audit trail.

// note holds who made a change (the actor's credential id) and what it
// made (storedNote): kind "epochs" (drain, retire), "certificates"
// (revocation), "generations" (a pool's generation), under the changed
// subject; written in the change's own transaction, rewritten by the next
// change; kept. Kind "restores" holds, under the restored snapshot's
// revision zero-padded, a restore of the store (storedRestore), written by
// RecordRestore; kept.
func (k keys) note(kind, subject string) string { return k.notes() + kind + "/" + subject }

// The kinds of notes.
const (
	noteEpochs       = "epochs"
	noteCertificates = "certificates"
	noteGenerations  = "generations"
	noteRestores     = "restores"
)

func (k keys) notes() string { return k.under(segNotes) }

// trailCursor holds the revision up to which replica's trail holds every
// event, and when it said so (storedCursor): compaction stops at the
// oldest fresh one. Written by SetTrailCursor, rewritten as the trail
// advances; kept. trailCursors is the prefix of every replica's.
func (k keys) trailCursor(replica string) string { return k.trailCursors() + replica }
func (k keys) trailCursors() string              { return k.under(segTrailCursors) }

// policyEvent holds the last policy event of a replica (storedPolicyEvent:
// a policy set put in force or refused). Written by RecordPolicy,
// rewritten by the next; kept.
func (k keys) policyEvent(replica string) string { return k.under(segPolicyEvents) + replica }

// Keys.

// jwk holds, raw, a published public signing key (a JWK, as authz gives
// it). Written by KeepPublished, bound to an etcd lease that the
// publishing replica keeps alive: it goes a ttl after the replica stops.
// jwks is the prefix of every published key.
func (k keys) jwk(kid string) string { return k.jwks() + kid }
func (k keys) jwks() string          { return k.under(segJWKS) }

// ping is never written: reads of it (count only) ask etcd for its
// revision and prove a member answers for fcd's prefix (Revision, the
// endpoint guard, Exposure).
func (k keys) ping() string { return k.p + segPing }
