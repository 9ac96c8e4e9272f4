package record

import (
	"time"

	"github.com/fcd-authz/fcd/manifest"
)

// State is an epoch's lifecycle state: ACTIVE → DRAINING → STALE.
type State string

// Epoch lifecycle states. Only ACTIVE epochs admit calls.
const (
	StateActive   State = "ACTIVE"
	StateDraining State = "DRAINING"
	StateStale    State = "STALE"
)

// Valid reports whether s is one of the lifecycle states.
func (s State) Valid() bool { return s == StateActive || s == StateDraining || s == StateStale }

// Epoch is a registered manifest with its lifecycle state and the number
// of lease markers under it.
type Epoch struct {
	ID           string            `json:"id"`
	Server       string            `json:"server"`
	Release      string            `json:"release"`
	Pool         string            `json:"pool"`
	Artifact     manifest.Artifact `json:"artifact"`
	ConfigDigest string            `json:"configDigest"`
	SignerKeyID  string            `json:"signerKid"`
	RegisteredAt time.Time         `json:"registeredAt"`
	Tools        []EpochTool       `json:"tools"`

	State           State `json:"state"`
	ActiveLeases    int   `json:"activeLeases"`
	UncertainLeases int   `json:"uncertainLeases"`

	// Manifest and JWS are the registered document; filled by GetEpoch,
	// left empty by ListEpochs.
	Manifest *manifest.Manifest `json:"manifest,omitempty"`
	JWS      string             `json:"jws,omitempty"`

	// StateRevision is the etcd revision of the last lifecycle change (the
	// drain or retire that set State); filled by GetEpoch.
	StateRevision int64 `json:"-"`

	// Revision is the etcd revision that created the epoch; it orders
	// registrations.
	Revision int64 `json:"-"`
}

// Target is where a call admitted to this epoch runs.
func (e *Epoch) Target() Target {
	return Target{
		Epoch: e.ID, Server: e.Server, Release: e.Release, Pool: e.Pool,
		Artifact: e.Artifact, ConfigDigest: e.ConfigDigest,
	}
}

// EpochTool names one tool of an epoch with its descriptor digest.
type EpochTool struct {
	Name        string              `json:"name"`
	Digest      string              `json:"digest"`
	SideEffects manifest.SideEffect `json:"sideEffects"`
}

// EpochFilter selects epochs in ListEpochs; zero fields match all.
type EpochFilter struct {
	Server string
	State  State
}
