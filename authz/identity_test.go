package authz_test

import (
	"testing"

	"github.com/fcd-authz/fcd/authz"
)

func TestSameIdentity(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{"alice", "alice", true},
		{"Alice ", "alice", true},
		{"\tALICE\n", "alice", true},
		{"Jos\u00e9", "Jose\u0301", true}, // precomposed and decomposed é (NFC)
		{"ſam", "sam", true},              // Unicode simple folding, as member names
		{"alice", "alicе", false},         // Cyrillic е is another letter
		{"alice", "bob", false},
		{"", "", false}, // nobody is nobody else
		{" ", "", false},
	} {
		if got := authz.SameIdentity(tc.a, tc.b); got != tc.same {
			t.Errorf("SameIdentity(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.same)
		}
	}
}
