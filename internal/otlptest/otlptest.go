// Package otlptest is an in-process OpenTelemetry collector for tests: a
// real HTTP server that receives OTLP/HTTP protobuf exports (POST
// /v1/traces) and decodes them with the official types
// (go.opentelemetry.io/proto/otlp), so that a test checks the spans a
// process really exported — names, trace ids, parent links, attributes —
// and not what an in-memory recorder was handed.
package otlptest

import (
	"compress/gzip"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/proto"
)

// Span is one received span, its ids in W3C's lower-case hex.
type Span struct {
	Service  string // the resource's service.name
	Name     string
	Trace    string
	ID       string
	Parent   string // "" for a root span
	Kind     string // SPAN_KIND_SERVER, …
	Error    bool   // status ERROR
	Attrs    map[string]string
	Received time.Time
}

func (s Span) String() string {
	return fmt.Sprintf("%s/%s %s (parent %s)", s.Service, s.Name, s.ID, s.Parent)
}

// Receiver is the collector; URL is its base URL (an exporter's
// OTEL_EXPORTER_OTLP_ENDPOINT).
type Receiver struct {
	URL string

	mu    sync.Mutex
	spans []Span
}

// Start starts a receiver, closed when the test ends.
func Start(t testing.TB) *Receiver {
	t.Helper()
	rc := &Receiver{}
	srv := httptest.NewServer(http.HandlerFunc(rc.serve))
	t.Cleanup(srv.Close)
	rc.URL = srv.URL
	return rc
}

func (rc *Receiver) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
		http.Error(w, "only POST /v1/traces", http.StatusNotFound)
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		http.Error(w, "want application/x-protobuf, got "+ct, http.StatusUnsupportedMediaType)
		return
	}
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	data, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(data, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	now := time.Now()
	var got []Span
	for _, rs := range req.GetResourceSpans() {
		var service string
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{
					Service: service, Name: s.GetName(), Trace: hex.EncodeToString(s.GetTraceId()),
					ID: hex.EncodeToString(s.GetSpanId()), Parent: hex.EncodeToString(s.GetParentSpanId()),
					Kind: s.GetKind().String(), Error: s.GetStatus().GetCode().String() == "STATUS_CODE_ERROR",
					Attrs: map[string]string{}, Received: now,
				}
				for _, kv := range s.GetAttributes() {
					switch v := kv.GetValue().GetValue().(type) {
					case *commonpb.AnyValue_StringValue:
						sp.Attrs[kv.GetKey()] = v.StringValue
					case *commonpb.AnyValue_IntValue:
						sp.Attrs[kv.GetKey()] = strconv.FormatInt(v.IntValue, 10)
					case *commonpb.AnyValue_BoolValue:
						sp.Attrs[kv.GetKey()] = strconv.FormatBool(v.BoolValue)
					}
				}
				got = append(got, sp)
			}
		}
	}
	rc.mu.Lock()
	rc.spans = append(rc.spans, got...)
	rc.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// Spans returns the spans received so far.
func (rc *Receiver) Spans() []Span {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.spans)
}

// Trace returns the spans received of one trace.
func (rc *Receiver) Trace(id string) []Span {
	var out []Span
	for _, s := range rc.Spans() {
		if s.Trace == id {
			out = append(out, s)
		}
	}
	return out
}

// WaitTrace waits until the trace id holds every span of names (each
// "service/name"), or fails the test after timeout, naming what is
// missing; it returns the trace's spans.
func (rc *Receiver) WaitTrace(t testing.TB, id string, timeout time.Duration, names ...string) []Span {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		spans := rc.Trace(id)
		var missing []string
		for _, n := range names {
			if !slices.ContainsFunc(spans, func(s Span) bool { return s.Service+"/"+s.Name == n }) {
				missing = append(missing, n)
			}
		}
		if len(missing) == 0 {
			return spans
		}
		if time.Now().After(deadline) {
			t.Fatalf("otlptest: trace %s lacks %v after %s; it has %v", id, missing, timeout, spans)
		}
		time.Sleep(20 * time.Millisecond) // polling what the exporters sent
	}
}
