package fencecheck

import "testing"

// TestReadArgumentsDigestAlike: for the arguments of every body
// ReadMessage accepts, the verification path's digest (which skips what
// the reader proved) equals ArgumentDigest's, refusals included — so a
// body whose arguments ArgumentDigest would refuse for a skipped check
// never reaches the path unrefused.
func TestReadArgumentsDigestAlike(t *testing.T) {
	for _, args := range []string{
		`{}`, `null`, ` { "b" : [1, {"c": "d"}], "a": "\u00e9" } `, `{"n":1.0,"big":1e2}`,
		`{"id":9007199254740993}`, // refused by the number check, on both paths
		`{"name":"a","Name":"b"}`, `{"a":{"x":1,"X":2}}`, `{"a":1,"a":2}`, `{"s":"\ud800"}`,
	} {
		body := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":` + args + `}}`)
		m, rerr := readMessage(body)
		want, werr := ArgumentDigest("srv/t", []byte(args))
		if rerr != nil {
			continue // refused before any token is looked at
		}
		got, gerr := argumentDigest("srv/t", m.Arguments, true)
		if got != want || (gerr == nil) != (werr == nil) {
			t.Errorf("%s: read path %q, %v; ArgumentDigest %q, %v", args, got, gerr, want, werr)
		}
	}
}
