package lease

import (
	"errors"
	"fmt"
)

// Errors returned by the store. Callers match them with errors.Is.
var (
	// ErrUnavailable: etcd did not answer in time or has no quorum. Nothing
	// may be dispatched on this answer.
	ErrUnavailable = errors.New("lease: store unavailable")
	// ErrEpochNotFound: no epoch has this id.
	ErrEpochNotFound = errors.New("lease: epoch not found")
	// ErrSnapshotNotFound: no snapshot has this id.
	ErrSnapshotNotFound = errors.New("lease: snapshot not found")
	// ErrToolNotFound: the snapshot does not list this tool.
	ErrToolNotFound = errors.New("lease: tool not in snapshot")
	// ErrNoActiveEpochs: a snapshot was asked for but no ACTIVE epoch
	// matches.
	ErrNoActiveEpochs = errors.New("lease: no active epochs to snapshot")
	// ErrTooLarge: a record exceeds what etcd accepts in one request.
	ErrTooLarge = errors.New("lease: record too large for the store")
	// ErrCorrupt: a stored record does not decode or fails its digest check.
	ErrCorrupt = errors.New("lease: stored record is corrupt")
)

// StateError reports a lifecycle call on an epoch that is not in the state
// the call needs (drain of a DRAINING epoch, retire of an ACTIVE one).
type StateError struct {
	Epoch string
	State State
	Want  State
}

func (e *StateError) Error() string {
	return fmt.Sprintf("lease: epoch %s is %s, want %s", e.Epoch, e.State, e.Want)
}

// RetireBlockedError reports a retire refused because lease markers still
// exist under the epoch.
type RetireBlockedError struct {
	Epoch     string
	Active    int
	Uncertain int
}

func (e *RetireBlockedError) Error() string {
	return fmt.Sprintf("lease: epoch %s still has %d active and %d uncertain leases", e.Epoch, e.Active, e.Uncertain)
}
