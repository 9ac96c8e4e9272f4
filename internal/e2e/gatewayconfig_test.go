package e2e_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/internal/gatewayconf"
	"github.com/fcd-authz/fcd/internal/gatewaytest"
)

// authzdBinDir holds the authzd binary buildAuthzd built (TestMain removes
// it).
var authzdBinDir string

var buildAuthzdOnce = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "fcd-e2e-authzd-")
	if err != nil {
		return "", err
	}
	authzdBinDir = dir
	bin := filepath.Join(dir, "authzd")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/fcd-authz/fcd/cmd/authzd").CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build authzd: %v\n%s", err, out)
	}
	return bin, nil
})

// buildAuthzd builds cmd/authzd once per test run and returns its path.
func buildAuthzd(t *testing.T) string {
	t.Helper()
	bin, err := buildAuthzdOnce()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// seenRequest is what the recording pool received.
type seenRequest struct {
	Method string
	Header http.Header
}

// TestGatewayConfigCommand runs real nginx and Caddy on what the built
// `authzd gateway config` command writes, in front of a real authzd:
//   - a stock MCP host's admitted call runs once, private, on v1.4;
//   - a tools/call without a formation is refused formation-required
//     (Fcd-Problem and a problem+json body of that type), reaching no pool;
//   - every Fcd-* header a client sends (gatewayconf.ClientHeaders) is removed
//     before a pool, on session traffic and on an admitted call, which
//     carries only authzd's token (for its formation) and target;
//   - once the source drains, authzd's refusal reaches the client with
//     Fcd-Problem source-draining, Retry-After and the problem body.
func TestGatewayConfigCommand(t *testing.T) {
	bin := buildAuthzd(t)
	m := etcdtest.Start(t)
	for _, kind := range gatewaytest.Kinds {
		t.Run(kind, func(t *testing.T) {
			s := startStack(t, m)
			snap := s.snapshot()
			cfg := func(pools map[string]string) gatewaytest.Config {
				return gatewaytest.Config{Authzd: s.URL, Credential: string(s.creds[api.RoleGateway]), Pools: pools,
					Default: poolV14, Users: gatewayUsers, Command: bin}
			}
			gw := gatewaytest.Start(t, kind, cfg(map[string]string{poolV14: s.Fixture[poolV14], poolV13: s.Fixture[poolV13]}))

			// A pool that records what reaches it, behind a second gateway.
			var mu sync.Mutex
			var seen []seenRequest
			rec := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				seen = append(seen, seenRequest{Method: r.Method, Header: r.Header.Clone()})
				mu.Unlock()
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
			}))
			t.Cleanup(rec.Close)
			recGW := gatewaytest.Start(t, kind, cfg(map[string]string{poolV14: rec.URL, poolV13: s.Fixture[poolV13]}))
			client := &http.Client{Timeout: 30 * time.Second}
			t.Cleanup(client.CloseIdleConnections)
			post := func(gw *gatewaytest.Gateway, header map[string]string, body string) (*http.Response, []byte) {
				t.Helper()
				req, err := http.NewRequest(http.MethodPost, gw.URL+"/mcp", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				req.SetBasicAuth("alice", gatewayUsers["alice"])
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Accept", "application/json, text/event-stream")
				for k, v := range header {
					req.Header.Set(k, v)
				}
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				data, err := io.ReadAll(resp.Body)
				if err != nil {
					t.Fatal(err)
				}
				return resp, data
			}
			forged := func() map[string]string {
				h := map[string]string{}
				for _, name := range gatewayconf.ClientHeaders() {
					h[name] = "forged"
				}
				delete(h, "Fcd-Formation")
				return h
			}
			take := func() []seenRequest {
				mu.Lock()
				defer mu.Unlock()
				got := seen
				seen = nil
				return got
			}
			callBody := func(repo string) string {
				return fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_repository","arguments":{"name":%q}}}`, repo)
			}

			t.Run("client Fcd-* headers do not reach a pool", func(t *testing.T) {
				h := forged()
				h["Mcp-Method"] = "notifications/initialized"
				resp, data := post(recGW, h, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("session traffic: %d %s", resp.StatusCode, data)
				}
				f := s.formReady(snap, "sess-gwcmd-strip", "gwcmd-strip")
				h = forged()
				h["Fcd-Formation"] = f.ID
				h["Mcp-Method"] = "tools/call"
				h["Mcp-Name"] = "create_repository"
				resp, data = post(recGW, h, callBody("gwcmd-strip"))
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("admitted call: %d %s", resp.StatusCode, data)
				}
				got := take()
				if len(got) != 2 {
					t.Fatalf("the recording pool got %d requests, want 2", len(got))
				}
				for i, r := range got {
					for name, vs := range r.Header {
						if !strings.HasPrefix(name, "Fcd-") {
							continue
						}
						if i == 0 || (name != "Fcd-Dispatch-Token" && name != "Fcd-Target") || len(vs) != 1 || vs[0] == "forged" {
							t.Errorf("request %d: the pool got %s %q", i, name, vs)
						}
					}
				}
				if c := claimsOf(t, got[1].Header.Get("Fcd-Dispatch-Token")); c.Formation != f.ID || c.Audience != poolV14 {
					t.Errorf("token claims %+v, want authzd's for %s at %s", c, f.ID, poolV14)
				}
				if got[1].Header.Get("Fcd-Target") != poolV14 {
					t.Errorf("Fcd-Target %q", got[1].Header.Get("Fcd-Target"))
				}
			})

			t.Run("an admitted call runs", func(t *testing.T) {
				f := s.formReady(snap, "sess-gwcmd", "gwcmd-admitted")
				mustRun(t, s, connectHost(t, gw), f, "gwcmd-admitted")
			})

			t.Run("an unformed call is refused", func(t *testing.T) {
				before := s.hits[poolV14].Load() + s.hits[poolV13].Load()
				resp, data := post(gw, map[string]string{"Mcp-Method": "tools/call", "Mcp-Name": "create_repository"}, callBody("gwcmd-unformed"))
				checkRefusal(t, resp, data, "formation-required", false)
				if after := s.hits[poolV14].Load() + s.hits[poolV13].Load(); after != before {
					t.Errorf("a refused call reached a pool")
				}
			})

			t.Run("a draining source's refusal reaches the client", func(t *testing.T) {
				f := s.formReady(snap, "sess-gwcmd-drain", "gwcmd-draining")
				s.drain(poolV14)
				resp, data := post(gw, map[string]string{"Fcd-Formation": f.ID, "Mcp-Method": "tools/call", "Mcp-Name": "create_repository"}, callBody("gwcmd-draining"))
				checkRefusal(t, resp, data, "source-draining", true)
				if got := resp.Header.Get("Fcd-Formation"); got != f.ID {
					t.Errorf("Fcd-Formation %q, want %s", got, f.ID)
				}
				if es := effectsOf(s.Rec, "gwcmd-draining"); len(es) != 0 {
					t.Errorf("effects %+v", es)
				}
			})
		})
	}
}

// checkRefusal checks authzd's refusal as a client behind the gateway sees
// it: 403, Fcd-Problem, a problem+json body of the same type, and
// Retry-After when the type has one.
func checkRefusal(t *testing.T, resp *http.Response, data []byte, slug string, retry bool) {
	t.Helper()
	if resp.StatusCode != http.StatusForbidden || resp.Header.Get("Fcd-Problem") != slug {
		t.Fatalf("got %d Fcd-Problem %q %s, want 403 %s", resp.StatusCode, resp.Header.Get("Fcd-Problem"), data, slug)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/problem+json") {
		t.Errorf("Content-Type %q", ct)
	}
	var p struct{ Type string }
	if err := json.Unmarshal(data, &p); err != nil || !strings.HasSuffix(p.Type, "#"+slug) {
		t.Errorf("problem body %s (%v), want type …#%s", data, err, slug)
	}
	if got := resp.Header.Get("Retry-After"); (got != "") != retry {
		t.Errorf("Retry-After %q, want one: %v", got, retry)
	}
}
