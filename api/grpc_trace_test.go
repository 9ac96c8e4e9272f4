package api_test

import (
	"net"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/fcd-authz/fcd/api"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestCheckGRPCContinuesTheClientsTrace: Envoy's gRPC CheckRequest
// carries the client's headers, traceparent among them; without a trace
// of Envoy's own in the gRPC metadata, the Check's server span continues
// the client's trace, and the admission's spans are below it.
func TestCheckGRPCContinuesTheClientsTrace(t *testing.T) {
	f, snap := newReadyFixture(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	cfg := f.cfg
	cfg.TracerProvider = tp
	gs, err := api.NewCheckServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })

	read := f.do("POST", "/v1/formations", api.RoleHost, formationBody(snap, "s-trace", "github/get_repository", `{"owner":"octo","repo":"demo"}`, ""))
	const traceID, clientSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	f.okHeaders(f.check(authv3.NewAuthorizationClient(conn), f.creds[api.RoleGateway], checkRequest("POST",
		map[string]string{"Fcd-Formation": read.Body["id"].(string), "traceparent": "00-" + traceID + "-" + clientSpan + "-01"}, nil, false)))

	spans := exp.GetSpans()
	byName := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		if s.SpanContext.TraceID().String() != traceID {
			t.Errorf("span %s in trace %s, want the client's %s", s.Name, s.SpanContext.TraceID(), traceID)
		}
		byName[s.Name] = s
	}
	for child, parent := range map[string]string{
		"envoy.service.auth.v3.Authorization/Check": "",
		"authz.gate":       "envoy.service.auth.v3.Authorization/Check",
		"authz.admit":      "authz.gate",
		"lease.admit":      "authz.admit",
		"authz.sign_token": "authz.admit",
	} {
		s, ok := byName[child]
		if !ok {
			t.Errorf("no span %s among %d", child, len(spans))
			continue
		}
		want := clientSpan
		if parent != "" {
			want = byName[parent].SpanContext.SpanID().String()
		}
		if got := s.Parent.SpanID().String(); got != want {
			t.Errorf("%s: parent %s, want %s (%s)", child, got, want, parent)
		}
	}
}
