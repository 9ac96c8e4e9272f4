package policy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
)

// githubManifest decodes the example manifest every realistic input here
// is built from.
func githubManifest(t testing.TB) *manifest.Manifest {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "examples", "github", "manifest-v1.4.json"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

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
	state               lease.State
	args                string
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
		state = lease.StateActive
	}
	ep := &lease.Epoch{
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
	rec := lease.Call{
		ID: "frm-1", Session: "sess-1",
		Principal: lease.Principal{ID: "alice", Attributes: attrs, Host: "agent-host"},
		Snapshot:  "sha256:" + strings.Repeat("5", 64), Tool: mc.Server.Name + "/" + desc.Name,
		DescriptorDigest: descDigest, Arguments: json.RawMessage(args), ArgumentDigest: argDigest,
		Source: lease.Target{
			Epoch: ep.ID, Server: ep.Server, Release: ep.Release, Pool: ep.Pool,
			Artifact: ep.Artifact, ConfigDigest: ep.ConfigDigest,
		},
		Metadata: lease.Metadata{
			Summary: desc.Summary, SideEffects: desc.SideEffects, RequiresApproval: desc.RequiresApproval,
			FailureModes: desc.FailureModes, Dependencies: desc.Dependencies,
		},
		CreatedAt: created, ExpiresAt: created.Add(15 * time.Minute),
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
		Session:   lease.SessionHistory{Session: "sess-1", Completed: completed, Admitted: admitted},
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
