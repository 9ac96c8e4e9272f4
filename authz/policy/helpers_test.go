package policy

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
)

// githubManifest decodes the example manifest every realistic input here
// is built from.
func githubManifest(t testing.TB) *manifest.Manifest {
	t.Helper()
	return githubExample(t, "manifest-v1.4.json")
}

// githubExample decodes a manifest of examples/github.
func githubExample(t testing.TB, name string) *manifest.Manifest {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "examples", "github", name))
	if err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// githubCertificate decodes the example certificate from v1.4 to v1.3.
func githubCertificate(t testing.TB) *manifest.Certificate {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "examples", "github", "certificate-v1.4-to-v1.3.json"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := manifest.DecodeCertificate(data)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// successor describes a candidate successor of a call: the github
// example's v1.3 epoch under the example certificate, as the formation use
// case captures it (formation.successor) and describes it (successor).
type successor struct {
	// unpinned drops the digest of the target's artifact.
	unpinned bool
	// effects, when set, replaces the certificate's modeled effects.
	effects map[string]any
}

// Certificate id and issuer of the example successor.
const (
	successorCertID = "cert-github-v1-4-to-v1-3"
	successorIssuer = "compat-1"
)

// call describes one formed call against the github example.
type call struct {
	// tool is a descriptor name of the manifest.
	tool string
	// effects, when set, overrides the descriptor's side effects.
	effects manifest.SideEffect
	// requires, when set, replaces the descriptor's requires list.
	requires []string
	// admin puts the principal in group repo-admins.
	admin bool
	// attrs, when set, replaces the principal attributes entirely.
	attrs               map[string]any
	completed, admitted []string
	unpinned            bool
	state               record.State
	args                string
	// successor, when set, gives the call a candidate successor.
	successor *successor
}

// githubInput builds the Input authz builds for c: the descriptor through
// NewToolInput, the epoch through NewEpochInput, and a lease.Call like the
// formation use case stores.
func githubInput(t testing.TB, m *manifest.Manifest, c call) *Input {
	t.Helper()
	mc := *m
	if c.unpinned {
		mc.Artifact.Digest = ""
	}
	d := mc.Tool(c.tool)
	if d == nil {
		t.Fatalf("no tool %q in the example manifest", c.tool)
	}
	desc := *d
	if c.effects != "" {
		desc.SideEffects = c.effects
		desc.RequiresApproval = c.effects.Mutating()
	}
	if c.requires != nil {
		deps := manifest.Dependencies{}
		if desc.Dependencies != nil {
			deps = *desc.Dependencies
		}
		deps.Requires = c.requires
		desc.Dependencies = &deps
	}
	epochID, err := mc.EpochID()
	if err != nil {
		t.Fatal(err)
	}
	state := c.state
	if state == "" {
		state = record.StateActive
	}
	ep := &record.Epoch{
		ID: epochID, Server: mc.Server.Name, Release: mc.Server.Release, Pool: mc.Pool,
		Artifact: mc.Artifact, ConfigDigest: mc.Config.Digest, SignerKeyID: "registrar-1",
		State: state, Manifest: &mc,
	}
	descDigest, err := desc.Digest()
	if err != nil {
		t.Fatal(err)
	}
	args := c.args
	if args == "" {
		args = `{"owner":"octo-org","repo":"payroll-exports"}`
	}
	argDigest, err := manifest.Digest(map[string]any{"tool": mc.Server.Name + "/" + desc.Name, "arguments": json.RawMessage(args)})
	if err != nil {
		t.Fatal(err)
	}
	attrs := map[string]any{"groups": []any{"developers"}}
	if c.admin {
		attrs["groups"] = []any{"developers", "repo-admins"}
	}
	if c.attrs != nil {
		attrs = c.attrs
	}
	created := time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
	rec := record.Call{
		ID: "frm-1", Session: "sess-1",
		Principal: record.Principal{ID: "alice", Attributes: attrs, Host: "agent-host"},
		Snapshot:  "sha256:" + strings.Repeat("5", 64), Tool: mc.Server.Name + "/" + desc.Name,
		DescriptorDigest: descDigest, Arguments: json.RawMessage(args), ArgumentDigest: argDigest,
		Source: record.Target{
			Epoch: ep.ID, Server: ep.Server, Release: ep.Release, Pool: ep.Pool,
			Artifact: ep.Artifact, ConfigDigest: ep.ConfigDigest,
		},
		Metadata: record.Metadata{
			Summary: desc.Summary, SideEffects: desc.SideEffects, RequiresApproval: desc.RequiresApproval,
			FailureModes: desc.FailureModes, Dependencies: desc.Dependencies,
		},
		CreatedAt: created, ExpiresAt: created.Add(15 * time.Minute),
	}
	var succ *SuccessorInput
	if c.successor != nil {
		rec.Successor, succ = githubSuccessor(t, ep.ID, *c.successor)
	}
	digest, err := rec.Digest()
	if err != nil {
		t.Fatal(err)
	}
	completed, admitted := c.completed, c.admitted
	if completed == nil {
		completed = []string{}
	}
	if admitted == nil {
		admitted = []string{}
	}
	return &Input{
		Formation: FormationInput{Call: rec, Digest: digest},
		Tool:      NewToolInput(mc.Server.Name, &desc),
		Epoch:     NewEpochInput(ep),
		Session:   record.SessionHistory{Session: "sess-1", Completed: completed, Admitted: admitted},
		Successor: succ,
	}
}

// githubDocument is the decision document of call c of m, failing t if
// NewDocument refuses it.
func githubDocument(t testing.TB, m *manifest.Manifest, c call) *Document {
	t.Helper()
	doc, err := NewDocument(githubInput(t, m, c))
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

// githubSuccessor builds the record's successor and the policy input's
// successor member for a call formed on the epoch source.
func githubSuccessor(t testing.TB, source string, s successor) (*record.Successor, *SuccessorInput) {
	t.Helper()
	mt := githubExample(t, "manifest-v1.3.json")
	if s.unpinned {
		mt.Artifact.Digest = ""
	}
	id, err := mt.EpochID()
	if err != nil {
		t.Fatal(err)
	}
	target := &record.Epoch{
		ID: id, Server: mt.Server.Name, Release: mt.Server.Release, Pool: mt.Pool,
		Artifact: mt.Artifact, ConfigDigest: mt.Config.Digest, SignerKeyID: "registrar-1",
		State: record.StateActive, Manifest: mt,
	}
	cert := githubCertificate(t)
	cert.Source, cert.Target = source, id
	if s.effects != nil {
		cert.Effects = s.effects
	}
	rec := &record.Successor{
		Target: record.Target{
			Epoch: target.ID, Server: target.Server, Release: target.Release, Pool: target.Pool,
			Artifact: target.Artifact, ConfigDigest: target.ConfigDigest,
		},
		Certificate: successorCertID, Issuer: successorIssuer, Effects: maps.Clone(cert.Effects),
		Profile: cert.Profile, ExpiresAt: cert.ExpiresAt,
	}
	return rec, &SuccessorInput{
		Epoch:       NewEpochInput(target),
		Certificate: CertificateInput{ID: successorCertID, Issuer: successorIssuer, Certificate: *cert},
	}
}

// sorted returns a sorted copy.
func sorted(ss []string) []string {
	out := slices.Clone(ss)
	slices.Sort(out)
	if out == nil {
		out = []string{}
	}
	return out
}
