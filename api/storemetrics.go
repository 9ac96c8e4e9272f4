package api

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/fcd-authz/fcd/authz"
	"github.com/prometheus/client_golang/prometheus"
)

// storeHealthTTL is how long one etcd status read serves scrapes: several
// Prometheus servers scraping one replica cost one read per TTL.
const storeHealthTTL = 5 * time.Second

// storeCollector exports the store's size, quota and alarms, read from
// etcd when scraped (at most once per storeHealthTTL, within
// healthTimeout), so that the cost is bounded by the scrape rate and
// nothing runs between scrapes.
type storeCollector struct {
	read func(context.Context) (authz.StoreHealth, error)
	log  *slog.Logger

	size, inUse, quota, alarm, up *prometheus.Desc

	mu     sync.Mutex
	at     time.Time
	health authz.StoreHealth
	err    error
}

func newStoreCollector(read func(context.Context) (authz.StoreHealth, error), log *slog.Logger) *storeCollector {
	return &storeCollector{
		read: read, log: log,
		size: prometheus.NewDesc("fcd_etcd_db_size_bytes",
			"Size of etcd's database file (the largest member's), what counts against the quota; it shrinks only on defragmentation.", nil, nil),
		inUse: prometheus.NewDesc("fcd_etcd_db_size_in_use_bytes",
			"Logically used size of etcd's database (the largest member's): the size less the pages compaction freed.", nil, nil),
		quota: prometheus.NewDesc("fcd_etcd_quota_bytes",
			"Backend quota of the etcd members, as configured (absent when unknown); at it etcd raises NOSPACE and refuses writes.", nil, nil),
		alarm: prometheus.NewDesc("fcd_etcd_alarm",
			"Whether an etcd alarm is active (1) or not (0), by alarm: NOSPACE (quota reached, writes refused), CORRUPT.", []string{"alarm"}, nil),
		up: prometheus.NewDesc("fcd_etcd_status_up",
			"Whether etcd's status and alarms could be read at the last scrape (1) or not (0); the other fcd_etcd_ gauges are absent when not.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.size, c.inUse, c.quota, c.alarm, c.up} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	h, err := c.current()
	if err != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	ch <- prometheus.MustNewConstMetric(c.size, prometheus.GaugeValue, float64(h.DBSize))
	ch <- prometheus.MustNewConstMetric(c.inUse, prometheus.GaugeValue, float64(h.DBSizeInUse))
	if h.Quota > 0 {
		ch <- prometheus.MustNewConstMetric(c.quota, prometheus.GaugeValue, float64(h.Quota))
	}
	for _, a := range []string{authz.AlarmNoSpace, authz.AlarmCorrupt} {
		v := 0.0
		if h.HasAlarm(a) {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.alarm, prometheus.GaugeValue, v, a)
	}
}

// current returns the last read if it is fresh, or reads again. Scrapes
// arriving together wait for one read.
func (c *storeCollector) current() (authz.StoreHealth, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < storeHealthTTL {
		return c.health, c.err
	}
	ctx, cancel := context.WithTimeout(context.Background(), healthTimeout)
	defer cancel()
	c.health, c.err = c.read(ctx)
	c.at = time.Now()
	if c.err != nil {
		c.log.Warn("etcd status for metrics", "err", c.err)
	}
	return c.health, c.err
}

// gaugeCollector exports what operators watch of the store — formations
// waiting for approval, open and uncertain leases per epoch — read when
// scraped, at most once per storeHealthTTL (within healthTimeout): a
// count-only range over the pending-approval index and a range over the
// lease markers, one per open call (authz.Registry.StoreGauges). Reading
// on scrape rather than keeping counts from the trail's follower keeps
// the numbers exact on every replica, with or without a trail, and costs
// nothing between scrapes.
type gaugeCollector struct {
	read func(context.Context) (authz.StoreGauges, error)
	log  *slog.Logger

	pending, open, uncertain, partial, up *prometheus.Desc

	mu     sync.Mutex
	at     time.Time
	gauges authz.StoreGauges
	err    error
}

func newGaugeCollector(read func(context.Context) (authz.StoreGauges, error), log *slog.Logger) *gaugeCollector {
	return &gaugeCollector{
		read: read, log: log,
		pending: prometheus.NewDesc("fcd_formations_pending_approval",
			"Formations waiting for an approval (status pending_approval, not expired yet).", nil, nil),
		open: prometheus.NewDesc("fcd_leases_open",
			"Open leases (admitted, running or uncertain: each holds its epoch's retirement back), by epoch; an epoch without any is absent.", []string{"epoch"}, nil),
		uncertain: prometheus.NewDesc("fcd_leases_uncertain",
			"Uncertain leases (outcome unknown: an operator must resolve them, authzd lease resolve), by epoch; an epoch without any is absent.", []string{"epoch"}, nil),
		partial: prometheus.NewDesc("fcd_leases_open_partial",
			"1 when more leases are open than one scrape reads (lease.MaxGaugeMarkers): fcd_leases_open and fcd_leases_uncertain then count the first of them only.", nil, nil),
		up: prometheus.NewDesc("fcd_store_gauges_up",
			"Whether the store's gauges (fcd_formations_pending_approval, fcd_leases_*) could be read at the last scrape (1) or not (0); they are absent when not.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *gaugeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.pending, c.open, c.uncertain, c.partial, c.up} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *gaugeCollector) Collect(ch chan<- prometheus.Metric) {
	g, err := c.current()
	if err != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(g.PendingApproval))
	for epoch, n := range g.Epochs {
		ch <- prometheus.MustNewConstMetric(c.open, prometheus.GaugeValue, float64(n.Open), epoch)
		if n.Uncertain > 0 {
			ch <- prometheus.MustNewConstMetric(c.uncertain, prometheus.GaugeValue, float64(n.Uncertain), epoch)
		}
	}
	partial := 0.0
	if g.Partial {
		partial = 1
	}
	ch <- prometheus.MustNewConstMetric(c.partial, prometheus.GaugeValue, partial)
}

// current returns the last read if it is fresh, or reads again. Scrapes
// arriving together wait for one read.
func (c *gaugeCollector) current() (authz.StoreGauges, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < storeHealthTTL {
		return c.gauges, c.err
	}
	ctx, cancel := context.WithTimeout(context.Background(), healthTimeout)
	defer cancel()
	c.gauges, c.err = c.read(ctx)
	c.at = time.Now()
	if c.err != nil {
		c.log.Warn("store gauges for metrics", "err", c.err)
	}
	return c.gauges, c.err
}
