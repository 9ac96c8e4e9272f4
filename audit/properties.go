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
	// captured one through a certificate, only after its source epoch
	// retired, and only while that certificate was unrevoked.
	PropSuccessor = "property.successor-after-retire"
	// PropSession: in each session, an admission only after every tool
	// it requires completed, and never while a tool it excludes is
	// admitted, completed or failed.
	PropSession = "property.session-dependencies"
	// PropOneClaim: a lease is claimed under one claim id at most.
	PropOneClaim = "property.one-claim-per-lease"
	// PropOneEffect: a lease reports an effect once at most.
	PropOneEffect = "property.one-effect-per-lease"
	// PropRetire: an epoch retires only with no open or uncertain lease.
	PropRetire = "property.retire-with-no-open-lease"
	// PropUncertain: an uncertain lease is closed only by an operator's
	// resolution or a newer generation of its pool, and a resolution
	// closes only an uncertain lease.
	PropUncertain = "property.uncertain-closed-by-resolution"
	// PropHistory: the chain holds the store's whole history (no gap
	// event: revisions compacted before its follower read them).
	PropHistory = "property.history-complete"
	// PropReadmission: a token is issued again only for an open lease.
	PropReadmission = "property.readmission-of-an-open-lease"
	// PropPolicy: each call was decided by the policy set the replica
	// that decided it had in force then.
	PropPolicy = "property.policy-in-force"
)

var propertyChecks = []string{
	PropFormed + ": every admission is of a call formed before it",
	PropApproval + ": every admission follows the approvals its call needed (distinct approvers of its digest, not its principal) and no denial",
	PropEpochActive + ": no admission to an epoch after its drain",
	PropSuccessor + ": an admission to a successor only for a call that captured one through a certificate, after its source retired, with the certificate unrevoked",
	PropSession + ": in each session, an admission follows the completion of every tool it requires and no admission, completion or failure of a tool it excludes",
	PropOneClaim + ": a lease is claimed under one claim id at most",
	PropOneEffect + ": a lease reports an effect once at most",
	PropRetire + ": an epoch retires with no open or uncertain lease",
	PropUncertain + ": an uncertain lease closes only by a resolution or a newer pool generation",
	PropHistory + ": the chain follows the store's history without a gap",
	PropReadmission + ": a token is issued again only for a lease that is open",
	PropPolicy + ": each call was decided by the policy set in force on its replica (once the chain records one)",
}

// placed is an event and where it was read.
type placed struct {
	Event
	file string
	line int
}

// The members of the events the properties read; the event kinds and
// their data are those authz records (authz/trail.go) and the policy
// manager's (authz/policy).
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
			Epoch       string `json:"epoch"`
			Certificate string `json:"certificate"`
		} `json:"successor"`
		Decision struct {
			PolicyDigest string `json:"policyDigest"`
		} `json:"decision"`
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
		Session   string `json:"session"`
		Tool      string `json:"tool"`
		Target    struct {
			Epoch string `json:"epoch"`
			Pool  string `json:"pool"`
		} `json:"target"`
		Generation  int64    `json:"generation"`
		Successor   bool     `json:"successor"`
		Certificate string   `json:"certificate"`
		Requires    []string `json:"requires"`
		Exclusive   []string `json:"exclusiveWith"`
	}
	leaseData struct {
		Lease      string `json:"lease"`
		Claim      string `json:"claim"`
		Outcome    string `json:"outcome"`
		By         string `json:"by"`
		Generation int64  `json:"generation"`
	}
	epochData struct {
		Epoch string `json:"epoch"`
	}
	certificateData struct {
		Certificate string `json:"certificate"`
	}
	policyData struct {
		Digest  string `json:"digest"`
		Replica string `json:"replica"`
	}
)

// openLease is a lease the history admitted and has not closed.
type openLease struct {
	admissionData
	uncertain bool
}

// session is what the history shows of one session, as the admission
// transaction's compares read the ledger.
type session struct {
	completed, failed map[string]bool
	admitted          map[string]map[string]bool // tool -> open leases
}

// checker holds the state of the history read so far.
type checker struct {
	problems   []Problem
	formations map[string]*placedFormation
	approvals  map[string][]approvalData // by formation
	drained    map[string]int64
	retired    map[string]int64
	revoked    map[string]int64 // certificate -> revision
	registered map[string]int64 // certificate -> revision
	leases     map[string]*openLease
	sessions   map[string]*session
	claims     map[string]string
	effects    map[string]bool
}

type placedFormation struct {
	placed
	formationData
}

func (c *checker) bad(ev placed, id, format string, args ...any) {
	c.problems = append(c.problems, Problem{ID: id, Replica: ev.Replica, File: ev.file, Line: ev.line, Seq: ev.Seq,
		Detail: fmt.Sprintf(format, args...)})
}

func (c *checker) decode(ev placed, v any) bool {
	if err := json.Unmarshal(ev.Data, v); err != nil {
		c.bad(ev, ProblemLine, "the %s event's data does not decode: %v", ev.Kind, err)
		return false
	}
	return true
}

func (c *checker) session(id string) *session {
	s := c.sessions[id]
	if s == nil {
		s = &session{completed: map[string]bool{}, failed: map[string]bool{}, admitted: map[string]map[string]bool{}}
		c.sessions[id] = s
	}
	return s
}

// checkProperties checks the properties over events of every chain, given
// chain by chain in each chain's order.
func checkProperties(events []placed) []Problem {
	c := &checker{
		formations: map[string]*placedFormation{}, approvals: map[string][]approvalData{},
		drained: map[string]int64{}, retired: map[string]int64{}, revoked: map[string]int64{}, registered: map[string]int64{},
		leases: map[string]*openLease{}, sessions: map[string]*session{}, claims: map[string]string{}, effects: map[string]bool{},
	}
	c.checkPolicies(events)
	// etcd's order: the revision; events of one revision (a batch) and
	// those the store gave no revision keep their chains' order.
	slices.SortStableFunc(events, func(a, b placed) int { return cmp.Compare(a.Revision, b.Revision) })
	events = distinct(events)
	for _, ev := range events {
		switch ev.Kind {
		case "formation":
			var d formationData
			if c.decode(ev, &d) {
				c.formations[d.ID] = &placedFormation{ev, d}
			}
		case "approval":
			var d approvalData
			if c.decode(ev, &d) {
				c.approvals[d.Formation] = append(c.approvals[d.Formation], d)
			}
		case "drain", "retire":
			var d epochData
			if !c.decode(ev, &d) {
				continue
			}
			m := c.drained
			if ev.Kind == "retire" {
				m = c.retired
				c.retire(ev, d.Epoch)
			}
			if _, ok := m[d.Epoch]; !ok {
				m[d.Epoch] = ev.Revision
			}
		case "certificate", "revocation":
			var d certificateData
			if !c.decode(ev, &d) {
				continue
			}
			m := c.registered
			if ev.Kind == "revocation" {
				m = c.revoked
			}
			if _, ok := m[d.Certificate]; !ok {
				m[d.Certificate] = ev.Revision
			}
		case "admission":
			var d admissionData
			if c.decode(ev, &d) {
				c.admit(ev, d)
			}
		case "claim":
			var d leaseData
			if !c.decode(ev, &d) {
				continue
			}
			if prev, ok := c.claims[d.Lease]; ok && prev != d.Claim {
				c.bad(ev, PropOneClaim, "lease %s claimed under %q, already claimed under %q", d.Lease, d.Claim, prev)
			} else {
				c.claims[d.Lease] = d.Claim
			}
		case "gap":
			var d struct{ From, To int64 }
			if c.decode(ev, &d) {
				c.bad(ev, PropHistory, "the store's revisions %d to %d were compacted before this chain recorded them", d.From, d.To)
			}
		case "readmission":
			var d leaseData
			if c.decode(ev, &d) && c.leases[d.Lease] == nil {
				c.bad(ev, PropReadmission, "a token issued again for lease %s, which is not open", d.Lease)
			}
		case "outcome", "resolution":
			var d leaseData
			if c.decode(ev, &d) {
				c.close(ev, d)
			}
		}
	}
	return c.problems
}

// distinct drops, from events sorted by revision, the repeats of an
// event in other chains: every replica's trail follows the same store
// history, so the chains of several replicas each hold the same event of a
// revision, with the same canonical data. The first chain's stands for
// all; a repeat within one chain is kept (the checks report it).
func distinct(events []placed) []placed {
	out := events[:0]
	var rev int64
	seen := map[string]string{} // event -> the chain that holds it first
	for _, ev := range events {
		if ev.Revision != rev {
			rev, seen = ev.Revision, map[string]string{}
		}
		if ev.Revision > 0 {
			k := ev.Kind + "\x00" + string(ev.Data)
			if chain, ok := seen[k]; ok && chain != ev.Replica {
				continue
			}
			seen[k] = ev.Replica
		}
		out = append(out, ev)
	}
	return out
}

// checkPolicies checks PropPolicy in each chain's order: a formation's
// decision names the digest of the last set recorded put in force. A
// trail that follows the store records every replica's policy events,
// each naming its replica (the data's "replica"), and not which replica
// decided a call: there, the decision must name a set some replica had
// in force. An older trail recorded its own replica's only.
func (c *checker) checkPolicies(events []placed) {
	inForce := map[string]string{}             // replica -> digest
	followed := map[string]map[string]string{} // chain -> replica named in the data -> digest
	for _, ev := range events {
		switch ev.Kind {
		case "policy":
			var d policyData
			if c.decode(ev, &d) {
				if d.Replica != "" {
					if followed[ev.Replica] == nil {
						followed[ev.Replica] = map[string]string{}
					}
					followed[ev.Replica][d.Replica] = d.Digest
					continue
				}
				inForce[ev.Replica] = d.Digest
			}
		case "formation":
			var d formationData
			if json.Unmarshal(ev.Data, &d) != nil { // reported by the main pass
				continue
			}
			if sets := followed[ev.Replica]; len(sets) > 0 {
				var known bool
				for _, dg := range sets {
					known = known || dg == d.Decision.PolicyDigest
				}
				if !known {
					c.bad(ev, PropPolicy, "formation %s was decided by policy set %.19s…, which no replica had in force",
						d.ID, d.Decision.PolicyDigest)
				}
				continue
			}
			if cur, ok := inForce[ev.Replica]; ok && d.Decision.PolicyDigest != cur {
				c.bad(ev, PropPolicy, "formation %s was decided by policy set %.19s…, the set in force was %.19s…",
					d.ID, d.Decision.PolicyDigest, cur)
			}
		}
	}
}

// admit checks an admission and opens its lease.
func (c *checker) admit(ev placed, d admissionData) {
	f := c.formations[d.Formation]
	if f == nil || f.Revision >= ev.Revision {
		c.bad(ev, PropFormed, "lease %s admits formation %s, which the trail does not show formed before revision %d", d.Lease, d.Formation, ev.Revision)
	} else {
		c.approved(ev, d, f)
		c.successor(ev, d, f)
	}
	if rev, ok := c.drained[d.Target.Epoch]; ok && rev < ev.Revision {
		c.bad(ev, PropEpochActive, "lease %s admitted at revision %d to epoch %.19s…, drained at revision %d", d.Lease, ev.Revision, d.Target.Epoch, rev)
	}
	s := c.session(d.Session)
	for _, t := range d.Requires {
		if !s.completed[t] {
			c.bad(ev, PropSession, "lease %s admits %s in session %s, which requires %s, not completed there", d.Lease, d.Tool, d.Session, t)
		}
	}
	for _, t := range d.Exclusive {
		if s.completed[t] || s.failed[t] || len(s.admitted[t]) > 0 {
			c.bad(ev, PropSession, "lease %s admits %s in session %s, exclusive with %s, which ran or is admitted there", d.Lease, d.Tool, d.Session, t)
		}
	}
	if s.admitted[d.Tool] == nil {
		s.admitted[d.Tool] = map[string]bool{}
	}
	s.admitted[d.Tool][d.Lease] = true
	c.leases[d.Lease] = &openLease{admissionData: d}
}

// approved checks PropApproval for an admission of f.
func (c *checker) approved(ev placed, d admissionData, f *placedFormation) {
	given := map[string]bool{}
	for _, a := range c.approvals[d.Formation] {
		switch {
		case a.Decision == "deny":
			c.bad(ev, PropApproval, "lease %s admits formation %s, which %s denied", d.Lease, d.Formation, a.Approver)
		case a.Digest == f.Digest && !strings.EqualFold(a.Approver, f.Principal):
			given[strings.ToLower(a.Approver)] = true
		}
	}
	if len(given) < f.ApprovalsRequired {
		c.bad(ev, PropApproval, "lease %s admits formation %s (digest %.19s…) with %d distinct approvals of it, %d needed",
			d.Lease, d.Formation, f.Digest, len(given), f.ApprovalsRequired)
	}
}

// successor checks PropSuccessor for an admission of f.
func (c *checker) successor(ev placed, d admissionData, f *placedFormation) {
	if !d.Successor {
		return
	}
	s := f.Successor
	switch rev, ok := c.retired[f.Source.Epoch]; {
	case s == nil || s.Epoch != d.Target.Epoch:
		c.bad(ev, PropSuccessor, "lease %s admits formation %s to %.19s…, not a successor it captured", d.Lease, d.Formation, d.Target.Epoch)
	case s.Certificate == "" || d.Certificate != s.Certificate:
		c.bad(ev, PropSuccessor, "lease %s admits formation %s to its successor through certificate %q, it captured %q",
			d.Lease, d.Formation, d.Certificate, s.Certificate)
	case !ok || rev >= ev.Revision:
		c.bad(ev, PropSuccessor, "lease %s admits formation %s to its successor before its source %.19s… retired", d.Lease, d.Formation, f.Source.Epoch)
	}
	if s == nil || s.Certificate == "" {
		return
	}
	if rev, ok := c.revoked[s.Certificate]; ok && rev < ev.Revision {
		c.bad(ev, PropSuccessor, "lease %s admits formation %s through certificate %s, revoked at revision %d", d.Lease, d.Formation, s.Certificate, rev)
	}
	if rev, ok := c.registered[s.Certificate]; ok && rev >= f.Revision {
		c.bad(ev, PropSuccessor, "formation %s captured certificate %s before its registration at revision %d", d.Formation, s.Certificate, rev)
	}
}

// retire checks PropRetire: no lease of the epoch is open.
func (c *checker) retire(ev placed, epoch string) {
	var open []string
	for id, l := range c.leases {
		if l.Target.Epoch == epoch {
			open = append(open, id)
		}
	}
	if len(open) > 0 {
		slices.Sort(open)
		c.bad(ev, PropRetire, "epoch %.19s… retired at revision %d with open leases %v", epoch, ev.Revision, open)
	}
}

// close applies an outcome or resolution: checks PropOneEffect and
// PropUncertain, and updates the lease and its session.
func (c *checker) close(ev placed, d leaseData) {
	if d.Outcome == "effect" {
		if c.effects[d.Lease] {
			c.bad(ev, PropOneEffect, "lease %s reports an effect again", d.Lease)
		}
		c.effects[d.Lease] = true
	}
	l := c.leases[d.Lease]
	if l == nil {
		return // admitted before the trail began, or closed already
	}
	switch {
	case l.uncertain && d.By == "generation" && d.Generation <= l.Generation:
		c.bad(ev, PropUncertain, "uncertain lease %s (generation %d) released by generation %d", d.Lease, l.Generation, d.Generation)
	case l.uncertain && d.By != "operator" && d.By != "generation":
		c.bad(ev, PropUncertain, "uncertain lease %s closed %s by %s, not by a resolution or a newer generation", d.Lease, d.Outcome, d.By)
	case !l.uncertain && ev.Kind == "resolution":
		c.bad(ev, PropUncertain, "lease %s resolved %s, though it was not uncertain", d.Lease, d.Outcome)
	}
	if d.Outcome == "uncertain" {
		l.uncertain = true
		return // the marker and the ledger entry stay
	}
	s := c.session(l.Session)
	delete(s.admitted[l.Tool], d.Lease)
	switch d.Outcome {
	case "effect":
		s.completed[l.Tool] = true
	case "failed":
		s.failed[l.Tool] = true
	}
	delete(c.leases, d.Lease)
}
