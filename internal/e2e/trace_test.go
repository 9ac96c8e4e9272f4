package e2e_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/internal/gatewaytest"
	"github.com/fcd-authz/fcd/internal/otlptest"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestTraceThroughGatewayAndFence follows one tools/call whose client
// started a trace (W3C traceparent) through each real gateway: authzd and
// the fence export their spans over OTLP/HTTP to an in-process collector,
// and the call's spans form one tree in the client's trace. authzd's
// forward_auth span is a child of the client's span (the gateway passed
// traceparent to the auth request), with the gate, the admission, its
// etcd transaction and the token's signing below it; the fence's server
// span is a child of the client's span too (the gateway forwarded
// traceparent to the backend), with verify and claim below it, and the
// claim's request to authzd continuing from the claim span (fencecheck's
// LeaseClient injects traceparent); the outcome report, sent after the
// answer, is a child of the fence's server span and authzd's complete
// handler continues from it.
func TestTraceThroughGatewayAndFence(t *testing.T) {
	// The batch span processors export every 50 ms instead of every 5 s.
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	m := etcdtest.Start(t)
	for _, kind := range gatewaytest.Kinds {
		t.Run(kind, func(t *testing.T) {
			rc := otlptest.Start(t)
			s := startStackWith(t, m, stackOptions{OTLPEndpoint: rc.URL})
			gw := s.gateway(t, kind, nil)
			f := s.formReady(s.snapshot(), "sess-trace", "traced-"+kind)

			traceID, clientSpan := randomHex(t, 16), randomHex(t, 8)
			cs := connectTraced(t, gw, "00-"+traceID+"-"+clientSpan+"-01")
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{
				Name: "create_repository", Arguments: json.RawMessage(fmt.Sprintf(createArgsFmt, "traced-"+kind)),
				Meta: mcp.Meta{gatewaytest.FormationMetaKey: f.ID},
			})
			if err != nil || res.IsError {
				t.Fatalf("traced call: %v %+v", err, res)
			}
			s.waitStatus(f.ID, "completed")

			const (
				authzd = "authzd/"
				fence  = "fencecheck/"
			)
			spans := rc.WaitTrace(t, traceID, 20*time.Second,
				authzd+"GET /v1/forward_auth", authzd+"authz.gate", authzd+"authz.admit", authzd+"lease.admit", authzd+"authz.sign_token",
				fence+"POST", fence+"fencecheck.verify", fence+"fencecheck.claim",
				authzd+"POST /v1/leases/{lease}/claim", authzd+"authz.claim", authzd+"lease.claim",
				fence+"fencecheck.report",
				authzd+"POST /v1/leases/{lease}/complete", authzd+"authz.complete", authzd+"lease.close",
			)
			byID := map[string]otlptest.Span{}
			named := map[string]otlptest.Span{}
			for _, sp := range spans {
				byID[sp.ID] = sp
				key := sp.Service + "/" + sp.Name
				if prev, dup := named[key]; dup {
					t.Errorf("two spans %s in the call's trace: %v and %v", key, prev, sp)
				}
				named[key] = sp
			}
			// Each span's parent, by name; "client" is the span the
			// client's traceparent named.
			parents := map[string]string{
				authzd + "GET /v1/forward_auth":             "client",
				authzd + "authz.gate":                       authzd + "GET /v1/forward_auth",
				authzd + "authz.admit":                      authzd + "authz.gate",
				authzd + "lease.admit":                      authzd + "authz.admit",
				authzd + "authz.sign_token":                 authzd + "authz.admit",
				fence + "POST":                              "client",
				fence + "fencecheck.verify":                 fence + "POST",
				fence + "fencecheck.claim":                  fence + "fencecheck.verify",
				authzd + "POST /v1/leases/{lease}/claim":    fence + "fencecheck.claim",
				authzd + "authz.claim":                      authzd + "POST /v1/leases/{lease}/claim",
				authzd + "lease.claim":                      authzd + "authz.claim",
				fence + "fencecheck.report":                 fence + "POST",
				authzd + "POST /v1/leases/{lease}/complete": fence + "fencecheck.report",
				authzd + "authz.complete":                   authzd + "POST /v1/leases/{lease}/complete",
				authzd + "lease.close":                      authzd + "authz.complete",
			}
			for child, parent := range parents {
				sp := named[child]
				want := clientSpan
				if parent != "client" {
					want = named[parent].ID
				}
				if sp.Parent != want {
					got := "the client's span"
					if p, ok := byID[sp.Parent]; ok {
						got = p.Service + "/" + p.Name
					} else if sp.Parent != clientSpan {
						got = "unknown span " + sp.Parent
					}
					t.Errorf("%s is a child of %s, want %s", child, got, parent)
				}
				if sp.Error {
					t.Errorf("%s failed: %+v", child, sp.Attrs)
				}
			}
			lease := named[authzd+"authz.admit"].Attrs["fcd.lease"]
			if lease == "" || named[fence+"fencecheck.verify"].Attrs["fcd.lease"] != lease || named[authzd+"lease.claim"].Attrs["fcd.lease"] != lease {
				t.Errorf("the spans name different leases: admit %q, verify %q, claim %q", lease,
					named[fence+"fencecheck.verify"].Attrs["fcd.lease"], named[authzd+"lease.claim"].Attrs["fcd.lease"])
			}
			if kind := named[authzd+"GET /v1/forward_auth"].Kind; kind != "SPAN_KIND_SERVER" {
				t.Errorf("forward_auth span of kind %s", kind)
			}
			if st := named[authzd+"GET /v1/forward_auth"].Attrs["http.response.status_code"]; st != "200" {
				t.Errorf("forward_auth span status %q, want 200", st)
			}
		})
	}
}

// connectTraced connects an MCP client through gw as alice, sending
// traceparent with each tools/call (the requests carrying a formation).
func connectTraced(t *testing.T, gw *gatewaytest.Gateway, traceparent string) *mcp.ClientSession {
	t.Helper()
	tag := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if req.Header.Get(gatewaytest.FormationHeader) != "" {
			req.Header.Set("Traceparent", traceparent)
		}
		return http.DefaultTransport.RoundTrip(req)
	})
	tr := &mcp.StreamableClientTransport{
		Endpoint:             gw.URL + "/mcp",
		HTTPClient:           &http.Client{Transport: gatewaytest.FormationTransport(gatewaytest.BasicAuth(tag, "alice", gatewayUsers["alice"]))},
		DisableStandaloneSSE: true,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "fcd-e2e-traced", Version: "0"}, nil).Connect(ctx, tr, nil)
	if err != nil {
		t.Fatalf("connect through %s: %v", gw.Kind, err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
