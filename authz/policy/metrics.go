package policy

import (
	"errors"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Results of a policy load attempt, the values of
// fcd_policy_reloads_total's result label: the set was put in force (or
// was already), or why it was refused (the set in force stays).
const (
	reloadLoaded      = "loaded"
	reloadInvalid     = "invalid"
	reloadTestsFailed = "tests_failed"
	reloadSignature   = "signature"
	reloadUnavailable = "unavailable"
	reloadOther       = "error"
)

var reloadResults = []string{reloadLoaded, reloadInvalid, reloadTestsFailed, reloadSignature, reloadUnavailable, reloadOther}

// refusal names why a load failed, for the metric and the log line.
func refusal(err error) string {
	switch {
	case errors.Is(err, ErrBundleSignature):
		return reloadSignature
	case errors.Is(err, ErrTestsFailed):
		return reloadTestsFailed
	case errors.Is(err, ErrInvalidPolicy):
		return reloadInvalid
	case errors.Is(err, ErrBundleUnavailable):
		return reloadUnavailable
	}
	return reloadOther
}

// reloadCounts counts load attempts by result.
type reloadCounts [6]atomic.Uint64

func (c *reloadCounts) add(result string) {
	for i, r := range reloadResults {
		if r == result {
			c[i].Add(1)
			return
		}
	}
}

// Collector exports the manager's load attempts as
// fcd_policy_reloads_total{result}, and the set in force as
// fcd_policy_info{digest, revision} (value 1), read when scraped.
func (m *Manager) Collector() prometheus.Collector {
	return &managerCollector{m: m,
		reloads: prometheus.NewDesc("fcd_policy_reloads_total",
			"Policy set loads by result: loaded (put in force, or already in force), or why it was refused and the set in force kept: invalid, tests_failed, signature (a bundle's), unavailable (a bundle that could not be read or downloaded), error.",
			[]string{"result"}, nil),
		info: prometheus.NewDesc("fcd_policy_info",
			"The policy set in force: its digest and, from a bundle, the bundle's revision (value 1).",
			[]string{"source", "digest", "revision"}, nil),
	}
}

type managerCollector struct {
	m             *Manager
	reloads, info *prometheus.Desc
}

// Describe implements prometheus.Collector.
func (c *managerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.reloads
	ch <- c.info
}

// Collect implements prometheus.Collector.
func (c *managerCollector) Collect(ch chan<- prometheus.Metric) {
	for i, r := range reloadResults {
		ch <- prometheus.MustNewConstMetric(c.reloads, prometheus.CounterValue, float64(c.m.reloads[i].Load()), r)
	}
	st := c.m.Status()
	ch <- prometheus.MustNewConstMetric(c.info, prometheus.GaugeValue, 1, st.Source, st.Digest, st.Revision)
}
