package fencecheck_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/fcd-authz/fcd/fencecheck"
)

// FuzzArgumentDigestSurvivesReencoding: a host forms a call with the
// arguments as the model wrote them, and the backend's MCP stack may
// decode and encode them again before fencecheck sees them (another
// member order, whitespace, escapes, number spelling). Whatever digest
// ArgumentDigest accepts must be the digest of every such re-encoding, or
// a valid call would be refused — and it must refuse what it cannot carry
// exactly, never give two different calls one digest.
//
// go test -run '^$' -fuzz FuzzArgumentDigestSurvivesReencoding ./fencecheck/
func FuzzArgumentDigestSurvivesReencoding(f *testing.F) {
	for _, seed := range []string{
		`{}`, `{"name":"x","private":true}`, `{"b":1,"a":[1,2,{"c":null}]}`,
		`{"n":1.0,"m":1e2,"k":0.10,"big":9007199254740992}`, `{"s":"\u003c\u00e9\ud83d\ude00"}`,
		`{"a":{"b":{"c":[[],{}]}}}`, ` { "x" : -0 } `, `{"x":123456789012345678}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		d1, err := fencecheck.ArgumentDigest("github/create_repository", raw)
		if err != nil {
			return
		}
		if d2, err := fencecheck.ArgumentDigest("github/create_repository", raw); err != nil || d2 != d1 {
			t.Fatalf("not deterministic: %s then %s (%v)", d1, d2, err)
		}
		if d3, err := fencecheck.ArgumentDigest("github/delete_repository", raw); err != nil || d3 == d1 {
			t.Fatalf("the tool name does not change the digest: %s (%v)", d3, err)
		}
		if t := bytes.TrimSpace(raw); len(t) == 0 || bytes.Equal(t, []byte("null")) {
			raw = []byte("{}") // no arguments are the empty object
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("accepted arguments encoding/json cannot decode: %q: %v", raw, err)
		}
		for _, enc := range []func(any) ([]byte, error){
			json.Marshal,
			func(v any) ([]byte, error) { return json.MarshalIndent(v, "", "  ") },
		} {
			again, err := enc(v)
			if err != nil {
				t.Fatal(err)
			}
			d, err := fencecheck.ArgumentDigest("github/create_repository", again)
			if err != nil || d != d1 {
				t.Fatalf("re-encoded %q as %q: digest %s (%v), want %s", raw, again, d, err, d1)
			}
		}
	})
}
