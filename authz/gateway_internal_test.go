package authz

import (
	"errors"
	"testing"

	"github.com/fcd-authz/fcd/fencecheck"
)

// TestReadMCP covers how a gateway decision reads MCP bodies: what counts
// as a tools/call, and what is refused because another parser could read
// it differently.
func TestReadMCP(t *testing.T) {
	cases := []struct {
		note      string
		body      string
		call      bool
		name      string
		args      string
		formation string
		err       bool
	}{
		{note: "call", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get","arguments":{"a":1}}}`,
			call: true, name: "get", args: `{"a":1}`},
		{note: "call in another case is refused", body: `{"METHOD":"Tools/Call","Params":{"NAME":"get"}}`, err: true},
		{note: "Arguments beside arguments", body: `{"method":"tools/call","params":{"name":"get","arguments":{"v":"private"},"Arguments":{}}}`, err: true},
		{note: "argument names folding alike", body: `{"method":"tools/call","params":{"name":"get","arguments":{"visibility":"private","viſibility":"public"}}}`, err: true},
		{note: "formation in _meta", body: `{"method":"tools/call","params":{"name":"get","_meta":{"dev.fcd/formation":"fm_x","other":1}}}`,
			call: true, name: "get", formation: "fm_x"},
		{note: "null _meta", body: `{"method":"tools/call","params":{"name":"get","_meta":null}}`, call: true, name: "get"},
		{note: "list", body: `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`},
		{note: "notification", body: `{"jsonrpc":"2.0","method":"notifications/initialized"}`},
		{note: "response", body: `{"jsonrpc":"2.0","id":1,"result":{}}`},
		{note: "batch without a call", body: `[{"method":"tools/list"},{"method":"ping"}]`},
		{note: "_meta of another message is ignored", body: `{"method":"tools/list","params":{"_meta":{"dev.fcd/formation":"fm_x"}}}`},
		{note: "call without params", body: `{"method":"tools/call"}`, err: true},

		{note: "not JSON", body: `{"method":`, err: true},
		{note: "a vertical tab before the object (not JSON whitespace)", body: "\v" + `{"method":"tools/call","params":{"name":"get"}}`, err: true},
		{note: "JSON whitespace around the object", body: " \r\n" + `{"method":"tools/list"}` + "\t\n"},
		{note: "not an object", body: `"tools/call"`, err: true},
		{note: "two methods by case", body: `{"method":"tools/list","Method":"tools/call"}`, err: true},
		{note: "two names by case", body: `{"method":"tools/call","params":{"name":"a","Name":"b"}}`, err: true},
		{note: "two argument members by case", body: `{"method":"tools/call","params":{"name":"a","arguments":{"x":{"private":true,"PRIVATE":false}}}}`, err: true},
		{note: "batch with a call", body: `[{"method":"tools/list"},{"method":"tools/call","params":{"name":"a"}}]`, err: true},
		{note: "method not a string", body: `{"method":1}`, err: true},
		{note: "name not a string", body: `{"method":"tools/call","params":{"name":1}}`, err: true},
		{note: "_meta not an object", body: `{"method":"tools/call","params":{"name":"a","_meta":"fm_x"}}`, err: true},
		{note: "formation not a string", body: `{"method":"tools/call","params":{"name":"a","_meta":{"dev.fcd/formation":1}}}`, err: true},
	}
	for _, tc := range cases {
		t.Run(tc.note, func(t *testing.T) {
			m, err := readMCP([]byte(tc.body))
			if tc.err {
				var rerr *fencecheck.RejectError
				if !errors.Is(err, ErrMalformedMCP) || !errors.As(err, &rerr) {
					t.Fatalf("readMCP = %+v, %v; want ErrMalformedMCP with the reader's reason", m, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if m.Call != tc.call || m.Name != tc.name || string(m.Arguments) != tc.args || m.Formation != tc.formation {
				t.Fatalf("readMCP = %+v (arguments %s)", m, m.Arguments)
			}
		})
	}
}

func TestMatchHeaders(t *testing.T) {
	call := fencecheck.Message{Method: "tools/call", Call: true, Name: "get"}
	list := fencecheck.Message{Method: "tools/list"}
	cases := []struct {
		note           string
		m              fencecheck.Message
		methods, names []string
		err            bool
	}{
		{note: "no headers", m: call},
		{note: "matching", m: call, methods: []string{"tools/call"}, names: []string{"get"}},
		{note: "method in another case", m: call, methods: []string{" Tools/Call"}, err: true},
		{note: "list says list", m: list, methods: []string{"tools/list"}},
		{note: "header says call, body lists", m: list, methods: []string{"tools/call"}, err: true},
		{note: "header lists, body calls", m: call, methods: []string{"tools/list"}, err: true},
		{note: "other tool", m: call, names: []string{"delete"}, err: true},
		{note: "response body", m: fencecheck.Message{}, methods: []string{"tools/list"}},
	}
	for _, tc := range cases {
		err := matchHeaders(tc.m, tc.methods, tc.names)
		if (err != nil) != tc.err || (err != nil && !errors.Is(err, ErrMalformedMCP)) {
			t.Errorf("%s: %v", tc.note, err)
		}
	}
}
