package audit

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Property ids: the safety properties Verify checks over the history all
// chains record, merged by etcd revision.
const (
	// PropFormed: every admission is of a call the trail saw formed
	// before it.
	PropFormed = "property.admission-of-a-formed-call"
	// PropApproval: a call needing N approvals was admitted only after N
	// distinct approvals of the digest it was formed with, none by its
	// principal, and no denial.
	PropApproval = "property.approval-before-admission"
	// PropEpochActive: no admission to an epoch after its drain.
	PropEpochActive = "property.admission-epoch-active"
	// PropSuccessor: an admission to a successor only for a call that
	// captured one, and only after its source epoch retired.
	PropSuccessor = "property.successor-after-retire"
	// PropOneClaim: a lease is claimed under one claim id at most.
	PropOneClaim = "property.one-claim-per-lease"
	// PropOneEffect: a lease reports an effect once at most.
	PropOneEffect = "property.one-effect-per-lease"
)

var propertyChecks = []string{
	PropFormed + ": every admission is of a call formed before it",
	PropApproval + ": every admission follows the approvals its call needed (distinct approvers of its digest, not its principal) and no denial",
	PropEpochActive + ": no admission to an epoch after its drain",
	PropSuccessor + ": an admission to a successor only for a call that captured one, after its source retired",
	PropOneClaim + ": a lease is claimed under one claim id at most",
	PropOneEffect + ": a lease reports an effect once at most",
}

// placed is an event and where it was read.
type placed struct {
	Event
	file string
	line int
}

// The members of the events the properties read; the event kinds and
// their data are those authz records (authz/trail.go).
type (
	formationData struct {
		ID                string `json:"id"`
		Principal         string `json:"principal"`
		Digest            string `json:"digest"`
		ApprovalsRequired int    `json:"approvalsRequired"`
		Source            struct {
			Epoch string `json:"epoch"`
		} `json:"source"`
		Successor *struct {
			Epoch string `json:"epoch"`
		} `json:"successor"`
	}
	approvalData struct {
		Formation string `json:"formation"`
		Approver  string `json:"approver"`
		Decision  string `json:"decision"`
		Digest    string `json:"digest"`
	}
	admissionData struct {
		Formation string `json:"formation"`
		Lease     string `json:"lease"`
		Target    struct {
			Epoch string `json:"epoch"`
		} `json:"target"`
		Successor bool `json:"successor"`
	}
	leaseData struct {
		Lease   string `json:"lease"`
		Claim   string `json:"claim"`
		Outcome string `json:"outcome"`
	}
	epochData struct {
		Epoch string `json:"epoch"`
	}
)

// checkProperties checks the properties over events of every chain.
func checkProperties(events []placed) []Problem {
	// etcd's order: the revision; events of one revision (a batch) and
	// those the store gave no revision keep their chains' order.
	slices.SortStableFunc(events, func(a, b placed) int { return cmp.Compare(a.Revision, b.Revision) })
	var problems []Problem
	bad := func(ev placed, id, format string, args ...any) {
		problems = append(problems, Problem{ID: id, Replica: ev.Replica, File: ev.file, Line: ev.line, Seq: ev.Seq,
			Detail: fmt.Sprintf(format, args...)})
	}
	decode := func(ev placed, v any) bool {
		if err := json.Unmarshal(ev.Data, v); err != nil {
			bad(ev, ProblemLine, "the %s event's data does not decode: %v", ev.Kind, err)
			return false
		}
		return true
	}
	type formed struct {
		placed
		formationData
	}
	formations := map[string]*formed{}
	approvals := map[string][]approvalData{} // by formation, before the event at hand
	drained, retired := map[string]int64{}, map[string]int64{}
	claims, effects := map[string]string{}, map[string]bool{}
	for _, ev := range events {
		switch ev.Kind {
		case "formation":
			var d formationData
			if decode(ev, &d) {
				formations[d.ID] = &formed{ev, d}
			}
		case "approval":
			var d approvalData
			if decode(ev, &d) {
				approvals[d.Formation] = append(approvals[d.Formation], d)
			}
		case "drain", "retire":
			var d epochData
			if decode(ev, &d) {
				m := drained
				if ev.Kind == "retire" {
					m = retired
				}
				if _, ok := m[d.Epoch]; !ok {
					m[d.Epoch] = ev.Revision
				}
			}
		case "admission":
			var d admissionData
			if !decode(ev, &d) {
				continue
			}
			f := formations[d.Formation]
			if f == nil || f.Revision >= ev.Revision {
				bad(ev, PropFormed, "lease %s admits formation %s, which the trail does not show formed before revision %d", d.Lease, d.Formation, ev.Revision)
				continue
			}
			given := map[string]bool{}
			for _, a := range approvals[d.Formation] {
				switch {
				case a.Decision == "deny":
					bad(ev, PropApproval, "lease %s admits formation %s, which %s denied", d.Lease, d.Formation, a.Approver)
				case a.Digest == f.Digest && !strings.EqualFold(a.Approver, f.Principal):
					given[strings.ToLower(a.Approver)] = true
				}
			}
			if len(given) < f.ApprovalsRequired {
				bad(ev, PropApproval, "lease %s admits formation %s (digest %.19s…) with %d distinct approvals of it, %d needed",
					d.Lease, d.Formation, f.Digest, len(given), f.ApprovalsRequired)
			}
			if rev, ok := drained[d.Target.Epoch]; ok && rev < ev.Revision {
				bad(ev, PropEpochActive, "lease %s admitted at revision %d to epoch %.19s…, drained at revision %d", d.Lease, ev.Revision, d.Target.Epoch, rev)
			}
			if d.Successor {
				switch rev, ok := retired[f.Source.Epoch]; {
				case f.Successor == nil || f.Successor.Epoch != d.Target.Epoch:
					bad(ev, PropSuccessor, "lease %s admits formation %s to %.19s…, not a successor it captured", d.Lease, d.Formation, d.Target.Epoch)
				case !ok || rev >= ev.Revision:
					bad(ev, PropSuccessor, "lease %s admits formation %s to its successor before its source %.19s… retired", d.Lease, d.Formation, f.Source.Epoch)
				}
			}
		case "claim":
			var d leaseData
			if !decode(ev, &d) {
				continue
			}
			if prev, ok := claims[d.Lease]; ok && prev != d.Claim {
				bad(ev, PropOneClaim, "lease %s claimed under %q, already claimed under %q", d.Lease, d.Claim, prev)
			} else {
				claims[d.Lease] = d.Claim
			}
		case "outcome", "resolution":
			var d leaseData
			if !decode(ev, &d) || d.Outcome != "effect" {
				continue
			}
			if effects[d.Lease] {
				bad(ev, PropOneEffect, "lease %s reports an effect again", d.Lease)
			}
			effects[d.Lease] = true
		}
	}
	return problems
}
