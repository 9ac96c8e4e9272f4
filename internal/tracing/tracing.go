// Package tracing starts the spans of fcd's layers below the edge (the
// use cases, the policy decision, the store's transactions) with the
// tracer provider of the span their context already carries: a call that
// came in through a traced request (api's server span) is traced all the
// way down, while work whose context carries no recording span — the
// background loops, a server without tracing — starts none and costs a
// type assertion. It imports OpenTelemetry's API only (no SDK, no
// exporter); internal/telemetry sets the provider up.
package tracing

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Start starts the span name of the instrumentation scope as a child of
// the span ctx carries, with that span's provider, and returns ctx
// carrying it. When ctx carries no recording span, it returns ctx and
// that (non-recording) span: End on it does nothing.
func Start(ctx context.Context, scope, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, parent
	}
	return parent.TracerProvider().Tracer(scope).Start(ctx, name, trace.WithAttributes(attrs...))
}

// End ends span; a non-nil err is recorded on it and marks it failed.
func End(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
