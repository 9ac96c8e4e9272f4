package audit_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/audit"
	"github.com/lestrrat-go/jwx/v2/jwk"
)

// ev is one event of a synthetic history.
type ev struct {
	kind string
	rev  int64
	data map[string]any
}

type m = map[string]any

// cleanHistory is a history that keeps every property. In session S1:
// srv/a, a write needing one approval, approved by another than its
// principal, admitted to an ACTIVE epoch, claimed once, one effect; srv/b,
// which requires srv/a, admitted after it completed, reported uncertain
// and resolved by an operator; srv/c marked uncertain by the sweep and
// released by a newer generation of its pool. Then E1 drained and retired
// with nothing open, and a call admitted to the successor E2 it captured
// through certificate C1. Every formation was decided by the policy set
// the replica had in force.
func cleanHistory() []ev {
	formation := func(id, tool string, rev int64, approvals int, successor any) ev {
		return ev{"formation", rev, m{"id": id, "session": "S1", "tool": tool, "principal": "alice", "digest": "d" + id,
			"approvalsRequired": approvals, "source": m{"epoch": "E1"}, "successor": successor,
			"decision": m{"policyDigest": "P1"}}}
	}
	admission := func(f, l, tool, epoch string, rev int64, extra m) ev {
		d := m{"formation": f, "lease": l, "session": "S1", "tool": tool, "target": m{"epoch": epoch, "pool": "p1"},
			"generation": 0, "successor": false}
		for k, v := range extra {
			d[k] = v
		}
		return ev{"admission", rev, d}
	}
	return []ev{
		{"policy", 0, m{"digest": "P1", "source": "embedded"}},
		{"certificate", 5, m{"certificate": "C1"}},
		formation("F1", "srv/a", 10, 1, nil),
		{"approval", 11, m{"formation": "F1", "approver": "bob", "decision": "approve", "digest": "dF1"}},
		admission("F1", "L1", "srv/a", "E1", 12, nil),
		{"claim", 12, m{"lease": "L1", "claim": "c1", "epoch": "E1"}},
		formation("F2", "srv/a", 13, 0, m{"epoch": "E2", "certificate": "C1"}),
		{"outcome", 14, m{"lease": "L1", "outcome": "effect", "claim": "c1", "by": "backend"}},
		formation("F3", "srv/b", 15, 0, nil),
		admission("F3", "L3", "srv/b", "E1", 16, m{"requires": []string{"srv/a"}, "exclusiveWith": []string{"srv/x"}}),
		{"outcome", 17, m{"lease": "L3", "outcome": "uncertain", "claim": "c3", "by": "backend"}},
		{"resolution", 18, m{"lease": "L3", "outcome": "no_effect", "by": "operator", "operator": "ops"}},
		formation("F4", "srv/c", 18, 0, nil),
		admission("F4", "L4", "srv/c", "E1", 19, nil),
		{"outcome", 20, m{"lease": "L4", "outcome": "uncertain", "by": "sweep"}},
		{"generation", 21, m{"pool": "p1", "generation": 1, "released": []string{"L4"}}},
		{"outcome", 22, m{"lease": "L4", "outcome": "released", "by": "generation", "generation": 1}},
		{"drain", 23, m{"epoch": "E1"}},
		{"retire", 24, m{"epoch": "E1"}},
		admission("F2", "L2", "srv/a", "E2", 26, m{"successor": true, "certificate": "C1"}),
	}
}

// TestPropertiesOverHistory: a clean history verifies; each violation
// injected into it is named by its property.
func TestPropertiesOverHistory(t *testing.T) {
	key, keys := newKey(t, "k1")
	// find is the index of the event of kind whose member k is v.
	find := func(h []ev, kind, k, v string) int {
		for i, e := range h {
			if e.kind == kind && e.data[k] == v {
				return i
			}
		}
		t.Fatalf("no %s with %s=%s", kind, k, v)
		return -1
	}
	admission := func(h []ev, lease string) m { return h[find(h, "admission", "lease", lease)].data }
	for _, tc := range []struct {
		name string
		edit func(h []ev) []ev
		want string // "" for a clean history
	}{
		{"clean", func(h []ev) []ev { return h }, ""},

		{"no approval", func(h []ev) []ev { return slices.Delete(h, 3, 4) }, audit.PropApproval},
		{"approved by its principal", func(h []ev) []ev { h[3].data["approver"] = "ALICE"; return h }, audit.PropApproval},
		{"approved another digest", func(h []ev) []ev { h[3].data["digest"] = "d0"; return h }, audit.PropApproval},
		{"one approver twice for two needed", func(h []ev) []ev {
			h[2].data["approvalsRequired"] = 2
			return slices.Insert(h, 4, ev{"approval", 11, m{"formation": "F1", "approver": "Bob", "decision": "approve", "digest": "dF1"}})
		}, audit.PropApproval},
		{"denied, then admitted", func(h []ev) []ev {
			return slices.Insert(h, 4, ev{"approval", 11, m{"formation": "F1", "approver": "carol", "decision": "deny", "digest": "dF1"}})
		}, audit.PropApproval},

		{"history compacted before it was recorded", func(h []ev) []ev {
			return append(h, ev{"gap", 40, m{"from": 30, "to": 40}})
		}, audit.PropHistory},
		{"a token issued again for a closed lease", func(h []ev) []ev {
			return append(h, ev{"readmission", 40, m{"lease": "L1", "formation": "F1"}})
		}, audit.PropReadmission},
		{"a token issued again for an open lease", func(h []ev) []ev {
			i := find(h, "admission", "lease", "L1")
			return slices.Insert(h, i+1, ev{"readmission", 12, m{"lease": "L1", "formation": "F1"}})
		}, ""},

		{"admitted before formed", func(h []ev) []ev { h[find(h, "admission", "lease", "L1")].rev = 9; return h }, audit.PropFormed},
		{"an unknown formation admitted", func(h []ev) []ev { admission(h, "L1")["formation"] = "F9"; return h }, audit.PropFormed},

		{"admitted after the drain", func(h []ev) []ev { h[find(h, "drain", "epoch", "E1")].rev = 11; return h }, audit.PropEpochActive},

		{"successor before the source retired", func(h []ev) []ev { h[find(h, "retire", "epoch", "E1")].rev = 27; return h }, audit.PropSuccessor},
		{"successor never captured", func(h []ev) []ev { h[find(h, "formation", "id", "F2")].data["successor"] = nil; return h }, audit.PropSuccessor},
		{"successor through another certificate", func(h []ev) []ev { admission(h, "L2")["certificate"] = "C9"; return h }, audit.PropSuccessor},
		{"successor through a revoked certificate", func(h []ev) []ev {
			return append(h[:len(h)-1], ev{"revocation", 25, m{"certificate": "C1"}}, h[len(h)-1])
		}, audit.PropSuccessor},
		{"a certificate captured before it was registered", func(h []ev) []ev { h[find(h, "certificate", "certificate", "C1")].rev = 13; return h }, audit.PropSuccessor},

		{"admitted before what it requires completed", func(h []ev) []ev { admission(h, "L3")["requires"] = []string{"srv/z"}; return h }, audit.PropSession},
		{"admitted after an exclusive tool completed", func(h []ev) []ev { admission(h, "L3")["exclusiveWith"] = []string{"srv/a"}; return h }, audit.PropSession},
		{"admitted while an exclusive tool is admitted", func(h []ev) []ev {
			admission(h, "L4")["exclusiveWith"] = []string{"srv/b"}
			h[find(h, "resolution", "lease", "L3")].rev = 30
			return h
		}, audit.PropSession},

		{"a second claim", func(h []ev) []ev {
			return slices.Insert(h, 6, ev{"claim", 12, m{"lease": "L1", "claim": "c2", "epoch": "E1"}})
		}, audit.PropOneClaim},
		{"a second effect", func(h []ev) []ev {
			return slices.Insert(h, 8, ev{"outcome", 14, m{"lease": "L1", "outcome": "effect", "claim": "c1", "by": "backend"}})
		}, audit.PropOneEffect},

		{"retired with an open lease", func(h []ev) []ev {
			return slices.Delete(h, find(h, "outcome", "lease", "L1"), find(h, "outcome", "lease", "L1")+1)
		}, audit.PropRetire},
		{"retired with an uncertain lease", func(h []ev) []ev { h[find(h, "resolution", "lease", "L3")].rev = 25; return h }, audit.PropRetire},

		{"an uncertain lease closed by its backend", func(h []ev) []ev {
			h[find(h, "resolution", "lease", "L3")] = ev{"outcome", 18, m{"lease": "L3", "outcome": "effect", "claim": "c3", "by": "backend"}}
			return h
		}, audit.PropUncertain},
		{"an uncertain lease released by its own generation", func(h []ev) []ev {
			h[find(h, "outcome", "by", "generation")].data["generation"] = 0
			return h
		}, audit.PropUncertain},
		{"a resolution of a lease not uncertain", func(h []ev) []ev {
			return slices.Delete(h, find(h, "outcome", "lease", "L3"), find(h, "outcome", "lease", "L3")+1)
		}, audit.PropUncertain},

		{"decided by a set not in force", func(h []ev) []ev {
			h[find(h, "formation", "id", "F3")].data["decision"] = m{"policyDigest": "P0"}
			return h
		}, audit.PropPolicy},
		{"decided before a reload put another set in force", func(h []ev) []ev {
			return slices.Insert(h, 7, ev{"policy", 0, m{"digest": "P2"}})
		}, audit.PropPolicy},
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

// TestPropertiesAcrossReplicas: the properties are checked over the
// chains of every replica merged by etcd revision — a call formed and
// drained on one replica and admitted on another verifies, and the same
// admission placed after the other replica's drain is named.
func TestPropertiesAcrossReplicas(t *testing.T) {
	key, keys := newKey(t, "k1")
	for _, tc := range []struct {
		name     string
		admitted int64
		want     string
	}{
		{"admitted before the drain", 12, ""},
		{"admitted after the drain", 21, audit.PropEpochActive},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			chains := map[string][]ev{
				"r1": {
					{"formation", 10, m{"id": "F1", "session": "S", "tool": "srv/a", "principal": "alice", "digest": "d",
						"approvalsRequired": 0, "source": m{"epoch": "E1"}, "successor": nil, "decision": m{"policyDigest": "P"}}},
					{"drain", 20, m{"epoch": "E1"}},
				},
				"r2": {
					{"admission", tc.admitted, m{"formation": "F1", "lease": "L1", "session": "S", "tool": "srv/a",
						"target": m{"epoch": "E1", "pool": "p"}, "generation": 0, "successor": false}},
				},
			}
			for replica, events := range chains {
				writeChain(t, root, replica, key, events)
			}
			checkReport(t, mustVerify(t, root, keys), 2, tc.want)
		})
	}
}

// TestPropertiesOverFollowedChains: replicas whose trails follow the store
// each hold the whole history, the same events at the same revisions.
// Verified together, an event several chains hold counts once (the clean
// history stays clean: its one effect, one claim are not repeats), while a
// second effect of a lease in one chain is still named. Policy events name
// the replica that put the set in force; a decision must name a set some
// replica had in force.
func TestPropertiesOverFollowedChains(t *testing.T) {
	key, keys := newKey(t, "k1")
	followed := func() []ev {
		h := cleanHistory()
		for i, e := range h {
			if e.kind == "policy" {
				h[i].rev = 1
				h[i].data["replica"] = "r1"
			}
		}
		return h
	}
	for _, tc := range []struct {
		name string
		edit func(h []ev) []ev
		want string
	}{
		{"clean", func(h []ev) []ev { return h }, ""},
		{"a second effect in one chain", func(h []ev) []ev {
			return append(h, ev{"outcome", 30, m{"lease": "L1", "outcome": "effect", "claim": "c1", "by": "backend"}})
		}, audit.PropOneEffect},
		{"decided by a set no replica had", func(h []ev) []ev {
			for i, e := range h {
				if e.kind == "formation" && e.data["id"] == "F3" {
					h[i].data["decision"] = m{"policyDigest": "P9"}
				}
			}
			return h
		}, audit.PropPolicy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for i, replica := range []string{"r1", "r2"} {
				h := followed()
				if i == 1 {
					h = tc.edit(h)
				}
				writeChain(t, root, replica, key, h)
			}
			checkReport(t, mustVerify(t, root, keys), 2, tc.want)
		})
	}
}

// writeChain records events as replica's chain under root.
func writeChain(t *testing.T, root, replica string, key jwk.Key, events []ev) {
	t.Helper()
	tr, err := audit.Open(audit.Config{Root: root, Replica: replica, Key: key, CheckpointInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events {
		if err := tr.Record(context.Background(), e.kind, e.rev, e.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
}

// checkReport fails t unless r verified chains chains and is clean (want
// "") or names want.
func checkReport(t *testing.T, r *audit.Report, chains int, want string) {
	t.Helper()
	switch {
	case len(r.Chains) != chains:
		t.Fatalf("%d chains verified, want %d", len(r.Chains), chains)
	case want == "" && !r.OK:
		t.Fatalf("a clean history fails:\n%s", r.Summary())
	case want != "" && !hasProblem(r, want):
		t.Fatalf("want %s, got:\n%s", want, r.Summary())
	}
}
