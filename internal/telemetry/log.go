package telemetry

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"go.opentelemetry.io/otel/trace"
)

// Log formats of NewLogger.
const (
	LogText = "text"
	LogJSON = "json"
)

// NewLogger returns the logger of a command: slog's text or JSON handler
// on w at level, wrapped by [LogHandler].
func NewLogger(w io.Writer, format string, level slog.Level) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	switch format {
	case LogText, "":
		h = slog.NewTextHandler(w, opts)
	case LogJSON:
		h = slog.NewJSONHandler(w, opts)
	default:
		return nil, fmt.Errorf("log format %q: want %s or %s", format, LogText, LogJSON)
	}
	return slog.New(LogHandler(h)), nil
}

// LogHandler wraps h so that a record logged with a context carrying a
// span (slog's …Context methods) has the span's trace_id and span_id, in
// W3C's hex, among its attributes: a log line can be found from a trace,
// and a trace from a log line. Records without a span are passed as they
// are.
func LogHandler(h slog.Handler) slog.Handler { return logHandler{h} }

type logHandler struct{ slog.Handler }

func (h logHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return logHandler{h.Handler.WithAttrs(attrs)}
}

func (h logHandler) WithGroup(name string) slog.Handler { return logHandler{h.Handler.WithGroup(name)} }
