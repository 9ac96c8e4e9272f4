package telemetry

import (
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// HandlerConfig configures [Handler].
type HandlerConfig struct {
	// Provider makes the spans; nil or a no-op provider makes none.
	Provider trace.TracerProvider
	// Scope is the instrumentation scope's name (the package).
	Scope string
	// Name names a request's span once it was handled (a router knows its
	// route only then); nil or "" leaves the method.
	Name func(r *http.Request) string
	// Skip, when it returns true, serves a request without a span (health
	// checks, metrics scrapes: they would start a trace each).
	Skip func(r *http.Request) bool
}

// Handler starts a server span for each request, continuing the trace of
// the request's traceparent header (a child of the caller's span) or
// starting one, and hands next the context carrying it. The span records
// the method, the route, the status code, and an error for a 5xx answer.
func Handler(next http.Handler, c HandlerConfig) http.Handler {
	if c.Provider == nil {
		return next
	}
	tracer := c.Provider.Tracer(c.Scope)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c.Skip != nil && c.Skip(r) {
			next.ServeHTTP(w, r)
			return
		}
		ctx := Propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := tracer.Start(ctx, r.Method, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(semconv.HTTPRequestMethodKey.String(r.Method), semconv.URLPath(r.URL.Path)))
		defer span.End()
		if !span.IsRecording() {
			next.ServeHTTP(w, r.WithContext(ctx))
			return
		}
		sw := &statusWriter{ResponseWriter: w}
		r = r.WithContext(ctx)
		next.ServeHTTP(sw, r)
		if c.Name != nil {
			if name := c.Name(r); name != "" {
				span.SetName(r.Method + " " + name)
				span.SetAttributes(semconv.HTTPRoute(name))
			}
		}
		status := sw.status
		if status == 0 {
			status = http.StatusOK
		}
		span.SetAttributes(attribute.Int(string(semconv.HTTPResponseStatusCodeKey), status))
		if status >= 500 {
			span.SetStatus(codes.Error, strconv.Itoa(status))
		}
	})
}

// statusWriter records the status of an answer.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush supports streamed (SSE) answers.
func (w *statusWriter) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
