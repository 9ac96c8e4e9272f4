package telemetry

import (
	"context"
	"net/http"

	"github.com/fcd-authz/fcd/fencecheck"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// FenceTracer is fencecheck's tracing hook on OpenTelemetry: its spans
// are tp's, and it injects W3C traceparent into the fence's requests to
// authzd.
func FenceTracer(tp trace.TracerProvider) fencecheck.Tracer {
	return fenceTracer{tp.Tracer("github.com/fcd-authz/fcd/fencecheck")}
}

type fenceTracer struct{ t trace.Tracer }

func (f fenceTracer) Start(ctx context.Context, name string) (context.Context, fencecheck.Span) {
	kind := trace.SpanKindInternal
	if name == fencecheck.SpanClaim || name == fencecheck.SpanReport {
		kind = trace.SpanKindClient // a request to authzd
	}
	ctx, span := f.t.Start(ctx, name, trace.WithSpanKind(kind))
	return ctx, fenceSpan{span}
}

func (fenceTracer) Inject(ctx context.Context, h http.Header) {
	Propagator.Inject(ctx, propagation.HeaderCarrier(h))
}

type fenceSpan struct{ s trace.Span }

func (f fenceSpan) SetAttribute(key, value string) { f.s.SetAttributes(attribute.String(key, value)) }

func (f fenceSpan) End(err error) {
	if err != nil {
		f.s.RecordError(err)
		f.s.SetStatus(codes.Error, err.Error())
	}
	f.s.End()
}
