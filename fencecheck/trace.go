package fencecheck

import (
	"context"
	"net/http"
)

// Names of the spans a [Tracer] is asked to start, one per step of a
// call's way through the fence.
const (
	// SpanVerify covers [Verifier.Verify]: the token, the call, the
	// replay check and, in online mode, the claim.
	SpanVerify = "fencecheck.verify"
	// SpanClaim covers the lease claim in authzd (a child of SpanVerify).
	SpanClaim = "fencecheck.claim"
	// SpanReport covers the delivery of one outcome report to authzd, a
	// child of the call's span; it starts after the answer, when a
	// [Reporter] worker takes the report.
	SpanReport = "fencecheck.report"
)

// Tracer traces the fence's steps — verify, claim, report — and carries
// the trace to authzd, without fencecheck importing a tracing library:
// the embedder adapts its own (`fencecheck proxy` wires OpenTelemetry).
// Set it as [Verifier.Tracer]; the verifier hands it on in the context, so
// that its [*LeaseClient] and the [*Reporter] of its middleware trace too.
// Implementations must be safe for concurrent use.
type Tracer interface {
	// Start starts the span name as a child of the span ctx carries, and
	// returns ctx carrying the new one, and the span.
	Start(ctx context.Context, name string) (context.Context, Span)
	// Inject writes the trace context ctx carries into h, the headers of
	// a request fencecheck sends to authzd (a claim, a report), as W3C
	// traceparent (and tracestate), so that authzd's spans join the call's
	// trace.
	Inject(ctx context.Context, h http.Header)
}

// Span is one traced step. End is called once, after any SetAttribute.
type Span interface {
	// SetAttribute records a string attribute of the step: the lease,
	// the tool, a refusal's reason, an outcome.
	SetAttribute(key, value string)
	// End ends the span; a non-nil err marks the step failed.
	End(err error)
}

type tracerKey struct{}

// withTracer returns ctx carrying t, unless t is nil.
func withTracer(ctx context.Context, t Tracer) context.Context {
	if t == nil {
		return ctx
	}
	return context.WithValue(ctx, tracerKey{}, t)
}

// startSpan starts the span name with the tracer ctx carries; without one
// it returns ctx and a span that records nothing.
func startSpan(ctx context.Context, name string) (context.Context, Span) {
	if t, ok := ctx.Value(tracerKey{}).(Tracer); ok {
		return t.Start(ctx, name)
	}
	return ctx, noSpan{}
}

// inject writes ctx's trace context into h with the tracer ctx carries.
func inject(ctx context.Context, h http.Header) {
	if t, ok := ctx.Value(tracerKey{}).(Tracer); ok {
		t.Inject(ctx, h)
	}
}

type noSpan struct{}

func (noSpan) SetAttribute(string, string) {}
func (noSpan) End(error)                   {}
