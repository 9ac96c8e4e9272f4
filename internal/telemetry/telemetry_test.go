package telemetry

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

// TestLogLinesCarryTheTrace: a line logged with a context carrying a span
// has its trace_id and span_id, in JSON and in text, also through a
// logger with attributes; a line without one has neither.
func TestLogLinesCarryTheTrace(t *testing.T) {
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))

	var buf bytes.Buffer
	log, err := NewLogger(&buf, LogJSON, slog.LevelInfo)
	if err != nil {
		t.Fatal(err)
	}
	log.With("component", "test").InfoContext(ctx, "traced")
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("not one JSON object: %q", buf.String())
	}
	if line["trace_id"] != tid.String() || line["span_id"] != sid.String() || line["component"] != "test" {
		t.Errorf("traced line %v", line)
	}
	buf.Reset()
	log.Info("untraced")
	if bytes.Contains(buf.Bytes(), []byte("trace_id")) {
		t.Errorf("untraced line %q has a trace id", buf.String())
	}

	buf.Reset()
	text, err := NewLogger(&buf, LogText, slog.LevelInfo)
	if err != nil {
		t.Fatal(err)
	}
	text.InfoContext(ctx, "traced")
	if !bytes.Contains(buf.Bytes(), []byte("trace_id="+tid.String()+" span_id="+sid.String())) {
		t.Errorf("text line %q", buf.String())
	}
	if _, err := NewLogger(&buf, "yaml", slog.LevelInfo); err == nil {
		t.Error("log format yaml accepted")
	}
}

// TestConfig: no endpoint, no exporter (a no-op provider); the traces URL
// of a base URL; a bad protocol or endpoint is refused.
func TestConfig(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "")
	p, err := New(context.Background(), Config{Service: "x"})
	if err != nil || p.sdk != nil {
		t.Fatalf("without an endpoint: %v, exporting %v", err, p.sdk != nil)
	}
	if _, span := p.Tracer("t").Start(context.Background(), "s"); span.IsRecording() {
		t.Error("the no-op provider records")
	}
	for in, want := range map[string]string{
		"http://c:4318":            "http://c:4318/v1/traces",
		"http://c:4318/":           "http://c:4318/v1/traces",
		"https://c/otlp/v1/traces": "https://c/otlp/v1/traces",
	} {
		if got := tracesURL(in); got != want {
			t.Errorf("tracesURL(%q) = %q, want %q", in, got, want)
		}
	}
	for _, c := range []Config{{Endpoint: "c:4318"}, {Endpoint: "http://c:4318", Protocol: "thrift"}} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")
	if !(Config{}).Enabled() {
		t.Error("OTEL_EXPORTER_OTLP_ENDPOINT does not enable the exporter")
	}
}
