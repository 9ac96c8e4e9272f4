package audit_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/audit"
)

// ev is one event of a synthetic history.
type ev struct {
	kind string
	rev  int64
	data map[string]any
}

// cleanHistory is a history that keeps every property: a write needing
// one approval, approved by another than its principal, admitted to an
// ACTIVE epoch, claimed once, one effect; the epoch drained and retired;
// then a call admitted to the successor it captured.
func cleanHistory() []ev {
	return []ev{
		{"formation", 10, map[string]any{"id": "F1", "principal": "alice", "digest": "d1", "approvalsRequired": 1,
			"source": map[string]any{"epoch": "E1"}, "successor": nil}},
		{"approval", 11, map[string]any{"formation": "F1", "approver": "bob", "decision": "approve", "digest": "d1"}},
		{"admission", 12, map[string]any{"formation": "F1", "lease": "L1", "target": map[string]any{"epoch": "E1"}, "successor": false}},
		{"claim", 12, map[string]any{"lease": "L1", "claim": "c1", "epoch": "E1"}},
		{"outcome", 0, map[string]any{"lease": "L1", "outcome": "effect", "claim": "c1", "by": "backend"}},
		{"formation", 13, map[string]any{"id": "F2", "principal": "alice", "digest": "d2", "approvalsRequired": 0,
			"source": map[string]any{"epoch": "E1"}, "successor": map[string]any{"epoch": "E2"}}},
		{"drain", 20, map[string]any{"epoch": "E1"}},
		{"retire", 21, map[string]any{"epoch": "E1"}},
		{"admission", 23, map[string]any{"formation": "F2", "lease": "L2", "target": map[string]any{"epoch": "E2"}, "successor": true}},
	}
}

// TestPropertiesOverHistory: a clean history verifies; each violation
// injected into it — a missing, self-made, mismatched or duplicated
// approval, a denial, a reordered admission, an admission after a drain,
// a successor before its source retired or never captured, a second
// claim, a second effect — is named by its property.
func TestPropertiesOverHistory(t *testing.T) {
	key, keys := newKey(t, "k1")
	at := func(h []ev, kind string, n int) int { // index of the n-th event of kind
		for i, e := range h {
			if e.kind == kind {
				if n == 0 {
					return i
				}
				n--
			}
		}
		t.Fatalf("no %s #%d", kind, n)
		return -1
	}
	for _, tc := range []struct {
		name string
		edit func(h []ev) []ev
		want string // "" for a clean history
	}{
		{"clean", func(h []ev) []ev { return h }, ""},
		{"no approval", func(h []ev) []ev { return slices.Delete(h, 1, 2) }, audit.PropApproval},
		{"approved by its principal", func(h []ev) []ev { h[1].data["approver"] = "ALICE"; return h }, audit.PropApproval},
		{"approved another digest", func(h []ev) []ev { h[1].data["digest"] = "d0"; return h }, audit.PropApproval},
		{"one approver twice for two needed", func(h []ev) []ev {
			h[0].data["approvalsRequired"] = 2
			return slices.Insert(h, 2, ev{"approval", 11, map[string]any{"formation": "F1", "approver": "Bob", "decision": "approve", "digest": "d1"}})
		}, audit.PropApproval},
		{"denied, then admitted", func(h []ev) []ev {
			return slices.Insert(h, 2, ev{"approval", 11, map[string]any{"formation": "F1", "approver": "carol", "decision": "deny", "digest": "d1"}})
		}, audit.PropApproval},
		{"admitted before formed", func(h []ev) []ev { h[at(h, "admission", 0)].rev = 9; return h }, audit.PropFormed},
		{"an unknown formation admitted", func(h []ev) []ev { h[at(h, "admission", 0)].data["formation"] = "F9"; return h }, audit.PropFormed},
		{"admitted after the drain", func(h []ev) []ev { h[at(h, "drain", 0)].rev = 11; return h }, audit.PropEpochActive},
		{"successor before the source retired", func(h []ev) []ev { h[at(h, "retire", 0)].rev = 24; return h }, audit.PropSuccessor},
		{"successor never captured", func(h []ev) []ev { h[5].data["successor"] = nil; return h }, audit.PropSuccessor},
		{"a second claim", func(h []ev) []ev {
			return slices.Insert(h, 4, ev{"claim", 12, map[string]any{"lease": "L1", "claim": "c2", "epoch": "E1"}})
		}, audit.PropOneClaim},
		{"a second effect", func(h []ev) []ev {
			return slices.Insert(h, 5, ev{"outcome", 0, map[string]any{"lease": "L1", "outcome": "effect", "claim": "c1", "by": "backend"}})
		}, audit.PropOneEffect},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			tr, err := audit.Open(audit.Config{Root: root, Replica: "r1", Key: key, CheckpointInterval: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range tc.edit(cleanHistory()) {
				if err := tr.Record(context.Background(), e.kind, e.rev, e.data); err != nil {
					t.Fatal(err)
				}
			}
			if err := tr.Close(); err != nil {
				t.Fatal(err)
			}
			r := mustVerify(t, root, keys)
			switch {
			case tc.want == "" && !r.OK:
				t.Fatalf("a clean history fails:\n%s", r.Summary())
			case tc.want != "" && !hasProblem(r, tc.want):
				t.Fatalf("want %s, got:\n%s", tc.want, r.Summary())
			}
		})
	}
}
