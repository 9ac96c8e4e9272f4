package lease

import (
	"context"

	"github.com/fcd-authz/fcd/internal/tracing"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// tracerScope is the instrumentation scope of the store's spans.
const tracerScope = "github.com/fcd-authz/fcd/lease"

// startTxnSpan starts the span of one of the store's calls that matter
// on a call's path — the admission, the claim, the close: each one etcd
// transaction (through the group committer), with the reads it needs.
// Reads alone get no span. Only below a traced request
// (internal/tracing).
func startTxnSpan(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	ctx, span := tracing.Start(ctx, tracerScope, name, append(attrs, attribute.String("db.system.name", "etcd"))...)
	return ctx, span
}

// endTxnSpan ends span with the revision the transaction committed at,
// when it did.
func endTxnSpan(span trace.Span, revision int64, err error) {
	if revision > 0 {
		span.SetAttributes(attribute.Int64("fcd.revision", revision))
	}
	tracing.End(span, err)
}
