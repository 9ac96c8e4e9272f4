package record

import "time"

// LeaseState is the state of an open lease (its marker).
type LeaseState string

// Lease states. Admitted, running and uncertain leases keep their epoch
// from retiring. A running lease is an admitted one a backend claimed
// before its effect: it is never claimed again, and re-admission issues no
// token for it.
const (
	LeaseAdmitted  LeaseState = "admitted"
	LeaseRunning   LeaseState = "running"
	LeaseUncertain LeaseState = "uncertain"
)

// Lease is an admission: one marker key under its target epoch, holding
// this record. Its id is the dispatch token's jti.
type Lease struct {
	ID             string     `json:"id"`
	State          LeaseState `json:"state"`
	Formation      string     `json:"formation"`
	Session        string     `json:"session"`
	Tool           string     `json:"tool"`
	ArgumentDigest string     `json:"argumentDigest"`
	Target         Target     `json:"target"`
	Generation     int64      `json:"generation"`
	AdmittedAt     time.Time  `json:"admittedAt"`
	// Certificate is set when the lease admits the formation's successor:
	// the id of the certificate the substitution relied on.
	Certificate string `json:"certificate,omitempty"`
	// RecoveryOf is set when the lease admits a recovery: the first
	// formation of its recovery chain, which the token carries
	// (fcd_recovery_of) for the backend to deduplicate on.
	RecoveryOf string `json:"recoveryOf,omitempty"`
	// Claim is the backend's claim, once it claimed the lease before the
	// effect (State is then running). Filled on read.
	Claim *Claim `json:"claim,omitempty"`
	// Revision is the etcd revision of the admission, Cluster the etcd
	// cluster id: together the fencing token. Filled on read.
	Revision int64  `json:"-"`
	Cluster  string `json:"-"`
	// Closed is the etcd revision of the transaction that closed the
	// lease, or marked it uncertain. Set by the close that made it.
	Closed int64 `json:"-"`
}

// ClaimID is the id of the lease's claim, "" when no backend claimed it.
func (l *Lease) ClaimID() string {
	if l.Claim == nil {
		return ""
	}
	return l.Claim.ID
}

// Claim is a backend's claim on a lease, taken in one etcd transaction
// immediately before the effect: of all the calls presenting a lease's
// token — on any instance, across restarts and re-admissions — exactly
// one claims it.
type Claim struct {
	// ID is the claimant's id for this one call (random, chosen by the
	// fence); the claimant reports the outcome under it, and a retry of a
	// claim with the same id is answered as the first was.
	ID string `json:"id"`
	// At is when the claim was taken.
	At time.Time `json:"at"`
	// Revision is the etcd revision of the transaction that took the
	// claim. Set by the claim (or its repeat).
	Revision int64 `json:"-"`
}

// Outcome is how a lease closes.
type Outcome string

// Outcomes of a lease.
const (
	// OutcomeEffect: the tool ran and answered a result; it is recorded
	// as completed in the session (meeting requires) and the marker
	// released.
	OutcomeEffect Outcome = "effect"
	// OutcomeFailed: the tool ran and answered an error result (MCP
	// isError). Released like an effect, recorded as failed in the
	// session: it counts against exclusive tools, it does not meet
	// requires.
	OutcomeFailed Outcome = "failed"
	// OutcomeRejected: nothing ran — the backend refused the call before
	// any handler (a JSON-RPC error, a transport answer such as an
	// unknown session), or the fence refused it, or the lease was released
	// before any claim; released, and the token is unusable.
	OutcomeRejected Outcome = "rejected"
	// OutcomeUncertain: unknown (a timeout); the marker stays, blocking
	// retirement and replay, until resolved.
	OutcomeUncertain Outcome = "uncertain"
	// OutcomeNoEffect: an operator's resolution that nothing happened.
	OutcomeNoEffect Outcome = "no_effect"
	// OutcomeReleased: an uncertain lease released by a newer backend
	// generation; the outcome stays unknown (the formation stays
	// uncertain) but the marker no longer holds anything back.
	OutcomeReleased Outcome = "released"
)

// Admission are the facts of an admission its dispatch token states
// (fcd_epoch, fcd_revision, fcd_formation, sub, fcd_tool). A backend's
// outcome report may carry them so that the store applies it without
// reading the lease first; the store proves each against what the
// admission wrote and trusts none of them otherwise.
type Admission struct {
	Epoch     string `json:"epoch"`
	Revision  int64  `json:"revision"`
	Formation string `json:"formation"`
	Session   string `json:"session"`
	Tool      string `json:"tool"`
}
