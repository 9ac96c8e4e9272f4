package policy

import (
	"github.com/cedar-policy/cedar-go"
	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
)

// Input is the one document both engines decide over. Rego sees it as
// `input`; the Cedar mapping (see cedar.go) is derived from it. Its JSON
// form is documented in policies/README.md; changing it is a breaking
// change for every operator's policies.
type Input struct {
	// Phase says which decision this is: "formation" (the first decision)
	// or "admission" (the re-check when the policy set changed since).
	Phase Phase `json:"phase"`
	// Formation is the complete formation record being decided: the call
	// (session, principal, snapshot, tool, descriptor digest, arguments
	// and their digest, source and successor targets, MCP+ metadata,
	// creation and expiry) and its digest.
	Formation FormationInput `json:"formation"`
	// Tool is the full Tool+ descriptor of the formed tool, as registered.
	Tool ToolInput `json:"tool"`
	// Epoch describes the source epoch: its lifecycle state and what its
	// signed manifest binds.
	Epoch EpochInput `json:"epoch"`
	// Session is the session's history at the time of the decision.
	Session record.SessionHistory `json:"session"`
	// Successor describes the candidate successor (formation.successor)
	// in full: the target epoch and the certificate that covers the call.
	// Present exactly when formation.successor is, naming the same epoch
	// and certificate ([NewDocument] refuses an input where they disagree);
	// policies refuse it with Rego deny_successor or a Cedar forbid on
	// Action::"substitute".
	Successor *SuccessorInput `json:"successor,omitempty"`
}

// SuccessorInput is a candidate successor as policies see it.
type SuccessorInput struct {
	// Epoch is the target epoch, described like the source.
	Epoch EpochInput `json:"epoch"`
	// Certificate is the compatibility certificate that covers the call.
	Certificate CertificateInput `json:"certificate"`
}

// CertificateInput is a compatibility certificate as policies see it.
type CertificateInput struct {
	ID string `json:"id"`
	// Issuer is the kid of the key that signed it.
	Issuer string `json:"issuer"`
	manifest.Certificate
}

// Phase names the point in a call's life at which policies decide.
type Phase string

// Phases of decision.
const (
	PhaseFormation Phase = "formation"
	PhaseAdmission Phase = "admission"
)

// FormationInput is the formation record as policies see it.
type FormationInput struct {
	record.Call
	Digest string `json:"digest"`

	// metadata and source are the call's Metadata and Source converted,
	// when an [InputCache] made the input (the same caveat as
	// ToolInput's value).
	metadata, source ast.Value
}

// ToolInput is the Tool+ descriptor, its server, its qualified name and
// its dependencies qualified as "server/tool" so policies can compare them
// with the session history directly.
type ToolInput struct {
	manifest.Tool
	Server string `json:"server"`
	// QualifiedName is "server/tool".
	QualifiedName string `json:"qualifiedName"`
	// Requires, ProducesInputFor and ExclusiveWith are the dependencies,
	// qualified; empty lists, never null.
	Requires         []string `json:"requires"`
	ProducesInputFor []string `json:"producesInputFor"`
	ExclusiveWith    []string `json:"exclusiveWith"`

	// value is this input converted, when an [InputCache] made it; the
	// document takes it as is, so an input from the cache must not be
	// modified (build one with NewToolInput/NewEpochInput to edit it).
	value ast.Value
	// cedar is the Cedar form of the same (the tool entity's attributes,
	// the epoch's context record), made with value.
	cedar *cedar.Record
}

// EpochInput is the source epoch as policies see it.
type EpochInput struct {
	ID       string            `json:"id"`
	Server   string            `json:"server"`
	Release  string            `json:"release"`
	Pool     string            `json:"pool"`
	State    record.State      `json:"state"`
	Artifact manifest.Artifact `json:"artifact"`
	// ArtifactPinned is true when the artifact is identified by a digest.
	ArtifactPinned bool   `json:"artifactPinned"`
	ConfigDigest   string `json:"configDigest"`
	// Config is the configuration the manifest shows for review (may be
	// empty); its digest is ConfigDigest.
	Config       map[string]any         `json:"config"`
	Deployment   manifest.Deployment    `json:"deployment"`
	FeatureFlags *manifest.FeatureFlags `json:"featureFlags,omitempty"`
	Downstream   []manifest.Downstream  `json:"downstream"`
	// Secrets are names and versions only; a value never reaches a policy.
	Secrets   []SecretInput       `json:"secrets"`
	Policy    *manifest.PolicyRef `json:"policy,omitempty"`
	SignerKid string              `json:"signerKid"`

	// value is this input converted, when an [InputCache] made it; the
	// document takes it as is, so an input from the cache must not be
	// modified (build one with NewToolInput/NewEpochInput to edit it).
	value ast.Value
	// cedar is the Cedar form of the same (the tool entity's attributes,
	// the epoch's context record), made with value.
	cedar *cedar.Record
}

// SecretInput names a secret by version.
type SecretInput struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// NewToolInput qualifies a descriptor of server for policy input.
func NewToolInput(server string, t *manifest.Tool) ToolInput {
	q := func(names []string) []string {
		out := make([]string, 0, len(names))
		for _, n := range names {
			out = append(out, server+"/"+n)
		}
		return out
	}
	ti := ToolInput{Tool: *t, Server: server, QualifiedName: server + "/" + t.Name,
		Requires: []string{}, ProducesInputFor: []string{}, ExclusiveWith: []string{}}
	if d := t.Dependencies; d != nil {
		ti.Requires, ti.ProducesInputFor, ti.ExclusiveWith = q(d.Requires), q(d.ProducesInputFor), q(d.ExclusiveWith)
	}
	return ti
}

// NewEpochInput describes an epoch for policy input.
func NewEpochInput(e *record.Epoch) EpochInput {
	in := EpochInput{
		ID: e.ID, Server: e.Server, Release: e.Release, Pool: e.Pool, State: e.State,
		Artifact: e.Artifact, ArtifactPinned: e.Artifact.Pinned(), ConfigDigest: e.ConfigDigest,
		SignerKid: e.SignerKeyID, Downstream: []manifest.Downstream{}, Secrets: []SecretInput{}, Config: map[string]any{},
	}
	if m := e.Manifest; m != nil {
		in.FeatureFlags, in.Policy, in.Deployment = m.FeatureFlags, m.Policy, m.Deployment
		if m.Config.Values != nil {
			in.Config = m.Config.Values
		}
		in.Downstream = append(in.Downstream, m.Downstream...)
		for _, s := range m.Secrets {
			in.Secrets = append(in.Secrets, SecretInput{Name: s.Name, Version: s.Version})
		}
	}
	return in
}
