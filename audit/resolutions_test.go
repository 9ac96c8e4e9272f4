package audit_test

import (
	"context"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/audit"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/lestrrat-go/jwx/v2/jwk"
)

// TestResolutionsVerifyAgainstTheOperatorKeys: given the operator keys,
// verify checks again every signed resolution the trail keeps — a
// resolution no operator key signed, one issued far from when it was
// recorded, one whose document names another lease or outcome, operator,
// key or digest than its event, or none at all, is named with its problem
// id; a genuine one is clean. Without the operator keys resolutions are
// not checked.
func TestResolutionsVerifyAgainstTheOperatorKeys(t *testing.T) {
	signing, keys := newKey(t, "trail")
	operator, operatorKeys := newKey(t, "op-1")
	stranger, _ := newKey(t, "op-1") // same kid, another key
	now := time.Now().UTC().Truncate(time.Second)
	sign := func(key jwk.Key, lease, outcome string, at time.Time) *manifest.SignedResolution {
		t.Helper()
		jws, err := manifest.SignResolution(&manifest.Resolution{Lease: lease, Outcome: outcome, Reason: "checked the backend's log",
			Operator: "dana", IssuedAt: at}, key)
		if err != nil {
			t.Fatal(err)
		}
		sr, err := manifest.ReadVerifiedResolution(jws)
		if err != nil {
			t.Fatal(err)
		}
		return sr
	}
	signed := func(sr *manifest.SignedResolution) map[string]any {
		return map[string]any{"kid": sr.KeyID, "operator": sr.Resolution.Operator, "digest": sr.Digest,
			"issuedAt": sr.Resolution.IssuedAt, "jws": sr.JWS}
	}
	event := func(lease, outcome string, s map[string]any) map[string]any {
		d := map[string]any{"lease": lease, "outcome": outcome, "by": "operator", "operator": "operator-cred", "reason": "checked"}
		if s != nil {
			d["signed"] = s
		}
		return d
	}
	genuine := sign(operator, "ls_1", manifest.ResolutionNoEffect, now)
	withOperator := func(name string) map[string]any {
		s := signed(genuine)
		s["operator"] = name
		return s
	}
	for _, c := range []struct {
		name string
		data map[string]any
		want string // problem id; "" for clean
	}{
		{"genuine", event("ls_1", "no_effect", signed(genuine)), ""},
		{"unsigned", event("ls_1", "no_effect", nil), audit.ProblemResolutionUnsigned},
		{"another key under the kid", event("ls_1", "no_effect", signed(sign(stranger, "ls_1", manifest.ResolutionNoEffect, now))), audit.ProblemResolutionSignature},
		{"issued two hours before", event("ls_1", "no_effect", signed(sign(operator, "ls_1", manifest.ResolutionNoEffect, now.Add(-2*time.Hour)))), audit.ProblemResolutionSignature},
		{"another lease", event("ls_2", "no_effect", signed(genuine)), audit.ProblemResolutionMismatch},
		{"another outcome", event("ls_1", "effect", signed(genuine)), audit.ProblemResolutionMismatch},
		{"another operator", event("ls_1", "no_effect", withOperator("mallory")), audit.ProblemResolutionMismatch},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			tr, err := audit.Open(audit.Config{Root: root, Replica: "r1", Key: signing, CheckpointEvery: 4, CheckpointInterval: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			if err := tr.Record(context.Background(), "resolution", 7, c.data); err != nil {
				t.Fatal(err)
			}
			if err := tr.Close(); err != nil {
				t.Fatal(err)
			}
			r, err := audit.VerifyConfig{Keys: keys, OperatorKeys: operatorKeys}.Verify(root)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, p := range r.Problems {
				ids = append(ids, p.ID)
			}
			switch {
			case c.want == "" && !r.OK:
				t.Fatalf("a genuine resolution: %v", r.Problems)
			case c.want != "" && (r.OK || len(ids) != 1 || ids[0] != c.want):
				t.Fatalf("problems %v, want one %s", r.Problems, c.want)
			}
			if without := mustVerify(t, root, keys); !without.OK {
				t.Fatalf("without the operator keys: %v", without.Problems)
			}
		})
	}
}
