package policies_test

import (
	"context"
	"strings"
	"testing"

	"github.com/fcd-authz/fcd/authz/policy"
	"github.com/fcd-authz/fcd/policies"
)

// TestDefaultPolicies runs the default set's own tests — the Rego unit
// tests and the Cedar cases — exactly as authzd does before it uses a set,
// so `go test ./...` fails on any failure.
func TestDefaultPolicies(t *testing.T) {
	rep, err := policy.RunTests(context.Background(), policies.FS)
	if err != nil {
		t.Fatalf("RunTests: %v", err)
	}
	var out strings.Builder
	if !rep.Print(&out, testing.Verbose()) {
		t.Fatalf("default policy tests failed:\n%s", out.String())
	}
	t.Log(out.String())
	for _, engine := range []string{policy.EngineRego, policy.EngineCedar} {
		n := 0
		for _, r := range rep.Results {
			if r.Engine == engine {
				n++
			}
		}
		if n == 0 {
			t.Errorf("no %s tests ran", engine)
		}
	}
}

// TestDefaultPoliciesLoad checks that the embedded set loads as authzd
// loads it when no policy directory is given.
func TestDefaultPoliciesLoad(t *testing.T) {
	s, err := policy.Load(context.Background(), policies.FS)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	want := []string{"fcd.cases.json", "fcd.cedar", "fcd.rego", "fcd_test.rego"}
	if got := s.Files(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("Files() = %v, want %v", got, want)
	}
	if !strings.HasPrefix(s.Digest(), "sha256:") {
		t.Errorf("Digest() = %q", s.Digest())
	}
}
