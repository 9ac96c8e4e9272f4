package authz

import (
	"errors"

	"github.com/fcd-authz/fcd/record"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics count what the use cases decide, for operators: how many calls
// are formed and how, how admissions end (and why they are refused), how
// leases close. HTTP metrics cannot tell these apart (a 403 may be a
// missing approval or a policy that now denies). One set per UseCases,
// registered by whoever serves them; no package-level state.
type metrics struct {
	formations *prometheus.CounterVec
	approvals  *prometheus.CounterVec
	admissions *prometheus.CounterVec
	claims     *prometheus.CounterVec
	outcomes   *prometheus.CounterVec
}

func newMetrics() *metrics {
	return &metrics{
		formations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fcd_formations_total",
			Help: "Formations recorded, by status at formation (ready, pending_approval, denied) and whether a successor was captured.",
		}, []string{"status", "successor"}),
		approvals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fcd_approvals_total",
			Help: "Approver decisions recorded, by decision.",
		}, []string{"decision"}),
		admissions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fcd_admissions_total",
			Help: "Admission answers: admitted to the source or the successor, reissued for an open lease, or refused with the cause.",
		}, []string{"result"}),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fcd_lease_claims_total",
			Help: "Backend claims on leases before the effect: claimed_now, or refused because already claimed (a replay), closed, uncertain, not_found, out_of_scope, unavailable.",
		}, []string{"result"}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fcd_lease_outcomes_total",
			Help: "Lease outcomes applied: effect, failed, rejected, uncertain (by backend; rejected by release when the fence refused an unclaimed lease's call), uncertain (sweeper), effect or no_effect (operator resolution), released (generation).",
		}, []string{"outcome", "by"}),
	}
}

// Collectors returns the use cases' Prometheus collectors, for the
// server's registry: with them the decision log's, when it has one.
func (u *UseCases) Collectors() []prometheus.Collector {
	m := u.metrics
	cs := []prometheus.Collector{m.formations, m.approvals, m.admissions, m.claims, m.outcomes}
	if f := u.Admissions.trail; f != nil {
		cs = append(cs, f.collectors()...)
	}
	if u.notifier != nil {
		cs = append(cs, u.notifier.Collectors()...)
	}
	if c, ok := u.decisions.(interface{ Collector() prometheus.Collector }); ok {
		cs = append(cs, c.Collector())
	}
	if c, ok := u.decider.(interface{ Collector() prometheus.Collector }); ok {
		cs = append(cs, c.Collector()) // a policy.Manager's reloads
	}
	return cs
}

// Admission results, the values of fcd_admissions_total's result label.
const (
	resultSource    = "source"
	resultSuccessor = "successor"
	resultReissued  = "reissued"
)

// admissionResult names how an admission ended: the target kind when it
// was granted, else the cause of the refusal (a small fixed set, so the
// label stays bounded).
func admissionResult(a *Grant, err error) string {
	if err == nil {
		switch {
		case a.reissued:
			return resultReissued
		case a.successor:
			return resultSuccessor
		}
		return resultSource
	}
	var dep *record.DependencyError
	switch {
	case errors.Is(err, ErrSourceDraining):
		return "source_draining"
	case errors.Is(err, ErrSourceStale):
		return "source_stale"
	case errors.Is(err, ErrNotApproved):
		return "not_approved"
	case errors.Is(err, ErrFormationDenied):
		return "denied"
	case errors.Is(err, ErrPolicyNowDenies):
		return "policy_now_denies"
	case errors.Is(err, ErrExpired):
		return "expired"
	case errors.As(err, &dep):
		return "dependency"
	case errors.Is(err, record.ErrLeaseUncertain), errors.Is(err, record.ErrLeaseClosed):
		return "lease_closed_or_uncertain"
	case errors.Is(err, record.ErrLeaseClaimed):
		return "lease_claimed"
	case errors.Is(err, ErrCallerMismatch):
		return "caller_mismatch"
	case errors.Is(err, record.ErrUnavailable):
		return "store_unavailable"
	case errors.Is(err, record.ErrFormationNotFound):
		return "not_found"
	case errors.Is(err, record.ErrConflict):
		return "conflict"
	}
	return "other"
}
