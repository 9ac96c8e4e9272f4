package record

import (
	"fmt"

	"github.com/fcd-authz/fcd/internal/public"
)

// Errors of the store's records. Callers match them with errors.Is. Each
// carries its public sentence (the text without "lease: ") for the HTTP
// edge to show a client; the typed errors below have a Public method too.
var (
	// ErrUnavailable: etcd did not answer in time or has no quorum. Nothing
	// may be dispatched on this answer.
	ErrUnavailable = public.New("lease", "store unavailable")
	// ErrEpochNotFound: no epoch has this id.
	ErrEpochNotFound = public.New("lease", "epoch not found")
	// ErrSnapshotNotFound: no snapshot has this id.
	ErrSnapshotNotFound = public.New("lease", "snapshot not found")
	// ErrToolNotFound: the snapshot does not list this tool.
	ErrToolNotFound = public.New("lease", "tool not in snapshot")
	// ErrNoActiveEpochs: a snapshot was asked for but no ACTIVE epoch
	// matches.
	ErrNoActiveEpochs = public.New("lease", "no active epochs to snapshot")
	// ErrTooLarge: a record exceeds what etcd accepts in one request.
	ErrTooLarge = public.New("lease", "record too large for the store")
	// ErrCorrupt: a stored record does not decode or fails its digest check.
	ErrCorrupt = public.New("lease", "stored record is corrupt")
)

// Errors etcd answers by their type (rpctypes), apart from ErrUnavailable:
// each tells the operator something different to do, and none of them is
// cured by retrying at once.
var (
	// ErrStoreFull: etcd refused a write because its database reached the
	// backend quota (the NOSPACE alarm is raised). The write was not
	// applied. Every write fails until an operator frees space and
	// disarms the alarm (docs/operations.md); reads still work.
	ErrStoreFull = public.New("lease", "the store is full (etcd NOSPACE alarm)")
	// ErrStoreDenied: etcd refused fcd's credentials (authentication
	// failed, or the user or role lacks permission on fcd's prefix).
	// Nothing was read or written; it is a configuration error, and fcd
	// fails closed until the operator fixes the credentials or the role.
	ErrStoreDenied = public.New("lease", "the store refused fcd's credentials")
	// ErrStoreCorrupt: etcd raised the CORRUPT alarm (a member's data
	// differs from the others') and refuses requests. Nothing may be
	// trusted or dispatched until an operator restores the member.
	ErrStoreCorrupt = public.New("lease", "the store reports corruption (etcd CORRUPT alarm)")
	// ErrCompacted: a read or watch asked for a revision etcd has already
	// compacted away. It comes wrapped together with ErrUnavailable, so a
	// caller that only knows to retry does (a retry reads at the current
	// revision); one that follows history must resume differently.
	ErrCompacted = public.New("lease", "the revision asked for was compacted")
)

// Errors of admission and the lease lifecycle.
var (
	// ErrLeaseNotFound: no lease has this id.
	ErrLeaseNotFound = public.New("lease", "lease not found")
	// ErrLeaseClosed: the lease was already completed or released.
	ErrLeaseClosed = public.New("lease", "lease already closed")
	// ErrLeaseUncertain: the lease's outcome is unknown; only an operator's
	// resolution or a newer backend generation releases it.
	ErrLeaseUncertain = public.New("lease", "lease outcome is uncertain")
	// ErrLeaseNotUncertain: a resolution for a lease that is not uncertain.
	ErrLeaseNotUncertain = public.New("lease", "lease is not uncertain")
	// ErrStaleGeneration: a generation not newer than the recorded one.
	ErrStaleGeneration = public.New("lease", "generation is not newer than the recorded one")
)

// Errors of claims.
var (
	// ErrLeaseClaimed: another call claimed the lease first (a replay on
	// another instance, after a restart or a re-admission), or an outcome
	// was reported under another claim than the lease's.
	ErrLeaseClaimed = public.New("lease", "lease already claimed by another call")
	// ErrLeaseNotClaimed: an outcome other than rejected was reported for
	// a lease no backend claimed, or under a claim the lease does not
	// have: no effect can have run under it.
	ErrLeaseNotClaimed = public.New("lease", "lease was not claimed")
)

// Errors of certificates.
var (
	// ErrCertificateNotFound: no certificate has this id.
	ErrCertificateNotFound = public.New("lease", "certificate not found")
	// ErrCertificateRevoked: the certificate was revoked already.
	ErrCertificateRevoked = public.New("lease", "certificate already revoked")
)

// Errors of formations.
var (
	// ErrFormationNotFound: no formation has this id (or it was collected).
	ErrFormationNotFound = public.New("lease", "formation not found")
	// ErrRecoveryExists: the formation already has a live recovery (one
	// at a time: recover that one instead, once it ended).
	ErrRecoveryExists = public.New("lease", "the formation already has a live recovery")
	// ErrConflict: a compare-and-swap update lost to concurrent writers too
	// many times in a row.
	ErrConflict = public.New("lease", "too many concurrent updates")
)

// StateError reports a lifecycle call on an epoch that is not in the state
// the call needs (drain of a DRAINING epoch, retire of an ACTIVE one).
type StateError struct {
	Epoch string
	State State
	Want  State
}

func (e *StateError) Error() string { return "lease: " + e.Public() }

// Public is the sentence a client reads: the epoch, its state and the one
// wanted.
func (e *StateError) Public() string {
	return fmt.Sprintf("epoch %s is %s, want %s", e.Epoch, e.State, e.Want)
}

// RetireBlockedError reports a retire refused because lease markers still
// exist under the epoch.
type RetireBlockedError struct {
	Epoch     string
	Active    int
	Uncertain int
}

func (e *RetireBlockedError) Error() string { return "lease: " + e.Public() }

// Public is the sentence a client reads: the leases left under the epoch.
func (e *RetireBlockedError) Public() string {
	return fmt.Sprintf("epoch %s still has %d active and %d uncertain leases", e.Epoch, e.Active, e.Uncertain)
}

// DependencyError reports an admission refused by the session ledger: a
// required tool has not completed, or an exclusive tool is admitted or
// completed in the session.
type DependencyError struct {
	Tool string
	// Exclusive is false for an unmet requires, true for an exclusive
	// conflict.
	Exclusive bool
}

func (e *DependencyError) Error() string { return "lease: " + e.Public() }

// Public is the sentence a client reads: which tool, and why.
func (e *DependencyError) Public() string {
	if e.Exclusive {
		return fmt.Sprintf("%s is exclusive with this tool and was already admitted or ran in the session", e.Tool)
	}
	return fmt.Sprintf("required tool %s has not completed with a result in the session", e.Tool)
}
