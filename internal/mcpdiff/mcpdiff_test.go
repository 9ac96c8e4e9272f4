package mcpdiff_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"github.com/fcd-authz/fcd/fencecheck"
)

// TestSDKServerRunsWellFormedCalls: the fuzz target is worth something only
// if the SDK's server runs calls at all. Each well-formed call reaches the
// SDK's tool handler with exactly the name and argument bytes sent, its
// replica reads the same call, and the fence agrees with every reader.
func TestSDKServerRunsWellFormedCalls(t *testing.T) {
	srv := sharedServer()
	for _, tc := range []struct {
		note, name, args string
	}{
		{note: "flat", name: "echo", args: `{"visibility":"private"}`},
		{note: "another tool", name: "github/create_repository", args: `{"name":"x","private":true}`},
		{note: "nested, escapes, numbers", name: "echo", args: `{"a":{"b":[1,{"k":"\u00e9"}]},"n":1e2,"big":9007199254740993}`},
		{note: "empty", name: "echo", args: `{}`},
	} {
		t.Run(tc.note, func(t *testing.T) {
			body := []byte(call(`{"name":"` + tc.name + `","arguments":` + tc.args + `,"_meta":{"dev.fcd/formation":"f-1"}}`))
			got := srv.serve(body)
			if got.status != http.StatusOK {
				t.Fatalf("HTTP %d %s", got.status, got.answer)
			}
			if len(got.ran) != 1 || got.ran[0].Name != tc.name || !bytes.Equal(got.ran[0].Arguments, []byte(tc.args)) {
				t.Fatalf("the tool ran %v, want one run of %q with %s", got.ran, tc.name, tc.args)
			}
			if len(got.dispatched) != 1 || !got.dispatched[0].same(got.ran[0]) {
				t.Fatalf("dispatched %v, ran %v", got.dispatched, got.ran)
			}
			msgs, batch, err := sdkRead(body)
			if err != nil || batch || len(msgs) != 1 {
				t.Fatalf("the replica reads %v batch=%v: %v", msgs, batch, err)
			}
			fence, err := fencecheck.ReadMessage(body)
			if err != nil || !fence.Call || fence.Name != tc.name || fence.Formation != "f-1" {
				t.Fatalf("the fence reads %+v: %v", fence, err)
			}
			if p := compare(body, fence, srv); len(p) > 0 {
				t.Fatalf("readers disagree:\n%s", joinLines(p))
			}
		})
	}
}

// TestSDKServerRunsNoToolForNonCalls: bodies that are not a tools/call
// with an id run no tool, so a run recorded in the fuzz target is a real
// dispatch.
func TestSDKServerRunsNoToolForNonCalls(t *testing.T) {
	srv := sharedServer()
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"echo","arguments":{}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"Tools/Call","params":{"name":"echo","arguments":{}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":null}`,
	} {
		t.Run(body, func(t *testing.T) {
			if got := srv.serve([]byte(body)); len(got.dispatched) > 0 || len(got.ran) > 0 {
				t.Fatalf("HTTP %d: dispatched %v, ran %v", got.status, got.dispatched, got.ran)
			}
		})
	}
}

// TestFenceClosesTheHoles: the attack bodies of issue 10 are read two
// ways — encoding/json takes a case or fold variant for the member, the
// SDK runs the tool without it — and ReadMessage refuses each. Had the
// fence read them as a lenient reader does, the comparison the fuzz target
// makes would fail: the target can see the hole it guards.
func TestFenceClosesTheHoles(t *testing.T) {
	srv := sharedServer()
	approved := `{"visibility":"private"}`
	// lenient is how a case-insensitive reader reads each body: the call
	// with the approved arguments.
	lenient := fencecheck.Message{Method: "tools/call", Call: true, Name: "echo", Arguments: json.RawMessage(approved)}
	for _, tc := range []struct {
		note   string
		body   string
		reason fencecheck.Reason
		// jsonArgs are the arguments encoding/json reads.
		jsonArgs string
		// sdkArgs are the arguments the SDK's tool gets.
		sdkArgs string
	}{
		{note: "Arguments", body: call(`{"name":"echo","Arguments":` + approved + `}`), reason: fencecheck.ReasonMemberCase, jsonArgs: approved},
		{note: "ARGUMENTS", body: call(`{"name":"echo","ARGUMENTS":` + approved + `}`), reason: fencecheck.ReasonMemberCase, jsonArgs: approved},
		{note: "argumentſ (U+017F)", body: call(`{"name":"echo","argumentſ":` + approved + `}`), reason: fencecheck.ReasonMemberCase, jsonArgs: approved},
		{
			note:     "arguments twice, last wins in encoding/json",
			body:     call(`{"name":"echo","arguments":` + approved + `,"arguments":{"visibility":"public"}}`),
			reason:   fencecheck.ReasonDuplicateMember,
			jsonArgs: `{"visibility":"public"}`,
			sdkArgs:  `{"visibility":"public"}`,
		},
	} {
		t.Run(tc.note, func(t *testing.T) {
			body := []byte(tc.body)
			_, err := fencecheck.ReadMessage(body)
			var rerr *fencecheck.RejectError
			if !errors.As(err, &rerr) || rerr.Reason != tc.reason {
				t.Fatalf("ReadMessage: %v, want reason %s", err, tc.reason)
			}
			var env envelope
			if err := json.Unmarshal(body, &env); err != nil || string(env.Params.Arguments) != tc.jsonArgs {
				t.Fatalf("encoding/json reads arguments %s (%v), want %s", env.Params.Arguments, err, tc.jsonArgs)
			}
			got := srv.serve(body)
			if len(got.ran) != 1 || string(got.ran[0].Arguments) != tc.sdkArgs {
				t.Fatalf("the SDK ran %v (HTTP %d), want one run with arguments %q", got.ran, got.status, tc.sdkArgs)
			}
			if p := compare(body, lenient, srv); len(p) == 0 {
				t.Fatal("the comparison finds nothing wrong with the lenient reading")
			}
		})
	}
}

// TestFoldedArgumentNamesAreSeen: two argument names that fold alike are
// refused by the fence; had it accepted them, the per-name struct decoding
// of the comparison would have caught encoding/json giving one field the
// other member's value.
func TestFoldedArgumentNamesAreSeen(t *testing.T) {
	for _, args := range []string{
		`{"visibility":"private","viſibility":"public"}`,
		`{"a":{"k":1,"K":2}}`,
		`{"list":[{"Name":1,"name":2}]}`,
	} {
		t.Run(args, func(t *testing.T) {
			body := []byte(call(`{"name":"echo","arguments":` + args + `}`))
			_, err := fencecheck.ReadMessage(body)
			var rerr *fencecheck.RejectError
			if !errors.As(err, &rerr) || rerr.Reason != fencecheck.ReasonNameCollision {
				t.Fatalf("ReadMessage: %v, want reason %s", err, fencecheck.ReasonNameCollision)
			}
			budget := 64
			var p problems
			compareArgumentNames(&p, json.RawMessage(args), "params.arguments", 0, &budget)
			if len(p) == 0 {
				t.Fatal("the per-name struct decoding finds nothing")
			}
		})
	}
}

// TestSeedsReachTheComparison: the seed corpus is not all refusals. Enough
// seeds are calls the fence accepts and the SDK's server runs, so every go
// test compares real readings, not only refusals.
func TestSeedsReachTheComparison(t *testing.T) {
	srv := sharedServer()
	var accepted, ran int
	for _, s := range seeds {
		fence, err := fencecheck.ReadMessage([]byte(s))
		if err != nil || !fence.Call {
			continue
		}
		accepted++
		if got := srv.serve([]byte(s)); len(got.ran) == 1 && got.ran[0].Name == fence.Name {
			ran++
		}
	}
	if accepted < 10 || ran < 8 {
		t.Fatalf("%d seeds are calls the fence accepts, %d of them ran in the SDK; want at least 10 and 8", accepted, ran)
	}
	t.Logf("%d of %d seeds are accepted calls, %d ran in the SDK", accepted, len(seeds), ran)
}
