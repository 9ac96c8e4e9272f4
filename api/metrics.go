package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/fcd-authz/fcd/internal/telemetry"
	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the Prometheus metrics of one server. Each server has its own
// registry (no package-level state), served at /metrics.
type metrics struct {
	registry *prometheus.Registry
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// newMetrics returns the server's metrics; extra are the use cases'
// collectors (formations, admissions, lease outcomes), registered beside.
func newMetrics(extra ...prometheus.Collector) *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fcd_http_requests_total",
			Help: "HTTP requests by route pattern, method and status code.",
		}, []string{"route", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fcd_http_request_duration_seconds",
			Help:    "HTTP request latency by route pattern (admission, formation, forward-auth, ...).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"route"}),
	}
	b := telemetry.Build()
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "fcd_build_info",
		Help:        "Always 1; its labels say what runs: the module version, the VCS revision (+dirty for uncommitted changes) and the Go version.",
		ConstLabels: prometheus.Labels{"version": b.Version, "revision": b.Revision, "goversion": b.GoVersion},
	})
	build.Set(1)
	m.registry.MustRegister(m.requests, m.duration, build,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.registry.MustRegister(extra...)
	return m
}

// observe records one request under its route pattern (never the raw path:
// ids would make the label set unbounded).
func (m *metrics) observe(r *http.Request, status int, d time.Duration) {
	route := "unmatched"
	if rc := chi.RouteContext(r.Context()); rc != nil && rc.RoutePattern() != "" {
		route = rc.RoutePattern()
	}
	m.requests.WithLabelValues(route, r.Method, strconv.Itoa(status)).Inc()
	m.duration.WithLabelValues(route).Observe(d.Seconds())
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}
