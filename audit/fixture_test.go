package audit_test

import (
	"path/filepath"
	"testing"

	"github.com/fcd-authz/fcd/audit"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/lestrrat-go/jwx/v2/jwk"
)

// trailV1 is a trail written before the events had a schema member
// (testdata/trail-v1: replica r1's chain of one history with an event of
// every kind but gap, its checkpoint key's JWKS, and the operator key
// that signed its resolution). It is never regenerated: it is what
// trails already on disk look like, and they must go on verifying.
var trailV1 = filepath.Join("testdata", "trail-v1")

// TestVerifiesTrailsOfSchemaV1: a trail of the first format verifies —
// chains, signatures, every property, and its signed resolution against
// the operator keys.
func TestVerifiesTrailsOfSchemaV1(t *testing.T) {
	keys := loadKeys(t, filepath.Join(trailV1, "jwks.json"))
	ops := loadKeys(t, filepath.Join(trailV1, "operator-keys.json"))
	r, err := audit.VerifyConfig{Keys: keys, OperatorKeys: ops}.Verify(filepath.Join(trailV1, "trails"))
	if err != nil || !r.OK {
		t.Fatalf("verify: %v\n%s", err, r.Summary())
	}
	if len(r.Chains) != 1 || r.Chains[0].Events != 31 || r.Chains[0].Signed != 31 {
		t.Fatalf("chains %+v, want r1's 31 events, all signed", r.Chains)
	}
}

func loadKeys(t *testing.T, path string) jwk.Set {
	t.Helper()
	set, err := manifest.LoadKeySet(path)
	if err != nil {
		t.Fatal(err)
	}
	return set
}
