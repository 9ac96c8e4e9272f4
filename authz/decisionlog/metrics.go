package decisionlog

import "github.com/prometheus/client_golang/prometheus"

// Collector exports the exporter's Stats as Prometheus metrics, read when
// scraped, so an operator sees decisions dropped or piling up before the
// log pipeline misses them.
func (x *Exporter) Collector() prometheus.Collector {
	return &statsCollector{x: x,
		sent: prometheus.NewDesc("fcd_decision_log_events_sent_total",
			"Decision-log events a receiver accepted.", nil, nil),
		dropped: prometheus.NewDesc("fcd_decision_log_events_dropped_total",
			"Decision-log events that will never be sent: evicted from a full buffer, over the upload limit, refused for good, or left at shutdown.", nil, nil),
		uploads: prometheus.NewDesc("fcd_decision_log_uploads_total",
			"Decision-log uploads by result: ok, or failed (retried unless refused for good).", []string{"result"}, nil),
		pending: prometheus.NewDesc("fcd_decision_log_events_pending",
			"Decision-log events buffered, waiting for an upload.", nil, nil),
	}
}

type statsCollector struct {
	x                               *Exporter
	sent, dropped, uploads, pending *prometheus.Desc
}

// Describe implements prometheus.Collector.
func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.sent, c.dropped, c.uploads, c.pending} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.x.Stats()
	ch <- prometheus.MustNewConstMetric(c.sent, prometheus.CounterValue, float64(s.Sent))
	ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(s.Dropped))
	ch <- prometheus.MustNewConstMetric(c.uploads, prometheus.CounterValue, float64(s.Batches), "ok")
	ch <- prometheus.MustNewConstMetric(c.uploads, prometheus.CounterValue, float64(s.FailedBatches), "failed")
	ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(s.Pending))
}
