package policy

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/util"
)

// TestDocumentMatchesOPAConversion checks that the streaming conversion
// gives exactly the value OPA's own conversion (rego.EvalInput: JSON round
// trip with UseNumber, then ast.InterfaceToValue) gives, so policies see
// the same input as under `opa eval`.
func TestDocumentMatchesOPAConversion(t *testing.T) {
	m := githubManifest(t)
	inputs := []*Input{
		githubInput(t, m, call{tool: "create_repository", args: `{"name":"x","n":1.5,"big":12345678901234567890,"e":1e3,"s":"\u00e9\ud83d\ude00","nested":{"a":[1,null,{"b":false}]}}`}),
		githubInput(t, m, call{tool: "delete_repository", admin: true, unpinned: true, completed: []string{"github/get_repository"}}),
		githubInput(t, m, call{tool: "create_repository", successor: &successor{effects: map[string]any{"visibility": "private", "r": 0.5}}}),
		{},
	}
	for i, in := range inputs {
		doc, err := NewDocument(in)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		var x any
		if err := util.UnmarshalJSON(raw, &x); err != nil {
			t.Fatal(err)
		}
		want, err := ast.InterfaceToValue(x)
		if err != nil {
			t.Fatal(err)
		}
		if doc.value.Compare(want) != 0 {
			t.Errorf("input %d: document differs from OPA's conversion:\n got %v\nwant %v", i, doc.value, want)
		}
	}
}

func TestNewDocumentRefuses(t *testing.T) {
	m := githubManifest(t)
	tests := []struct {
		note string
		edit func(in *Input)
	}{
		{"duplicate argument members", func(in *Input) { in.Formation.Arguments = []byte(`{"a":1,"a":2}`) }},
		{"invalid arguments", func(in *Input) { in.Formation.Arguments = []byte(`{"a":`) }},
		{"side effects disagree", func(in *Input) { in.Tool.SideEffects = "delete" }},
		{"successor without formation.successor", func(in *Input) { in.Formation.Successor = nil }},
		{"formation.successor without successor", func(in *Input) { in.Successor = nil }},
		{"successor epochs disagree", func(in *Input) { in.Formation.Successor.Epoch = in.Formation.Source.Epoch }},
		{"successor certificates disagree", func(in *Input) { in.Formation.Successor.Certificate = "cert-other" }},
	}
	if _, err := NewDocument(githubInput(t, m, call{tool: "get_repository", successor: &successor{}})); err != nil {
		t.Fatalf("a consistent input with a successor: %v", err)
	}
	for _, tc := range tests {
		t.Run(tc.note, func(t *testing.T) {
			in := githubInput(t, m, call{tool: "get_repository", successor: &successor{}})
			tc.edit(in)
			if _, err := NewDocument(in); !errors.Is(err, ErrInvalidInput) {
				t.Fatalf("NewDocument = %v, want ErrInvalidInput", err)
			}
		})
	}
	if _, err := NewDocument(nil); !errors.Is(err, ErrInvalidInput) {
		t.Errorf("NewDocument(nil) = %v", err)
	}
	for _, raw := range []string{`{} {}`, `{"a":1,"a":2}`, `[1,`, "\"\xff\""} {
		if _, err := astFromJSON([]byte(raw)); err == nil {
			t.Errorf("astFromJSON(%q) succeeded", raw)
		}
	}
}

func TestDecodeInputIsStrict(t *testing.T) {
	if _, err := DecodeInput([]byte(`{"formation": {"principal": {"id": "a"}}, "tool": {"sideEffects": "read"}}`)); err != nil {
		t.Fatalf("a partial input: %v", err)
	}
	for _, raw := range []string{`{"tool": {"sideEfects": "read"}}`, `{"formation": {}, "formation": {}}`, `{} {}`} {
		if _, err := DecodeInput([]byte(raw)); !errors.Is(err, ErrInvalidInput) || !strings.Contains(err.Error(), "malformed") {
			t.Errorf("DecodeInput(%s) = %v", raw, err)
		}
	}
}

// TestCachedDocumentMatches: a document made with the tool and epoch an
// InputCache converted once is the document of the same input converted
// whole; the cache converts each descriptor (by digest and server) and
// each epoch (by id and state) once, and a new state is a new entry.
func TestCachedDocumentMatches(t *testing.T) {
	m := githubManifest(t)
	inputs := []*Input{
		githubInput(t, m, call{tool: "create_repository", args: `{"name":"x","n":1.5}`}),
		githubInput(t, m, call{tool: "delete_repository", admin: true, unpinned: true, completed: []string{"github/get_repository"}}),
		githubInput(t, m, call{tool: "create_repository", successor: &successor{effects: map[string]any{"visibility": "private"}}}),
		githubInput(t, m, call{tool: "create_repository", state: record.StateDraining}),
	}
	var cache InputCache
	for i, in := range inputs {
		whole, err := NewDocument(in)
		if err != nil {
			t.Fatal(err)
		}
		desc := in.Tool.Tool
		ep := &record.Epoch{
			ID: in.Epoch.ID, Server: in.Epoch.Server, Release: in.Epoch.Release, Pool: in.Epoch.Pool,
			State: in.Epoch.State, Artifact: in.Epoch.Artifact, ConfigDigest: in.Epoch.ConfigDigest,
			SignerKeyID: in.Epoch.SignerKid, Manifest: epochManifest(t, m, in),
		}
		cached := *in
		cached.Tool = cache.Tool(in.Formation.DescriptorDigest, in.Tool.Server, &desc)
		cached.Epoch = cache.Epoch(ep)
		cached.Formation = cache.Formation(in.Formation.Call, in.Formation.Digest)
		if cached.Tool.value == nil || cached.Epoch.value == nil || cached.Formation.metadata == nil || cached.Formation.source == nil {
			t.Fatalf("input %d: the cache converted nothing", i)
		}
		if again := cache.Tool(in.Formation.DescriptorDigest, in.Tool.Server, &desc); again.value != cached.Tool.value {
			t.Errorf("input %d: the descriptor was converted twice", i)
		}
		if again := cache.Epoch(ep); again.value != cached.Epoch.value {
			t.Errorf("input %d: the epoch was converted twice", i)
		}
		doc, err := NewDocument(&cached)
		if err != nil {
			t.Fatal(err)
		}
		if doc.value.Compare(whole.value) != 0 {
			t.Errorf("input %d: the cached document differs:\n got %v\nwant %v", i, doc.value, whole.value)
		}
		// Cedar's request from the cached parts is the one made anew.
		if cached.Tool.cedar == nil || !cached.Tool.cedar.Equal(cedarToolAttributes(&in.Tool)) {
			t.Errorf("input %d: the cached Cedar tool differs", i)
		}
		if cached.Epoch.cedar == nil || !cached.Epoch.cedar.Equal(cedarEpoch(&in.Epoch)) {
			t.Errorf("input %d: the cached Cedar epoch differs", i)
		}
	}
	if cache.epochs.Len() != 3 { // ACTIVE pinned, ACTIVE unpinned, DRAINING
		t.Errorf("%d epochs cached, want 3 (one per id and state)", cache.epochs.Len())
	}

	// A call whose metadata or source differs from what the cache holds
	// under its key is converted as it is, never as the cached part.
	in := inputs[0]
	first := cache.Formation(in.Formation.Call, in.Formation.Digest)
	for _, change := range []func(c *record.Call){
		func(c *record.Call) { c.Metadata.Summary = "another summary" },
		func(c *record.Call) { c.Metadata.RequiresApproval = !c.Metadata.RequiresApproval },
		func(c *record.Call) { c.Source.Pool = "elsewhere" },
	} {
		call := in.Formation.Call
		call.Metadata.FailureModes = slices.Clone(call.Metadata.FailureModes)
		change(&call)
		changed := *in
		changed.Formation = FormationInput{Call: call, Digest: in.Formation.Digest}
		whole, err := NewDocument(&changed)
		if err != nil {
			t.Fatal(err)
		}
		changed.Formation = cache.Formation(call, in.Formation.Digest)
		if changed.Formation.metadata == first.metadata && changed.Formation.source == first.source {
			t.Error("a changed call was given the cached parts of another")
		}
		doc, err := NewDocument(&changed)
		if err != nil {
			t.Fatal(err)
		}
		if doc.value.Compare(whole.value) != 0 {
			t.Errorf("a changed call's cached document differs:\n got %v\nwant %v", doc.value, whole.value)
		}
	}
}

// epochManifest is the manifest githubInput described in.Epoch from.
func epochManifest(t *testing.T, m *manifest.Manifest, in *Input) *manifest.Manifest {
	t.Helper()
	mc := *m
	mc.Artifact = in.Epoch.Artifact
	return &mc
}
