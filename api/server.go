package api

import (
	"bytes"
	"cmp"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"runtime/debug"
	"strings"
	"time"

	"github.com/fcd-authz/fcd/audit"
	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/authz/policy"
	"github.com/fcd-authz/fcd/internal/telemetry"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"go.opentelemetry.io/otel/trace"
)

// DefaultBodyLimit is the request-body limit when Config.BodyLimit is zero.
const DefaultBodyLimit = 1 << 20

// Config configures the HTTP handler. Zero fields mean their defaults.
type Config struct {
	// Registry serves the registry routes. Required.
	Registry *authz.Registry
	// UseCases serve formations, approvals, admissions, leases and the
	// gateway routes. Required.
	UseCases *authz.UseCases
	// PolicyStatus reports the policy set in force and the last reload
	// failure, shown in /readyz's body; nil shows nothing.
	PolicyStatus func() policy.Status
	// Auth checks bearer credentials. Required.
	Auth *Authenticator
	// BodyLimit bounds every request body in bytes; zero means 1 MiB.
	// Larger bodies are refused with 413.
	BodyLimit int64
	// StoreWarnings returns what /readyz warns about the store's access
	// control under checks.storeAccess (an external etcd that lets in
	// clients without fcd's credential: docs/trust.md), and whether it was
	// checked yet; a warning does not make the replica unready. Nil shows
	// nothing.
	StoreWarnings func() (warnings []string, checked bool)
	// ReadyTimeout bounds the store check of /readyz; zero means 1s.
	ReadyTimeout time.Duration
	// FormationLimit limits POST /v1/formations per credential, on this
	// replica: a host over it is answered 429 rate-limited, so that one
	// host cannot fill the store (docs/capacity.md). The zero value sets
	// no limit; authzd serve sets one by default (--formation-rate).
	FormationLimit RateLimit
	// ListConcurrency is how many GET /v1/formations pages this replica
	// reads and encodes at once; more wait their turn. A page holds up to
	// 1000 decoded records, so this bounds the memory listings take and
	// leaves CPU to admissions; zero means 4.
	ListConcurrency int
	// Trail is this replica's audit trail, which GET /v1/audit pages; nil
	// answers that route 404.
	Trail AuditTrail
	// Logger receives request logs; nil means slog.Default().
	Logger *slog.Logger
	// TracerProvider, when set, traces every request but the probes and
	// scrapes (/healthz, /readyz, /metrics): a server span named after
	// the route, continuing the trace of the request's W3C traceparent —
	// for a gateway's forward_auth or ext_authz request, the client's —
	// and the use cases' spans below it. Nil traces nothing.
	TracerProvider trace.TracerProvider
}

// AuditTrail is a replica's audit trail (an *audit.Trail).
type AuditTrail interface {
	Replica() string
	Page(after uint64, limit int) ([]audit.Event, uint64, error)
}

type server struct {
	reg          *authz.Registry
	uc           *authz.UseCases
	policyStatus func() policy.Status
	storeWarn    func() ([]string, bool)
	auth         *Authenticator
	limit        int64
	readyTimeout time.Duration
	log          *slog.Logger
	metrics      *metrics
	formations   *limiter // nil: no limit
	listSlots    chan struct{}
	trail        AuditTrail
	tracer       trace.Tracer // nil: no tracing
}

//go:embed openapi.yaml
var openAPIDocument []byte

// OpenAPI returns the OpenAPI 3.1 document of the routes New serves.
func OpenAPI() []byte { return bytes.Clone(openAPIDocument) }

// New returns the HTTP handler of fcd.
func New(cfg Config) (http.Handler, error) {
	if cfg.Registry == nil || cfg.UseCases == nil || cfg.Auth == nil {
		return nil, errors.New("api: Registry, UseCases and Auth are required")
	}
	s := &server{reg: cfg.Registry, uc: cfg.UseCases, policyStatus: cfg.PolicyStatus, storeWarn: cfg.StoreWarnings, auth: cfg.Auth, limit: cfg.BodyLimit,
		readyTimeout: cfg.ReadyTimeout, log: cfg.Logger, trail: cfg.Trail}
	if s.limit <= 0 {
		s.limit = DefaultBodyLimit
	}
	if s.readyTimeout <= 0 {
		s.readyTimeout = time.Second
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.formations = newLimiter(cfg.FormationLimit, nil)
	s.listSlots = make(chan struct{}, cmp.Or(max(cfg.ListConcurrency, 0), 4))
	s.metrics = newMetrics(append(cfg.UseCases.Collectors(), newStoreCollector(s.reg.StoreHealth, s.log),
		newGaugeCollector(s.reg.StoreGauges, s.log))...)

	r := chi.NewRouter()
	if cfg.TracerProvider != nil {
		r.Use(func(next http.Handler) http.Handler {
			return telemetry.Handler(next, telemetry.HandlerConfig{
				Provider: cfg.TracerProvider, Scope: tracerScope, Name: routePattern, Skip: untraced,
			})
		})
	}
	r.Use(middleware.RequestID, s.logRequests, s.recoverPanics, s.limitBodies)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) { s.problem(w, r, errRouteNotFound) })
	r.MethodNotAllowed(func(w http.ResponseWriter, req *http.Request) {
		// RFC 9110 §15.5.6: a 405 lists the methods the target supports.
		var allow []string
		for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
			if r.Match(chi.NewRouteContext(), m, req.URL.Path) {
				allow = append(allow, m)
			}
		}
		w.Header().Set("Allow", strings.Join(allow, ", "))
		s.problem(w, req, errMethodNotAllowed)
	})

	r.Get("/healthz", s.healthz)
	r.Get("/readyz", s.readyz)
	r.Get("/openapi.yaml", s.openapi)
	r.Method(http.MethodGet, "/metrics", s.metrics.handler())
	r.Get("/.well-known/jwks.json", s.jwks)
	r.With(uiHeaders).Get("/ui", s.uiRedirect)
	r.With(uiHeaders).Get("/ui/*", s.uiAsset)

	r.Route("/v1", func(r chi.Router) {
		r.With(s.require(RoleRegistrar)).Post("/manifests", s.registerManifest)
		r.With(s.require(RoleOperator, RoleHost)).Get("/epochs", s.listEpochs)
		r.With(s.require(RoleOperator, RoleHost)).Get("/epochs/{epoch}", s.showEpoch)
		r.With(s.require(RoleOperator)).Get("/epochs/{epoch}/leases", s.epochLeases)
		r.With(s.require(RoleOperator)).Post("/epochs/{epoch}/drain", s.drainEpoch)
		r.With(s.require(RoleOperator)).Post("/epochs/{epoch}/retire", s.retireEpoch)
		r.With(s.require(RoleHost)).Post("/snapshots", s.createSnapshot)
		r.With(s.require(RoleHost)).Get("/snapshots/{snapshot}", s.showSnapshot)
		r.With(s.require(RoleHost)).Get("/snapshots/{snapshot}/tools/{server}/{tool}", s.showSnapshotTool)
		r.With(s.require(RoleHost), s.limitCaller(s.formations)).Post("/formations", s.createFormation)
		r.With(s.require(RoleHost), s.limitCaller(s.formations)).Post("/formations/{formation}/recover", s.recoverFormation)
		r.With(s.require(RoleHost, RoleApprover, RoleOperator)).Get("/formations", s.listFormations)
		r.With(s.require(RoleHost, RoleApprover, RoleOperator)).Get("/formations/{formation}", s.showFormation)
		r.With(s.require(RoleHost, RoleApprover, RoleOperator)).Get("/formations/{formation}/comparison", s.compareFormation)
		r.With(s.require(RoleApprover)).Post("/formations/{formation}/approvals", s.approveFormation)
		r.With(s.require(RoleApprover)).Get("/approvers/me", s.showCaller)
		r.With(s.require(RoleOperator)).Get("/operators/me", s.showCaller)
		r.With(s.require(RoleGateway, RoleHost)).Post("/formations/{formation}/admit", s.admitFormation)
		r.With(s.require(RoleBackend)).Post("/leases/{lease}/claim", s.claimLease)
		r.With(s.require(RoleBackend, RoleGateway)).Post("/leases/{lease}/complete", s.completeLease)
		r.With(s.require(RoleBackend, RoleGateway)).Post("/leases/outcomes", s.completeLeases)
		r.With(s.require(RoleOperator)).Post("/leases/{lease}/resolve", s.resolveLease)
		r.With(s.require(RoleOperator)).Get("/leases/{lease}/resolution", s.showResolution)
		r.With(s.require(RoleOperator)).Post("/pools/{pool}/generation", s.setGeneration)
		r.With(s.require(RoleOperator)).Get("/audit", s.auditPage)
		r.With(s.require(RoleRegistrar)).Post("/certificates", s.registerCertificate)
		r.With(s.require(RoleRegistrar, RoleOperator)).Get("/certificates", s.listCertificates)
		r.With(s.require(RoleRegistrar, RoleOperator)).Get("/certificates/{certificate}", s.showCertificate)
		r.With(s.require(RoleRegistrar)).Delete("/certificates/{certificate}", s.revokeCertificate)
		r.With(s.require(RoleGateway)).Get(strings.TrimPrefix(forwardAuthPath, "/v1"), s.forwardAuth)
		for _, m := range extAuthzMethods {
			r.With(s.require(RoleGateway)).MethodFunc(m, strings.TrimPrefix(extAuthzPrefix, "/v1")+"/*", s.extAuthz)
		}
	})
	return r, nil
}

// tracerScope is the instrumentation scope of api's spans.
const tracerScope = "github.com/fcd-authz/fcd/api"

// routePattern is the chi route r matched, once routed.
func routePattern(r *http.Request) string {
	if rc := chi.RouteContext(r.Context()); rc != nil {
		return rc.RoutePattern()
	}
	return ""
}

// untraced are the probes and scrapes, which would start a trace each.
func untraced(r *http.Request) bool {
	switch r.URL.Path {
	case "/healthz", "/readyz", "/metrics":
		return true
	}
	return false
}

func (s *server) healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// healthTimeout bounds the etcd status read of /readyz and of a metrics
// scrape: a slow status read must not hold either back.
const healthTimeout = time.Second

// readyz answers 200 only when the store answers a quorum read and has no
// NOSPACE or CORRUPT alarm; a replica that is not ready must be taken out
// of rotation, since it could not admit anything (etcd refuses every
// write while NOSPACE is raised). It shows the store's size, quota and
// alarms under checks.etcd, read with a deadline of its own: a status
// read that fails or times out is shown, but does not make the replica
// unready by itself. With StoreWarnings, checks.storeAccess is "ok" (or
// "unchecked" until the first check) or the
// warnings about an external cluster open to clients without fcd's
// credential: shown, and logged by whoever found them, but not unready (the
// cluster works; what fails is that others can write it, which taking
// replicas out of rotation would not fix).
func (s *server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), s.readyTimeout)
	defer cancel()
	if err := s.reg.Ready(ctx); err != nil {
		s.log.Warn("not ready", "err", err)
		// The store answered, but refuses: say why, by the error's type.
		switch {
		case errors.Is(err, record.ErrStoreDenied):
			s.notReady(w, r, "the registry store refuses authzd's credentials (see the server log)", map[string]any{"store": "denied"})
		case errors.Is(err, record.ErrStoreCorrupt):
			s.notReady(w, r, "the registry store has an active alarm: "+authz.AlarmCorrupt, map[string]any{"store": "alarm", "alarms": []string{authz.AlarmCorrupt}})
		default:
			s.notReady(w, r, "the registry store is unreachable", map[string]any{"store": "unavailable"})
		}
		return
	}
	checks := map[string]any{"store": "ok"}
	if s.storeWarn != nil {
		switch w, checked := s.storeWarn(); {
		case !checked:
			checks["storeAccess"] = "unchecked"
		case len(w) > 0:
			checks["storeAccess"] = map[string]any{"status": "open", "warnings": w}
		default:
			checks["storeAccess"] = "ok"
		}
	}
	// A member that does not answer is routed around (the store keeps a
	// quorum): ready, and degraded, so that an operator sees it.
	if answering, all := s.reg.StoreEndpoints(); len(answering) < len(all) {
		checks["store"] = "degraded"
		checks["endpoints"] = map[string]any{"answering": answering, "all": all}
	}
	hctx, hcancel := context.WithTimeout(ctx, min(healthTimeout, s.readyTimeout))
	health, err := s.reg.StoreHealth(hctx)
	hcancel()
	switch {
	case err != nil:
		s.log.Warn("etcd status unavailable", "err", err)
		checks["etcd"] = map[string]string{"error": "status unavailable"}
	default:
		checks["etcd"] = health
		if health.HasAlarm(authz.AlarmNoSpace) || health.HasAlarm(authz.AlarmCorrupt) {
			s.log.Warn("not ready: etcd alarm", "alarms", health.Alarms, "dbSize", health.DBSize, "quota", health.Quota)
			checks["store"] = "alarm"
			detail := "the registry store has an active alarm: " + strings.Join(health.Alarms, ", ")
			if health.HasAlarm(authz.AlarmNoSpace) {
				detail += " (the store is full and refuses every write; docs/operations.md, NOSPACE)"
			}
			s.notReady(w, r, detail, checks)
			return
		}
	}
	if s.policyStatus != nil {
		// A failed reload does not make the replica unready: it keeps
		// deciding with the working set, and the failure shows here.
		checks["policies"] = s.policyStatus()
	}
	// A replica that cannot sign admits nothing: not ready.
	switch err := s.uc.Admissions.CanSign(); {
	case errors.Is(err, authz.ErrAdmissionDisabled):
		checks["admission"] = "disabled"
		s.notReady(w, r, "admission is not configured: no signing key (--signing-key)", checks)
		return
	case err != nil:
		checks["admission"] = "signing-key-unpublished"
		s.notReady(w, r, "the dispatch-token signing key is not published yet", checks)
		return
	}
	checks["admission"] = "ok"
	// Nothing may run that the audit trail cannot record (docs/audit.md).
	if err := s.uc.TrailReady(); err != nil {
		checks["auditTrail"] = "behind"
		s.notReady(w, r, err.Error(), checks)
		return
	}
	if s.trail != nil {
		checks["auditTrail"] = "ok"
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "checks": checks})
}

// notReady answers /readyz's 503 not-ready problem with checks, and the
// headers every problem answer carries.
func (s *server) notReady(w http.ResponseWriter, r *http.Request, detail string, checks map[string]any) {
	w.Header().Set("Retry-After", "1")
	w.Header().Set(problemHeader, "not-ready")
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusServiceUnavailable)
	_ = json.NewEncoder(w).Encode(Problem{
		Type: ProblemBase + "not-ready", Title: "Not ready", Status: http.StatusServiceUnavailable,
		Detail: detail, Instance: r.URL.Path, Extensions: map[string]any{"checks": checks},
	})
}

func (s *server) openapi(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	_, _ = w.Write(openAPIDocument)
}

// limitBodies caps every request body; reading past the cap yields an
// *http.MaxBytesError, which maps to 413.
func (s *server) limitBodies(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > s.limit {
			s.problem(w, r, &http.MaxBytesError{Limit: s.limit})
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, s.limit)
		next.ServeHTTP(w, r)
	})
}

func (s *server) recoverPanics(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.ErrorContext(r.Context(), "handler panic", "panic", v, "path", r.URL.Path, "stack", string(debug.Stack()))
				s.problem(w, r, errors.New("panic"))
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// logRequests logs one line per request. It never logs headers: they
// carry credentials.
func (s *server) logRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
		next.ServeHTTP(ww, r)
		s.metrics.observe(r, ww.Status(), time.Since(start))
		s.log.DebugContext(r.Context(), "request", "method", r.Method, "path", r.URL.Path, "status", ww.Status(),
			"bytes", ww.BytesWritten(), "duration", time.Since(start), "request_id", middleware.GetReqID(r.Context()))
	})
}

// decodeJSON decodes a JSON body strictly into v. An empty body leaves v
// as it is when allowEmpty.
func decodeJSON(r *http.Request, v any, allowEmpty bool) error {
	data, err := io.ReadAll(r.Body)
	if err != nil {
		return err // *http.MaxBytesError → 413
	}
	if len(bytes.TrimSpace(data)) == 0 && allowEmpty {
		return nil
	}
	// Strict: unknown, duplicated or case-folded members are refused; a
	// failure names the member by JSON Pointer, never the Go type.
	if err := manifest.Unmarshal(bytes.TrimSpace(data), v); err != nil {
		return fmt.Errorf("%w: %w", errMalformedJSON, err)
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// pathParam is the path parameter name of r's route, percent-decoded.
// chi matches routes on the escaped path when the request's path has
// escapes, and hands the parameter over as sent: a client that escapes
// the ":" of a digest (JavaScript's encodeURIComponent does) would ask
// for "sha256%3A…" and find nothing. Go's URL parser has already refused
// an invalid escape, so a failure here leaves the value as sent.
func pathParam(r *http.Request, name string) string {
	v := chi.URLParam(r, name)
	if u, err := url.PathUnescape(v); err == nil {
		return u
	}
	return v
}
