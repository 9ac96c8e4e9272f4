package authz_test

import (
	"bytes"
	"testing"

	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/manifest"
)

// FuzzStoredArgumentsKeepTheirDigest: a formation takes the argument
// digest over the arguments as received, then stores them in canonical
// form (manifest.CanonicalJSON), and that stored form is what approvers
// see and policies decide over. Both must be the same call: whatever
// fencecheck's digest accepts, the canonical form exists and has the
// same digest.
//
// go test -run '^$' -fuzz FuzzStoredArgumentsKeepTheirDigest ./authz/
func FuzzStoredArgumentsKeepTheirDigest(f *testing.F) {
	for _, seed := range []string{
		`{}`, `{"name":"x","private":true}`, `{"n":1.0,"m":1e2,"k":0.10,"z":-0}`,
		`{"s":"\u003c\u00e9\ud83d\ude00","t":"\u2028"}`, `{"a":[{"b":[]},{"c":{}}]}`, `{"big":9007199254740992}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		d, err := fencecheck.ArgumentDigest("github/create_repository", raw)
		if err != nil {
			return
		}
		if t := bytes.Trim(raw, " \t\n\r"); len(t) == 0 || bytes.Equal(t, []byte("null")) {
			raw = []byte("{}") // as Form does: no arguments are the empty object
		}
		canon, err := manifest.CanonicalJSON(raw)
		if err != nil {
			t.Fatalf("fencecheck accepts %q but it has no canonical form: %v", raw, err)
		}
		if d2, err := fencecheck.ArgumentDigest("github/create_repository", canon); err != nil || d2 != d {
			t.Fatalf("stored form %q of %q: digest %s (%v), want %s", canon, raw, d2, err, d)
		}
	})
}
