package record

import "github.com/fcd-authz/fcd/manifest"

// Snapshot is an immutable, content-addressed catalog: the tools a model
// was shown, each bound to the epoch and descriptor digest it came from.
// Its id is the digest of its tool list, so equal catalogs share an id and
// a changed catalog (a new epoch, a drain) always gets a new one; a stored
// snapshot is never rewritten.
type Snapshot struct {
	ID    string         `json:"id"`
	Tools []SnapshotTool `json:"tools"`
	// Revision is the etcd revision that created the snapshot, set by
	// the create that did.
	Revision int64 `json:"-"`
}

// SnapshotTool is one catalog entry. Name is "server/tool".
type SnapshotTool struct {
	Name             string              `json:"name"`
	Epoch            string              `json:"epoch"`
	DescriptorDigest string              `json:"descriptorDigest"`
	Title            string              `json:"title,omitempty"`
	Summary          string              `json:"summary,omitempty"`
	SideEffects      manifest.SideEffect `json:"sideEffects"`
	RequiresApproval bool                `json:"requiresApproval"`
}

// FullTool is a catalog entry with its complete Tool+ descriptor.
type FullTool struct {
	SnapshotTool
	Descriptor *manifest.Tool `json:"descriptor"`
}
