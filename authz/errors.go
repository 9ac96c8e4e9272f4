package authz

import (
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
)

// Errors of the use cases, re-exported from the layers that detect them so
// that transports match them with errors.Is/As through this package alone.
var (
	ErrUnavailable      = lease.ErrUnavailable
	ErrEpochNotFound    = lease.ErrEpochNotFound
	ErrSnapshotNotFound = lease.ErrSnapshotNotFound
	ErrToolNotFound     = lease.ErrToolNotFound
	ErrNoActiveEpochs   = lease.ErrNoActiveEpochs
	ErrTooLarge         = lease.ErrTooLarge
	ErrCorrupt          = lease.ErrCorrupt

	ErrMalformed       = manifest.ErrMalformed
	ErrInvalid         = manifest.ErrInvalid
	ErrBadSignature    = manifest.ErrBadSignature
	ErrUntrustedSigner = manifest.ErrUntrustedSigner
)

// Typed errors carrying details a transport shows to the caller.
type (
	// StateError: a lifecycle call on an epoch in the wrong state.
	StateError = lease.StateError
	// RetireBlockedError: lease markers still exist under the epoch.
	RetireBlockedError = lease.RetireBlockedError
	// LintError: the manifest has MCP+ lint errors.
	LintError = manifest.LintError
)
