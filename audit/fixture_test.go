package audit_test

import (
	"context"
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
// the operator keys — and its events, which state no schema, read as
// schema 1.
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
	events, err := audit.FormationHistory(filepath.Join(trailV1, "trails"), "fm_one")
	if err != nil || len(events) == 0 {
		t.Fatalf("history of fm_one: %v, %d events", err, len(events))
	}
	for _, ev := range events {
		if ev.Schema != 0 || audit.SchemaOf(ev) != audit.SchemaV1 {
			t.Errorf("event %d states schema %d, reads as %d; want none, read as %d", ev.Seq, ev.Schema, audit.SchemaOf(ev), audit.SchemaV1)
		}
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

// TestVerifyRefusesAnUnknownSchema: an event whose data states a schema
// version newer than the verifier reads is reported (ProblemSchema),
// not read as if it were a known one; a known version and none pass.
func TestVerifyRefusesAnUnknownSchema(t *testing.T) {
	key, keys := newKey(t, "k1")
	for _, tc := range []struct {
		name   string
		schema int
		ok     bool
	}{
		{"no version (schema 1)", 0, true},
		{"the latest", audit.LatestSchema, true},
		{"a newer one", audit.LatestSchema + 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			tr, err := audit.Open(audit.Config{Root: root, Replica: "r1", Key: key})
			if err != nil {
				t.Fatal(err)
			}
			if err := tr.Append(context.Background(), []audit.Entry{{Kind: "drain", Schema: tc.schema, Revision: 3,
				Data: map[string]string{"epoch": "e", "state": "DRAINING", "by": "op"}}}); err != nil {
				t.Fatal(err)
			}
			if err := tr.Close(); err != nil {
				t.Fatal(err)
			}
			r, err := audit.Verify(root, keys)
			if err != nil {
				t.Fatal(err)
			}
			if r.OK != tc.ok || !tc.ok && (len(r.Problems) != 1 || r.Problems[0].ID != audit.ProblemSchema) {
				t.Fatalf("ok %v, want %v:\n%s", r.OK, tc.ok, r.Summary())
			}
		})
	}
}
