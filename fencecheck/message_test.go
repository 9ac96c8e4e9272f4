package fencecheck_test

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/fcd-authz/fcd/fencecheck"
)

func TestReadMessage(t *testing.T) {
	call := func(params string) string {
		return `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":` + params + `}`
	}
	type want struct {
		call      bool
		method    string
		name      string
		arguments string
		formation string
		batch     bool
	}
	cases := []struct {
		note   string
		body   string
		want   want
		reason fencecheck.Reason
	}{
		{note: "a call", body: call(`{"name":"create_repository","arguments":{"visibility":"private"}}`),
			want: want{call: true, method: "tools/call", name: "create_repository", arguments: `{"visibility":"private"}`}},
		{note: "JSON whitespace around", body: " \t\n" + call(`{"name":"a","arguments":{}}`) + "\r\n",
			want: want{call: true, method: "tools/call", name: "a", arguments: `{}`}},
		{note: "escaped member names are the names", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"n\u0061me":"a","argument\u0073":{"x":1}}}`,
			want: want{call: true, method: "tools/call", name: "a", arguments: `{"x":1}`}},
		{note: "arguments absent", body: call(`{"name":"a"}`), want: want{call: true, method: "tools/call", name: "a"}},
		{note: "arguments null", body: call(`{"name":"a","arguments":null}`),
			want: want{call: true, method: "tools/call", name: "a", arguments: "null"}},
		{note: "formation in _meta", body: call(`{"name":"a","_meta":{"dev.fcd/formation":"fm_1","progressToken":3}}`),
			want: want{call: true, method: "tools/call", name: "a", formation: "fm_1"}},
		{note: "other traffic", body: `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, want: want{method: "tools/list"}},
		{note: "a response", body: `{"jsonrpc":"2.0","id":2,"result":{}}`},
		{note: "a batch without a call", body: `[{"jsonrpc":"2.0","id":2,"method":"tools/list"}]`, want: want{batch: true}},
		{note: "empty", body: " \n"},
		{note: "unknown members in any case", body: call(`{"name":"a","Extra":1,"EXTRA":2}`), want: want{call: true, method: "tools/call", name: "a"}},

		// Another parser could read these differently.
		{note: "Arguments", body: call(`{"name":"a","Arguments":{"visibility":"public"}}`), reason: fencecheck.ReasonMemberCase},
		{note: "ARGUMENTS beside arguments", body: call(`{"name":"a","arguments":{"visibility":"private"},"ARGUMENTS":{}}`), reason: fencecheck.ReasonMemberCase},
		{note: "arguments with U+017F", body: call(`{"name":"a","argumentſ":{}}`), reason: fencecheck.ReasonMemberCase},
		{note: "arguments with an escaped U+017F", body: call(`{"name":"a","argument\u017f":{}}`), reason: fencecheck.ReasonMemberCase},
		{note: "Name", body: call(`{"Name":"a"}`), reason: fencecheck.ReasonMemberCase},
		{note: "Params", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","Params":{"name":"a"}}`, reason: fencecheck.ReasonMemberCase},
		{note: "ID", body: `{"jsonrpc":"2.0","ID":1,"method":"tools/list"}`, reason: fencecheck.ReasonMemberCase},
		{note: "JSONRPC", body: `{"JSONRPC":"2.0","id":1,"method":"tools/list"}`, reason: fencecheck.ReasonMemberCase},
		{note: "_META", body: call(`{"name":"a","_META":{}}`), reason: fencecheck.ReasonMemberCase},
		{note: "formation key in another case", body: call(`{"name":"a","_meta":{"DEV.FCD/FORMATION":"fm_2"}}`), reason: fencecheck.ReasonMemberCase},
		{note: "method Tools/Call", body: `{"jsonrpc":"2.0","id":1,"method":"Tools/Call","params":{"name":"a"}}`, reason: fencecheck.ReasonMemberCase},
		{note: "METHOD beside method", body: `{"jsonrpc":"2.0","id":1,"method":"tools/list","METHOD":"tools/call"}`, reason: fencecheck.ReasonMemberCase},
		{note: "duplicate arguments", body: call(`{"name":"a","arguments":{"v":"private"},"arguments":{}}`), reason: fencecheck.ReasonDuplicateMember},
		{note: "duplicate by escape", body: call(`{"name":"a","arguments":{},"argument\u0073":{}}`), reason: fencecheck.ReasonDuplicateMember},
		{note: "duplicate method", body: `{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call"}`, reason: fencecheck.ReasonDuplicateMember},
		{note: "duplicate deep in an unknown member", body: call(`{"name":"a","x":[{"k":1,"k":2}]}`), reason: fencecheck.ReasonDuplicateMember},
		{note: "duplicate argument", body: call(`{"name":"a","arguments":{"v":"private","v":"public"}}`), reason: fencecheck.ReasonDuplicateMember},
		{note: "argument names that fold alike", body: call(`{"name":"a","arguments":{"visibility":"private","viſibility":"public"}}`), reason: fencecheck.ReasonNameCollision},
		{note: "argument names in another case", body: call(`{"name":"a","arguments":{"opts":{"private":true,"Private":false}}}`), reason: fencecheck.ReasonNameCollision},
		{note: "Kelvin sign", body: call(`{"name":"a","arguments":{"k":1,"\u212a":2}}`), reason: fencecheck.ReasonNameCollision},
		{note: "lone high surrogate", body: call(`{"name":"a","arguments":{"v":"\ud800"}}`), reason: fencecheck.ReasonEncoding},
		{note: "lone low surrogate in a name", body: call(`{"name":"a","arguments":{"\udc00":1}}`), reason: fencecheck.ReasonEncoding},
		{note: "high surrogate then a non-surrogate", body: call(`{"name":"a","arguments":{"v":"\ud800\u0041"}}`), reason: fencecheck.ReasonEncoding},
		{note: "invalid UTF-8", body: call(`{"name":"a","arguments":{"v":"` + "\xff" + `"}}`), reason: fencecheck.ReasonEncoding},
		{note: "batch with a call", body: `[` + call(`{"name":"a"}`) + `]`, reason: fencecheck.ReasonBatch},

		{note: "not JSON", body: `{"method": tools/call}`, reason: fencecheck.ReasonParse},
		{note: "vertical tab before", body: "\v" + call(`{"name":"a"}`), reason: fencecheck.ReasonParse},
		{note: "not an object", body: `"tools/call"`, reason: fencecheck.ReasonInvalidRequest},
		{note: "method a number", body: `{"jsonrpc":"2.0","id":1,"method":7}`, reason: fencecheck.ReasonInvalidRequest},
		{note: "call without params", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call"}`, reason: fencecheck.ReasonInvalidRequest},
		{note: "name a number", body: call(`{"name":7}`), reason: fencecheck.ReasonInvalidRequest},
		{note: "arguments an array", body: call(`{"name":"a","arguments":[1]}`), reason: fencecheck.ReasonInvalidRequest},
		{note: "formation a number", body: call(`{"name":"a","_meta":{"dev.fcd/formation":1}}`), reason: fencecheck.ReasonInvalidRequest},
	}
	for _, tc := range cases {
		t.Run(tc.note, func(t *testing.T) {
			m, err := fencecheck.ReadMessage([]byte(tc.body))
			if tc.reason != "" {
				if got := fencecheck.ReasonOf(err); got != tc.reason {
					t.Fatalf("ReadMessage = %+v, %v; want reason %s", m, err, tc.reason)
				}
				return
			}
			if err != nil {
				t.Fatalf("ReadMessage: %v", err)
			}
			got := want{call: m.Call, method: m.Method, name: m.Name, arguments: string(m.Arguments), formation: m.Formation, batch: m.Batch}
			if got != tc.want {
				t.Fatalf("ReadMessage = %+v, want %+v", got, tc.want)
			}
			if m.Call && string(m.ID) != "7" && string(m.ID) != "1" {
				t.Fatalf("id %s", m.ID)
			}
		})
	}
}

// TestReadMessageNesting: nesting deeper than the MCP Go SDK accepts is
// refused, not walked.
func TestReadMessageNesting(t *testing.T) {
	deep := make([]byte, 0, 4100)
	for range 2000 {
		deep = append(deep, '[')
	}
	for range 2000 {
		deep = append(deep, ']')
	}
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"x":` + string(deep) + `}}`
	if !json.Valid([]byte(body)) {
		t.Fatal("test body is not JSON")
	}
	if _, err := fencecheck.ReadMessage([]byte(body)); fencecheck.ReasonOf(err) != fencecheck.ReasonInvalidRequest {
		t.Fatalf("ReadMessage = %v, want invalid_request", err)
	}
}

func TestFoldName(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{"arguments", "ARGUMENTS", true},
		{"arguments", "argumentſ", true},
		{"k", "\u212a", true},
		{"visibility", "viſibility", true},
		{"arguments", "argument", false},
		{"ß", "ss", false}, // simple folding only, as encoding/json
	} {
		if got := fencecheck.FoldName(tc.a) == fencecheck.FoldName(tc.b); got != tc.same {
			t.Errorf("FoldName(%q) == FoldName(%q): %v, want %v", tc.a, tc.b, got, tc.same)
		}
	}
}

// FuzzFoldName: two strings fold alike exactly when strings.EqualFold
// holds for them (the rule encoding/json matches struct fields by), on
// the ASCII fast path and the Unicode one alike.
func FuzzFoldName(f *testing.F) {
	for _, s := range [][2]string{
		{"arguments", "ARGUMENTS"}, {"argumentſ", "ARGUMENTS"}, {"k", "\u212a"}, {"K", "\u212a"},
		{"ß", "ss"}, {"name_1", "NAME_1"}, {"\xff", "\xfe"}, {"Σ", "ς"}, {"a", "b"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		if !utf8.ValidString(a) || !utf8.ValidString(b) {
			t.Skip("names are valid UTF-8 by the time they are folded")
		}
		if got, want := fencecheck.FoldName(a) == fencecheck.FoldName(b), strings.EqualFold(a, b); got != want {
			t.Fatalf("FoldName(%q) == FoldName(%q) is %v, strings.EqualFold %v", a, b, got, want)
		}
	})
}
