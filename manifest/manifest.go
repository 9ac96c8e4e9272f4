package manifest

import (
	"bytes"
	"fmt"
	"regexp"

	"github.com/fcd-authz/fcd/internal/public"
)

// Manifest is a registration manifest: one release of one MCP server, with
// every input that can change what a call to it means. The epoch id is the
// digest of its canonical form ([Manifest.EpochID]), so changing any covered
// field, even for the same image, makes a new epoch.
type Manifest struct {
	// Server names the MCP server and the release this manifest registers.
	Server Server `json:"server"`
	// Pool is the backend pool that serves this epoch; dispatch tokens are
	// addressed to it.
	Pool string `json:"pool"`
	// Artifact identifies the code that runs. A digest-pinned artifact
	// (Digest set) is what policies normally require.
	Artifact Artifact `json:"artifact"`
	// Deployment identifies how the artifact is deployed.
	Deployment Deployment `json:"deployment"`
	// Config identifies the configuration the handler reads.
	Config Config `json:"config"`
	// FeatureFlags identifies an immutable snapshot of feature flags.
	FeatureFlags *FeatureFlags `json:"featureFlags,omitempty"`
	// Downstream lists the services the handler calls, by immutable revision.
	Downstream []Downstream `json:"downstream,omitempty"`
	// Secrets lists the secrets the handler reads, by version, never value.
	Secrets []Secret `json:"secrets,omitempty"`
	// Policy identifies the server-side authorization policy in force.
	Policy *PolicyRef `json:"policy,omitempty"`
	// Tools are the Tool+ descriptors this release serves.
	Tools []Tool `json:"tools"`
}

// Server names an MCP server and one of its releases.
type Server struct {
	Name    string `json:"name"`
	Release string `json:"release"`
}

// Artifact identifies the deployed code: an image reference and, when
// pinned, its content digest.
type Artifact struct {
	Image  string `json:"image,omitempty"`
	Digest string `json:"digest,omitempty"`
}

// Pinned reports whether the artifact is identified by a content digest.
func (a Artifact) Pinned() bool { return ValidDigest(a.Digest) }

// ID is what names the artifact to a backend (a dispatch token's
// fcd_artifact): its content digest when it has one, else its image
// reference.
func (a Artifact) ID() string {
	if a.Digest != "" {
		return a.Digest
	}
	return a.Image
}

// Deployment identifies a deployment of the artifact.
type Deployment struct {
	Platform  string `json:"platform,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	Revision  string `json:"revision,omitempty"`
}

// Config identifies the handler's configuration by digest; Values may show
// the settings that matter for review.
type Config struct {
	Digest string         `json:"digest"`
	Values map[string]any `json:"values,omitempty"`
}

// FeatureFlags identifies an immutable, signed snapshot of feature flags.
type FeatureFlags struct {
	Snapshot string          `json:"snapshot"`
	Values   map[string]bool `json:"values,omitempty"`
}

// Downstream is a service the handler calls, bound by an immutable revision
// or contract version.
type Downstream struct {
	Service  string `json:"service"`
	Revision string `json:"revision"`
}

// Secret is a secret the handler reads, named by its immutable version.
// Value exists only so that a manifest carrying a secret value decodes and
// lint can refuse it with a clear finding (rule secret-value).
type Secret struct {
	Name    string `json:"name"`
	Version string `json:"version,omitempty"`
	Value   string `json:"value,omitempty"`
}

// PolicyRef identifies a policy by id and digest.
type PolicyRef struct {
	ID     string `json:"id"`
	Digest string `json:"digest,omitempty"`
}

// EpochID returns the epoch id of the manifest: the digest of its
// canonical JSON.
func (m *Manifest) EpochID() (string, error) { return Digest(m) }

// Tool returns the descriptor named name, or nil.
func (m *Manifest) Tool(name string) *Tool {
	for i := range m.Tools {
		if m.Tools[i].Name == name {
			return &m.Tools[i]
		}
	}
	return nil
}

// ErrMalformed is returned for a document that is not well-formed: invalid
// JSON, an unknown or duplicated member, or trailing data.
var ErrMalformed = public.New("manifest", "malformed document")

// ErrInvalid is returned for a well-formed document that violates the
// structure fcd requires (a missing name, an unknown side effect, ...).
var ErrInvalid = public.New("manifest", "invalid document")

// DecodeStrict decodes a JSON document into v, refusing unknown members,
// duplicate members, members that only match a field case-insensitively,
// and anything after the document. A signed document must mean exactly
// what its signer saw. A failure wraps [ErrMalformed] and a *[DecodeError]
// naming the member at fault.
func DecodeStrict(data []byte, v any) error {
	if err := Unmarshal(bytes.TrimSpace(data), v); err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return nil
}

// Decode strictly decodes and structurally validates a manifest.
func Decode(data []byte) (*Manifest, error) {
	var m Manifest
	if err := DecodeStrict(data, &m); err != nil {
		return nil, err
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

var (
	serverNamePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	toolNamePattern   = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
)

// Validate checks the structure of the manifest: required fields, name
// syntax, enumerations and digest formats. Judgements about how well the
// tools are described belong to [Lint], not here.
func (m *Manifest) Validate() error {
	var errs []error
	bad := func(path, format string, args ...any) {
		errs = append(errs, &DecodeError{Pointer: path, Offset: -1, Reason: fmt.Sprintf(format, args...)})
	}
	if !serverNamePattern.MatchString(m.Server.Name) {
		bad("/server/name", "must match %s", serverNamePattern)
	}
	if m.Server.Release == "" {
		bad("/server/release", "is required")
	}
	if m.Pool == "" {
		bad("/pool", "is required")
	}
	if m.Artifact.Image == "" && m.Artifact.Digest == "" {
		bad("/artifact", "needs an image or a digest")
	}
	if m.Artifact.Digest != "" && !ValidDigest(m.Artifact.Digest) {
		bad("/artifact/digest", "must be sha256:<64 hex>")
	}
	if m.Deployment.Name == "" {
		bad("/deployment/name", "is required")
	}
	if !ValidDigest(m.Config.Digest) {
		bad("/config/digest", "must be sha256:<64 hex>")
	}
	if m.FeatureFlags != nil && m.FeatureFlags.Snapshot == "" {
		bad("/featureFlags/snapshot", "is required")
	}
	for i, d := range m.Downstream {
		if d.Service == "" || d.Revision == "" {
			bad(fmt.Sprintf("/downstream/%d", i), "needs service and revision")
		}
	}
	for i, s := range m.Secrets {
		if s.Name == "" {
			bad(fmt.Sprintf("/secrets/%d/name", i), "is required")
		}
	}
	if m.Policy != nil && m.Policy.ID == "" {
		bad("/policy/id", "is required")
	}
	if len(m.Tools) == 0 {
		bad("/tools", "must list at least one tool")
	}
	for i := range m.Tools {
		t := &m.Tools[i]
		p := fmt.Sprintf("/tools/%d", i)
		if !toolNamePattern.MatchString(t.Name) {
			bad(p+"/name", "must match %s", toolNamePattern)
		}
		if !t.SideEffects.Valid() {
			bad(p+"/sideEffects", "must be one of none, read, write, delete")
		}
		if s := bytes.TrimSpace(t.InputSchema); len(s) == 0 || s[0] != '{' {
			bad(p+"/inputSchema", "must be a JSON object")
		}
		for j, f := range t.FailureModes {
			if f.Error == "" {
				bad(fmt.Sprintf("%s/failureModes/%d/error", p, j), "is required")
			}
			if f.Recovery != "" && !f.Recovery.Valid() {
				bad(fmt.Sprintf("%s/failureModes/%d/recovery", p, j), "must be one of retry, fallback, prompt_user, abort")
			}
		}
	}
	if len(errs) > 0 {
		return invalid(errs)
	}
	return nil
}
