package mcpdiff_test

import (
	"sync"
	"testing"

	"github.com/fcd-authz/fcd/fencecheck"
)

// call wraps params into a tools/call request.
func call(params string) string {
	return `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":` + params + `}`
}

// seeds are well-formed calls and the bodies of issue 10's attacks and
// their relatives: case and Unicode-fold variants of the names the fence
// reads, escaped names, duplicates, bad encodings, batches, method
// variants, _meta, numbers, nesting. Most of them the fence refuses; the
// fuzz target checks that whatever it accepts, the backends read alike.
var seeds = []string{
	// Well-formed.
	call(`{"name":"echo","arguments":{"visibility":"private"}}`),
	call(`{"name":"github/create_repository","arguments":{"name":"x","private":true,"owner":"o"}}`),
	call(`{"name":"echo"}`),
	call(`{"name":"echo","arguments":null}`),
	call(`{"name":"echo","arguments":{}}`),
	call(`{"name":"echo","arguments":{"a":{"b":{"c":[1,{"k":"v"}]}}},"_meta":{"dev.fcd/formation":"f-1","progressToken":7}}`),
	call(`{"name":"echo","arguments":{"n":1e2,"m":1.0,"big":9007199254740993,"neg":-0}}`),
	" \r\n\t" + call(`{"name":"echo","arguments":{"s":"\u003c\u00e9\ud83d\ude00"}}`) + "\n",
	`{"jsonrpc":"2.0","id":"abc","method":"tools/call","params":{"arguments":{"x":1},"name":"echo"}}`,
	`{"params":{"name":"echo","arguments":{"x":1}},"method":"tools/call","id":2,"jsonrpc":"2.0"}`,
	`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`,
	`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
	`{"jsonrpc":"2.0","id":1,"result":{}}`,
	// Case and fold variants of protected names.
	call(`{"name":"echo","Arguments":{"visibility":"public"}}`),
	call(`{"name":"echo","ARGUMENTS":{"visibility":"public"}}`),
	call(`{"name":"echo","argumentſ":{"visibility":"public"}}`),
	call(`{"name":"echo","arguments":{},"Arguments":{"visibility":"public"}}`),
	call(`{"Name":"echo","arguments":{}}`),
	call(`{"name":"echo","arguments":{},"_META":{"dev.fcd/formation":"f-2"}}`),
	call(`{"name":"echo","arguments":{},"_meta":{"DEV.fcd/formation":"f-2"}}`),
	`{"jsonrpc":"2.0","id":1,"Method":"tools/call","params":{"name":"echo","arguments":{}}}`,
	`{"jsonrpc":"2.0","id":1,"method":"tools/call","Params":{"name":"echo","arguments":{}}}`,
	`{"jsonrpc":"2.0","id":1,"method":"Tools/Call","params":{"name":"echo","arguments":{}}}`,
	`{"jsonrpc":"2.0","id":1,"method":"TOOLS/CALL","params":{"name":"echo","arguments":{}}}`,
	`{"jsonrpc":"2.0","id":1,"method":"tools/list","Method":"tools/call","params":{"name":"echo"}}`,
	// Escaped names and methods.
	call(`{"name":"echo","argument\u0073":{"visibility":"public"}}`),
	call(`{"n\u0061me":"echo","arguments":{"vis\u0069bility":"public"}}`),
	`{"jsonrpc":"2.0","id":1,"method":"tools\/call","params":{"name":"echo","arguments":{}}}`,
	`{"jsonrpc":"2.0","id":1,"m\u0065thod":"tools/call","params":{"name":"echo","arguments":{}}}`,
	// Duplicates.
	call(`{"name":"echo","arguments":{"visibility":"private"},"arguments":{"visibility":"public"}}`),
	call(`{"name":"echo","arguments":{"visibility":"private","visibility":"public"}}`),
	call(`{"name":"echo","name":"delete","arguments":{}}`),
	`{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call","params":{"name":"echo"}}`,
	call(`{"name":"echo","arguments":{"a":{"b":1,"b":2}}}`),
	// Names that fold alike: long s, Kelvin sign.
	call(`{"name":"echo","arguments":{"visibility":"private","viſibility":"public"}}`),
	call(`{"name":"echo","arguments":{"viſibility":"public"}}`),
	call(`{"name":"echo","arguments":{"k":1,"\u212a":2}}`),
	call(`{"name":"echo","arguments":{"a":{"Visibility":1,"visibility":2}}}`),
	// Encodings.
	call(`{"name":"echo","arguments":{"s":"\ud800"}}`),
	call(`{"name":"echo","arguments":{"s":"\udc00x"}}`),
	call(`{"name":"echo","arguments":{"\ud83dx":1}}`),
	call("{\"name\":\"echo\",\"arguments\":{\"s\":\"\xff\xfe\"}}"),
	call("{\"name\":\"echo\",\"argument\xf3\":{}}"),
	"\ufeff" + call(`{"name":"echo","arguments":{}}`),
	"\v" + call(`{"name":"echo","arguments":{}}`),
	// Batches.
	`[` + call(`{"name":"echo","arguments":{}}`) + `]`,
	`[{"jsonrpc":"2.0","id":1,"method":"tools/list"},{"jsonrpc":"2.0","id":2,"method":"ping"}]`,
	`[{"jsonrpc":"2.0","id":1,"method":"tools/list"},{"jsonrpc":"2.0","id":2,"method":"Tools/Call","params":{"name":"echo"}}]`,
	`[]`,
	// Not requests, or not the shape the fence reads.
	call(`{"name":"echo","arguments":[]}`),
	call(`{"name":"echo","arguments":"x"}`),
	call(`{"name":7,"arguments":{}}`),
	call(`[]`),
	`{"jsonrpc":"2.0","id":1,"method":"tools/call"}`,
	`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"echo","arguments":{}}}`,
	`{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"echo","arguments":{}}}`,
	`{"jsonrpc":"1.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{}}}`,
	`{"id":1.5,"method":"tools/call","params":{"name":"echo","arguments":{"x":1e400}}}`,
	call(`{"name":"echo","arguments":{}}`) + ` {}`,
	`"tools/call"`,
	``,
	// Fragments: as the method, the params or the arguments of a call
	// (see bodies).
	`"tools\/call"`,
	`"tools/call\u0000"`,
	`{"name":"echo","arguments":{"x":1},"_meta":{"dev.fcd/formation":"f"}}`,
	`{"name":"echo","Arguments":{"x":1}}`,
	`{"name":"echo","argument\u0073":{"x":1}}`,
	`{"visibility":"public","viſibility":"private"}`,
	`{"vis\u0069bility":"public"}`,
	`{"a":[{"b":{"c":"d"}}],"K":1}`,
}

// sharedServer is the one SDK server of the fuzz target and the tests.
var sharedServer = sync.OnceValue(newSDKServer)

// FuzzBackendsReadWhatTheFenceRead fails when fencecheck.ReadMessage
// accepts a body that the MCP Go SDK (its own server, and the replica of
// its decoding) or encoding/json struct decoding reads otherwise: another
// method, a tools/call the fence did not see, another tool, arguments with
// another digest, another formation, or an argument member a struct field
// takes from a name other than its own.
//
//	go test -run '^$' -fuzz FuzzBackendsReadWhatTheFenceRead -fuzztime 12m -parallel 1 ./internal/mcpdiff/
func FuzzBackendsReadWhatTheFenceRead(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	srv := sharedServer()
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, body := range bodies(in) {
			fence, err := fencecheck.ReadMessage(body)
			if err != nil {
				continue // refused: no backend sees the body
			}
			if p := compare(body, fence, srv); len(p) > 0 {
				t.Fatalf("the fence accepted %q as %+v, but:\n%s", body, fence, joinLines(p))
			}
		}
	})
}

// bodies returns the request bodies a fuzz input stands for: the input
// itself, and the input as the method, the params and the arguments of an
// otherwise well-formed tools/call. Mutations of a whole body mostly break
// its JSON; placed within a call, the same bytes reach the readers'
// handling of methods, params members and argument names far more often.
func bodies(in []byte) [][]byte {
	s := string(in)
	return [][]byte{
		in,
		[]byte(`{"jsonrpc":"2.0","id":1,"method":` + s + `,"params":{"name":"echo","arguments":{"visibility":"private"}}}`),
		[]byte(call(s)),
		[]byte(call(`{"name":"echo","arguments":` + s + `}`)),
	}
}

func joinLines(p problems) string {
	var s string
	for _, l := range p {
		s += "  - " + l + "\n"
	}
	return s
}
