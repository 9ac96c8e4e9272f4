package usertext

import "testing"

func TestProblems(t *testing.T) {
	cases := []struct {
		text string
		bad  bool
	}{
		{`/arguments is not a known member (did you mean "arguments"?) (at byte 1)`, false},
		{`/tools/2/sideEffects must be one of none, read, write, delete`, false},
		{`source epoch is stale and no successor is eligible`, false},
		{`lint found 1 error(s): approval-required at /tools/2/requiresApproval: needs approval`, false},
		{`json: cannot unmarshal JSON string into Go api.formationRequest: unknown object member name "argument"`, true},
		{`authz: admit fm_1: authz: source epoch is stale`, true},
		{`cannot unmarshal number into Go struct field Config.dev of type bool`, true},
		{`must be map[string]any`, true},
		{`must be []string`, true},
		{`jsontext: invalid character`, true},
		{"two\nlines", true},
		{"cannot read /tmp/manifest.json: no such file or directory", false},
		{"into Go value of type manifest.Tool", true},
		{`error converting YAML to JSON: yaml: line 2`, true},
		{`not a JWS: invalid byte sequence`, false}, // jwx's words, but no Go type: caught by the tests that want the sign command
	}
	for _, tc := range cases {
		if got := Problems(tc.text); (len(got) > 0) != tc.bad {
			t.Errorf("Problems(%q) = %q, want bad=%v", tc.text, got, tc.bad)
		}
	}
}
