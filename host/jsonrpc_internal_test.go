package host

import (
	"errors"
	"testing"

	"github.com/fcd-authz/fcd/fencecheck"
)

// TestToolCallOf: the transport reads a body as the fence does
// (fencecheck.ReadMessage): it forms exactly the call the fence verifies,
// lets everything that holds no call pass, and refuses a body the fence
// would refuse rather than form a reading of it.
func TestToolCallOf(t *testing.T) {
	for _, c := range []struct {
		note, body string
		name, args string            // the call formed; "" for none
		err        error             // matched with errors.Is
		reason     fencecheck.Reason // the refusal's reason
	}{
		{note: "a call", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_repository","arguments":{"repo":"hello-world", "owner":"octo-org"}}}`,
			name: "get_repository", args: `{"repo":"hello-world", "owner":"octo-org"}`},
		{note: "a call without arguments", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list"}}`, name: "list"},
		{note: "tools/list", body: `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`},
		{note: "a notification", body: `{"jsonrpc":"2.0","method":"notifications/initialized"}`},
		{note: "a response", body: `{"jsonrpc":"2.0","id":7,"result":{}}`},
		{note: "empty", body: " \n"},
		{note: "not JSON", body: `tools/call`},
		{note: "a batch without a call", body: `[{"jsonrpc":"2.0","id":3,"method":"ping"}]`},
		{note: "a batch with a call", body: `[{"jsonrpc":"2.0","id":3,"method":"ping"},{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"x"}}]`,
			err: ErrBatchedCall},
		// encoding/json would have read these as a call of one reading;
		// the fence refuses them.
		{note: "method in another case", body: `{"jsonrpc":"2.0","id":1,"Method":"tools/call","params":{"name":"x"}}`, reason: fencecheck.ReasonMemberCase},
		{note: "the method in another case", body: `{"jsonrpc":"2.0","id":1,"method":"Tools/Call","params":{"name":"x"}}`, reason: fencecheck.ReasonMemberCase},
		{note: "name twice", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read","name":"delete"}}`, reason: fencecheck.ReasonDuplicateMember},
		{note: "arguments that fold alike", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"visibility":"private","viſibility":"public"}}}`,
			reason: fencecheck.ReasonNameCollision},
	} {
		t.Run(c.note, func(t *testing.T) {
			call, err := toolCallOf([]byte(c.body))
			switch {
			case c.err != nil:
				if !errors.Is(err, c.err) || call != nil {
					t.Fatalf("toolCallOf = %+v, %v; want %v", call, err, c.err)
				}
			case c.reason != "":
				if got := fencecheck.ReasonOf(err); got != c.reason || call != nil {
					t.Fatalf("toolCallOf = %+v, %v; want a refusal for %s", call, err, c.reason)
				}
			case err != nil:
				t.Fatal(err)
			case c.name == "":
				if call != nil {
					t.Fatalf("toolCallOf = %+v, want no call", call)
				}
			case call == nil || call.Name != c.name || string(call.Arguments) != c.args:
				t.Fatalf("toolCallOf = %+v, want %s with %s", call, c.name, c.args)
			}
		})
	}
}
