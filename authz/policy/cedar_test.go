package policy

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/cedar-policy/cedar-go"
	"github.com/cedar-policy/cedar-go/types"
	"github.com/fcd-authz/fcd/record"
)

// TestCedarRejectedAtBuild covers the annotations NewCedarEngine requires.
func TestCedarRejectedAtBuild(t *testing.T) {
	tests := []struct {
		note, src, errPart string
	}{
		{"syntax error", `@id("a") permit (principal, action, resource`, "parser error"},
		{"policy without @id", `permit (principal, action, resource);`, "@id"},
		{"empty @id", `@id("") permit (principal, action, resource);`, "@id"},
		{"duplicate @id", `@id("a") permit (principal, action, resource); @id("a") forbid (principal, action, resource);`, "duplicate"},
		{"@approvals on a forbid", `@id("a") @approvals("1") forbid (principal, action, resource);`, "only meaningful on a permit"},
		{"@approvals not a number", `@id("a") @approvals("two") permit (principal, action, resource);`, "@approvals"},
		{"@approvals zero", `@id("a") @approvals("0") permit (principal, action, resource);`, "@approvals"},
	}
	for _, tc := range tests {
		t.Run(tc.note, func(t *testing.T) {
			_, err := NewCedarEngine(map[string][]byte{"p.cedar": []byte(tc.src)})
			if !errors.Is(err, ErrInvalidPolicy) {
				t.Fatalf("err = %v, want ErrInvalidPolicy", err)
			}
			if !strings.Contains(err.Error(), tc.errPart) {
				t.Errorf("error %q does not mention %q", err, tc.errPart)
			}
		})
	}
	t.Run("duplicate @id across files", func(t *testing.T) {
		_, err := NewCedarEngine(map[string][]byte{
			"a.cedar": []byte(`@id("x") permit (principal, action, resource);`),
			"b.cedar": []byte(`@id("x") permit (principal, action, resource);`),
		})
		if !errors.Is(err, ErrInvalidPolicy) || !strings.Contains(err.Error(), "b.cedar") {
			t.Fatalf("err = %v, want a duplicate in b.cedar", err)
		}
	})
}

// cedarEngine is the Cedar engine of the one file src, failing t if
// NewCedarEngine refuses it.
func cedarEngine(t testing.TB, src string) *CedarEngine {
	t.Helper()
	e, err := NewCedarEngine(map[string][]byte{"p.cedar": []byte(src)})
	if err != nil {
		t.Fatalf("NewCedarEngine: %v", err)
	}
	return e
}

// TestCedarFailsClosed covers diagnostic and mapping errors: each denies
// with Error set, even when a permit matched.
func TestCedarFailsClosed(t *testing.T) {
	m := githubManifest(t)
	tests := []struct {
		note    string
		src     string
		c       call
		errPart string
	}{
		{
			note:    "attribute accessed without has",
			src:     allowAllCedar + `@id("f") forbid (principal, action, resource) when { principal.clearance > 3 };`,
			c:       call{tool: "get_repository"},
			errPart: "clearance",
		},
		{
			note:    "type error in a permit",
			src:     allowAllCedar + `@id("p") permit (principal, action, resource) when { context.arguments.owner > 1 };`,
			c:       call{tool: "get_repository"},
			errPart: "policy `p`",
		},
		{
			note:    "a number Cedar cannot hold exactly",
			src:     allowAllCedar,
			c:       call{tool: "get_repository", args: `{"owner":"o","repo":"r","ratio":0.123456}`},
			errPart: "ratio",
		},
		{
			note:    "a null inside an array",
			src:     allowAllCedar,
			c:       call{tool: "get_repository", args: `{"owner":"o","repo":"r","tags":["a",null]}`},
			errPart: "tags[1]",
		},
		{
			note:    "arguments that are not an object",
			src:     allowAllCedar,
			c:       call{tool: "get_repository", args: `["o","r"]`},
			errPart: "arguments",
		},
		{
			note:    "an integer beyond int64",
			src:     allowAllCedar,
			c:       call{tool: "get_repository", attrs: map[string]any{"n": json.Number("99999999999999999999")}},
			errPart: "principal attributes.n",
		},
	}
	for _, tc := range tests {
		t.Run(tc.note, func(t *testing.T) {
			e := cedarEngine(t, tc.src)
			doc := githubDocument(t, m, tc.c)
			got := e.Decide(context.Background(), doc)
			if got.Verdict != record.VerdictDeny || got.Error == "" {
				t.Fatalf("got %s (error %q), want a deny with an error", got.Verdict, got.Error)
			}
			if !strings.Contains(got.Error, tc.errPart) {
				t.Errorf("error %q does not mention %q", got.Error, tc.errPart)
			}
		})
	}
}

// TestCedarValues pins the JSON → Cedar value mapping.
func TestCedarValues(t *testing.T) {
	dec := func(s string) cedar.Value {
		d, err := types.ParseDecimal(s)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	tests := []struct {
		json string
		want cedar.Value // nil: an error
	}{
		{`"x"`, cedar.String("x")},
		{`true`, cedar.True},
		{`42`, cedar.Long(42)},
		{`-7`, cedar.Long(-7)},
		{`2.0`, cedar.Long(2)},
		{`1e3`, cedar.Long(1000)},
		{`1.5`, dec("1.5")},
		{`-0.25`, dec("-0.25")},
		{`0.1230`, dec("0.123")},
		{`0.12345`, nil},
		{`1.5e-1`, nil},
		{`1e300`, nil},
		{`9223372036854775808`, nil},
		{`922337203685478.0001`, nil},
		{`["a","a","b"]`, cedar.NewSet(cedar.String("a"), cedar.String("b"))},
		{`{"a":1,"b":null}`, cedar.NewRecord(cedar.RecordMap{"a": cedar.Long(1)})},
		{`{"a":{"b":[1,2]}}`, cedar.NewRecord(cedar.RecordMap{"a": cedar.NewRecord(cedar.RecordMap{"b": cedar.NewSet(cedar.Long(1), cedar.Long(2))})})},
		{`[null]`, nil},
	}
	for _, tc := range tests {
		t.Run(tc.json, func(t *testing.T) {
			v, err := astFromJSON([]byte(tc.json))
			if err != nil {
				t.Fatal(err)
			}
			got, err := cedarValue(v, "v")
			if tc.want == nil {
				if err == nil {
					t.Fatalf("got %v, want an error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !got.Equal(tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestCedarRequestMapping checks the entity and request shape policies
// rely on: principal, action per side effect, resource inside its server.
func TestCedarRequestMapping(t *testing.T) {
	m := githubManifest(t)
	doc := githubDocument(t, m, call{tool: "delete_repository", admin: true})
	entities, req, err := cedarRequest(doc)
	if err != nil {
		t.Fatal(err)
	}
	if req.Principal.String() != `Principal::"alice"` || req.Action.String() != `Action::"delete"` ||
		req.Resource.String() != `Tool::"github/delete_repository"` {
		t.Errorf("request = %v %v %v", req.Principal, req.Action, req.Resource)
	}
	tool, ok := entities[req.Resource]
	if !ok || !tool.Parents.Contains(cedar.NewEntityUID("Server", "github")) {
		t.Fatalf("tool entity %+v has no Server parent", tool)
	}
	for _, attr := range []cedar.String{"sideEffects", "requiresApproval", "requires", "exclusiveWith", "producesInputFor"} {
		if _, ok := tool.Attributes.Get(attr); !ok {
			t.Errorf("tool entity lacks %s", attr)
		}
	}
	for _, key := range []cedar.String{"arguments", "formation", "epoch", "session", "principal"} {
		if _, ok := req.Context.Get(key); !ok {
			t.Errorf("context lacks %s", key)
		}
	}
}

// TestCedarSuccessorFailsClosed: a diagnostic error while deciding
// Action::"substitute" refuses the successor with the error recorded and
// leaves the call's own decision alone; an input the mapping cannot
// convert fails both.
func TestCedarSuccessorFailsClosed(t *testing.T) {
	m := githubManifest(t)
	tests := []struct {
		note    string
		src     string
		s       successor
		errPart string
		// callFails: the call's own decision fails too.
		callFails bool
	}{
		{
			note:    "a forbid on substitute reads a missing attribute",
			src:     allowAllCedar + `@id("f") forbid (principal, action == Action::"substitute", resource) when { context.successor.epoch.nope == 1 };`,
			errPart: "policy `f`",
		},
		{
			note:    "a permit on substitute errors: fail closed too",
			src:     allowAllCedar + `@id("p") permit (principal, action == Action::"substitute", resource) when { context.successor.certificate.effects.visibility > 1 };`,
			errPart: "policy `p`",
		},
		{
			note:      "effects Cedar cannot hold exactly",
			src:       allowAllCedar,
			s:         successor{effects: map[string]any{"ratio": json.Number("0.123456")}},
			errPart:   "effects.ratio",
			callFails: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.note, func(t *testing.T) {
			e := cedarEngine(t, tc.src)
			doc := githubDocument(t, m, call{tool: "get_repository", successor: &tc.s})
			got := e.Decide(context.Background(), doc)
			gs := got.Successor
			if gs == nil || gs.Verdict != record.VerdictDeny || !strings.Contains(gs.Error, tc.errPart) {
				t.Fatalf("successor = %+v, want a deny with an error mentioning %q", gs, tc.errPart)
			}
			if len(gs.Rules) != 0 || gs.Rules == nil || gs.Reasons == nil {
				t.Errorf("an erroring successor answer names rules %v / %v", gs.Rules, gs.Reasons)
			}
			if tc.callFails {
				if got.Verdict != record.VerdictDeny || got.Error == "" {
					t.Errorf("the call: %s (error %q), want a deny with an error", got.Verdict, got.Error)
				}
				return
			}
			if got.Verdict != record.VerdictAllow || got.Error != "" || strings.Join(got.Rules, ",") != "allow-all" {
				t.Errorf("the call: %s by %v (error %q), want allow by allow-all", got.Verdict, got.Rules, got.Error)
			}
		})
	}
}

// TestCedarSuccessorMapping checks context.successor and
// context.formation.successor: present exactly with a successor, shaped as
// documented, and the same in the call's request as in the substitute one.
func TestCedarSuccessorMapping(t *testing.T) {
	m := githubManifest(t)
	doc := githubDocument(t, m, call{tool: "get_repository"})
	_, req, err := cedarRequest(doc)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := req.Context.Get("successor"); ok {
		t.Errorf("context.successor without a successor")
	}
	in := githubInput(t, m, call{tool: "get_repository", successor: &successor{effects: map[string]any{"visibility": "private", "n": 2}}})
	if doc, err = NewDocument(in); err != nil {
		t.Fatal(err)
	}
	_, req, err = cedarRequest(doc)
	if err != nil {
		t.Fatal(err)
	}
	at := func(path ...cedar.String) cedar.Value {
		t.Helper()
		var v cedar.Value = req.Context
		for _, k := range path {
			r, ok := v.(cedar.Record)
			if !ok {
				t.Fatalf("%v: not a record at %s", path, k)
			}
			if v, ok = r.Get(k); !ok {
				t.Fatalf("context lacks %v", path)
			}
		}
		return v
	}
	effects := cedar.NewRecord(cedar.RecordMap{"visibility": cedar.String("private"), "n": cedar.Long(2)})
	want := []struct {
		path []cedar.String
		v    cedar.Value
	}{
		{[]cedar.String{"successor", "epoch", "id"}, cedar.String(in.Successor.Epoch.ID)},
		{[]cedar.String{"successor", "epoch", "server"}, cedar.String("github")},
		{[]cedar.String{"successor", "epoch", "release"}, cedar.String("v1.3.0")},
		{[]cedar.String{"successor", "epoch", "pool"}, cedar.String("github-v1-3")},
		{[]cedar.String{"successor", "epoch", "state"}, cedar.String("ACTIVE")},
		{[]cedar.String{"successor", "epoch", "artifactPinned"}, cedar.True},
		{[]cedar.String{"successor", "epoch", "configDigest"}, cedar.String(in.Successor.Epoch.ConfigDigest)},
		{[]cedar.String{"successor", "certificate", "id"}, cedar.String(successorCertID)},
		{[]cedar.String{"successor", "certificate", "issuer"}, cedar.String(successorIssuer)},
		{[]cedar.String{"successor", "certificate", "source"}, cedar.String(in.Formation.Source.Epoch)},
		{[]cedar.String{"successor", "certificate", "target"}, cedar.String(in.Successor.Epoch.ID)},
		{[]cedar.String{"successor", "certificate", "tool"}, cedar.String("create_repository")},
		{[]cedar.String{"successor", "certificate", "effects"}, effects},
		{[]cedar.String{"successor", "certificate", "profile", "id"}, cedar.String("github-create-repository/1")},
		{[]cedar.String{"successor", "certificate", "profile", "digest"}, cedar.String(in.Successor.Certificate.Profile.Digest)},
		{[]cedar.String{"successor", "certificate", "expiresAt"}, cedar.String("2027-11-30T00:00:00Z")},
		{[]cedar.String{"formation", "hasSuccessor"}, cedar.True},
		{[]cedar.String{"formation", "successor", "epoch"}, cedar.String(in.Successor.Epoch.ID)},
		{[]cedar.String{"formation", "successor", "artifactPinned"}, cedar.True},
		{[]cedar.String{"formation", "successor", "certificate"}, cedar.String(successorCertID)},
		{[]cedar.String{"formation", "successor", "issuer"}, cedar.String(successorIssuer)},
		{[]cedar.String{"formation", "successor", "effects"}, effects},
	}
	for _, w := range want {
		if got := at(w.path...); !got.Equal(w.v) {
			t.Errorf("context.%v = %v, want %v", w.path, got, w.v)
		}
	}
}
