// Package e2e_test runs fcd end to end with real programs only: the
// official MCP Go SDK client as the host, real nginx and Caddy running the
// example configurations of examples/gateways (internal/gatewaytest),
// authzd's HTTP API on a real embedded etcd, and the github v1.4 and v1.3
// MCP fixtures (official Go SDK) behind the real fencecheck middleware.
// Every assertion about what happened reads the fixtures' effect recorder.
package e2e_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/fencecheck"
	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/internal/fixtures"
	"github.com/fcd-authz/fcd/internal/gatewaytest"
)

const createArgsFmt = `{"name":%q}`

// mustRun checks a call that must have run once, private, on v1.4.
func mustRun(t *testing.T, s *stack, h *host, f formation, repo string) {
	t.Helper()
	res, err := h.call(f, "create_repository", fmt.Sprintf(createArgsFmt, repo))
	if err != nil || res.IsError {
		t.Fatalf("admitted call %s: %v %+v (answer %+v)", f.ID, err, res, h.last(f.ID))
	}
	es := effectsOf(s.Rec, repo)
	if len(es) != 1 {
		t.Fatalf("effects of %s: %+v, want exactly one", repo, es)
	}
	if e := es[0]; e.Release != "v1.4" || e.Pool != poolV14 || e.Did["visibility"] != "private" || e.Did["visibilitySource"] != "default" || e.Lease == "" {
		t.Fatalf("effect %+v, want private (default) on v1.4 under a lease", e)
	}
}

// refusedBy checks a call answered by the gateway with authzd's refusal:
// 403 and the Fcd-Problem slug; nothing reached a pool.
func refusedBy(t *testing.T, h *host, f formation, err error, slug string) {
	t.Helper()
	if err == nil {
		t.Fatalf("call %s was not refused", f.ID)
	}
	if a := h.last(f.ID); a.Status != http.StatusForbidden || a.Problem != slug {
		t.Fatalf("call %s: answer %+v (%v), want 403 %s", f.ID, a, err, slug)
	}
}

func fenceRefused(t *testing.T, err error, want fencecheck.Reason) {
	t.Helper()
	if got, ok := fixtures.RejectReason(err); !ok || got != want {
		t.Fatalf("fencecheck refusal: %v, want reason %q", err, want)
	}
}

// TestRollbackDrift: a create_repository {name} (private omitted) is formed
// and approved on v1.4, where the omission means private. The operator
// rolls back: drains v1.4, and the gateway now routes github-v1-4 traffic
// to the v1.3 fixture, where the same omission means public. The pending
// call must never run on v1.3. Two ways it can be pending:
//   - formed and approved, not yet admitted: admission at forward-auth
//     answers 409 source-draining, the gateway answers 403; nothing
//     reaches a pool;
//   - already admitted before the drain (an open lease): authzd re-issues
//     its token, for github-v1-4, the gateway sends it to v1.3, and
//     fencecheck at v1.3 refuses it (audience) before any effect.
func TestRollbackDrift(t *testing.T) {
	eachGateway(t, func(t *testing.T, kind string, s *stack) {
		snap := s.snapshot()
		pending := s.formReady(snap, "sess-rollback", "rollback-pending")
		admitted := s.formReady(snap, "sess-rollback", "rollback-admitted")
		s.admit(admitted)

		s.drain(poolV14)
		gw := s.gateway(t, kind, map[string]string{poolV14: poolV13})
		h := connectHost(t, gw)

		_, err := h.call(pending, "create_repository", fmt.Sprintf(createArgsFmt, "rollback-pending"))
		refusedBy(t, h, pending, err, "source-draining")
		if n := s.hits[poolV13].Load(); n != 0 {
			t.Fatalf("a refused call reached v1.3 with a token (%d)", n)
		}

		_, err = h.call(admitted, "create_repository", fmt.Sprintf(createArgsFmt, "rollback-admitted"))
		fenceRefused(t, err, fencecheck.ReasonAudience)
		if n := s.hits[poolV13].Load(); n != 1 {
			t.Fatalf("the re-issued v1.4 token reached v1.3 %d times, want 1", n)
		}

		if es := s.Rec.Effects(fixtures.Filter{}); len(es) != 0 {
			t.Fatalf("effects after the rollback: %+v", es)
		}
	})
}

// TestWrongPool: the gateway routes github-v1-4 to the v1.3 fixture. An
// admitted call reaches v1.3 with a v1.4 token; fencecheck refuses it
// (audience) and nothing is recorded. Through a correctly routed gateway
// the same formation then runs once, private, on v1.4.
func TestWrongPool(t *testing.T) {
	eachGateway(t, func(t *testing.T, kind string, s *stack) {
		f := s.formReady(s.snapshot(), "sess-misroute", "misrouted")
		bad := connectHost(t, s.gateway(t, kind, map[string]string{poolV14: poolV13}))
		_, err := bad.call(f, "create_repository", fmt.Sprintf(createArgsFmt, "misrouted"))
		fenceRefused(t, err, fencecheck.ReasonAudience)
		if s.hits[poolV13].Load() != 1 || s.hits[poolV14].Load() != 0 {
			t.Fatalf("hits v1.3 %d, v1.4 %d", s.hits[poolV13].Load(), s.hits[poolV14].Load())
		}
		if es := s.Rec.Effects(fixtures.Filter{}); len(es) != 0 {
			t.Fatalf("effects after the misroute: %+v", es)
		}

		good := connectHost(t, s.gateway(t, kind, nil))
		mustRun(t, s, good, f, "misrouted")
		noDrift(t, s.Rec)
	})
}

// TestReplay: an admitted call runs once. The same formation sent again
// after its lease closed is refused by authzd (lease-closed, 403 at the
// gateway); the token, captured as it reached the upstream and sent
// straight to the fixture, is refused by fencecheck (replay). One effect.
func TestReplay(t *testing.T) {
	eachGateway(t, func(t *testing.T, kind string, s *stack) {
		f := s.formReady(s.snapshot(), "sess-replay", "replayed")
		h := connectHost(t, s.gateway(t, kind, nil))
		mustRun(t, s, h, f, "replayed")
		lease := effectsOf(s.Rec, "replayed")[0].Lease
		s.waitStatus(f.ID, "completed")

		_, err := h.call(f, "create_repository", fmt.Sprintf(createArgsFmt, "replayed"))
		refusedBy(t, h, f, err, "lease-closed")

		token := s.token(lease)
		if token == "" {
			t.Fatalf("no token captured for lease %s", lease)
		}
		body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"create_repository","arguments":{"name":"replayed"}}}`
		req, _ := http.NewRequest("POST", s.Fixture[poolV14]+"/mcp", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set(fencecheck.Header, token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var rpc struct {
			Error struct {
				Data struct{ Reason string } `json:"data"`
			} `json:"error"`
		}
		_ = json.Unmarshal(raw, &rpc)
		if resp.StatusCode != http.StatusForbidden || rpc.Error.Data.Reason != string(fencecheck.ReasonReplay) {
			t.Fatalf("raw replay: %d %s, want 403 reason replay", resp.StatusCode, raw)
		}
		if es := effectsOf(s.Rec, "replayed"); len(es) != 1 {
			t.Fatalf("effects after the replays: %+v", es)
		}
		noDrift(t, s.Rec)
	})
}

// TestWriteWaitsForApproval: a write is refused at the gateway
// (not-approved) until an approver approves it over REST; then it runs
// exactly once, private, on v1.4.
func TestWriteWaitsForApproval(t *testing.T) {
	eachGateway(t, func(t *testing.T, kind string, s *stack) {
		f := s.form(s.snapshot(), "sess-approval", "create_repository", fmt.Sprintf(createArgsFmt, "approved-later"))
		if f.Status != "pending_approval" {
			t.Fatalf("write formation %+v", f)
		}
		h := connectHost(t, s.gateway(t, kind, nil))
		for range 2 {
			_, err := h.call(f, "create_repository", fmt.Sprintf(createArgsFmt, "approved-later"))
			refusedBy(t, h, f, err, "not-approved")
		}
		if es := s.Rec.Effects(fixtures.Filter{}); len(es) != 0 || s.hits[poolV14].Load() != 0 {
			t.Fatalf("before approval: effects %+v, hits %d", es, s.hits[poolV14].Load())
		}
		s.approve(f)
		mustRun(t, s, h, f, "approved-later")
		noDrift(t, s.Rec)
	})
}

// TestAdmissionRacesDrain: 20 schedules per gateway kind. In each, held calls (formed and
// approved on v1.4) are sent at once, half through a gateway that routes
// github-v1-4 to v1.4 (before the rollback) and half through one that
// routes it to v1.3 (after the rollback), while the operator drains v1.4
// after a delay that varies by schedule. Each call ends in exactly one
// effect (private, on v1.4) or in one refusal before any effect (authzd's
// source-draining, or fencecheck's audience at v1.3); never a drifted
// effect.
func TestAdmissionRacesDrain(t *testing.T) {
	const schedules, held = 20, 4 // per gateway kind: 40 in all
	m := etcdtest.Start(t)
	counts := map[string]int{}
	for _, kind := range gatewaytest.Kinds {
		for i := range schedules {
			t.Run(fmt.Sprintf("%s/%d", kind, i), func(t *testing.T) {
				s := startStack(t, m)
				snap := s.snapshot()
				var fs []formation
				var repos []string
				for j := range held {
					repo := fmt.Sprintf("race-%s-%d-%d", kind, i, j)
					repos = append(repos, repo)
					fs = append(fs, s.formReady(snap, fmt.Sprintf("sess-race-%d", j), repo))
				}
				// Before the rollback, and after it.
				gws := []*gatewaytest.Gateway{s.gateway(t, kind, nil), s.gateway(t, kind, map[string]string{poolV14: poolV13})}
				hosts := make([]*host, held) // one MCP session per concurrent call
				for j := range held {
					hosts[j] = connectHost(t, gws[j%2])
				}

				errs := make([]error, held)
				ok := make([]bool, held)
				var wg sync.WaitGroup
				start := make(chan struct{})
				for j := range held {
					wg.Go(func() {
						<-start
						time.Sleep(time.Duration(j) * time.Millisecond)
						res, err := hosts[j].call(fs[j], "create_repository", fmt.Sprintf(createArgsFmt, repos[j]))
						errs[j], ok[j] = err, err == nil && !res.IsError
					})
				}
				delay := time.Duration(i) * 3 * time.Millisecond
				wg.Go(func() {
					<-start
					time.Sleep(delay)
					s.drain(poolV14)
				})
				close(start)
				wg.Wait()

				for j := range held {
					es := effectsOf(s.Rec, repos[j])
					switch {
					case ok[j]:
						if len(es) != 1 || es[0].Release != "v1.4" || es[0].Did["visibility"] != "private" {
							t.Errorf("call %d ran: effects %+v, want one private on v1.4", j, es)
						}
						counts["effect"]++
					case len(es) != 0:
						t.Errorf("call %d refused (%v) yet recorded %+v", j, errs[j], es)
					default:
						a := hosts[j].last(fs[j].ID)
						reason, fenced := fixtures.RejectReason(errs[j])
						switch {
						case a.Status == http.StatusForbidden && a.Problem == "source-draining":
							counts["source-draining"]++
						case fenced && reason == fencecheck.ReasonAudience && j%2 == 1:
							counts["audience"]++
						default:
							t.Errorf("call %d: unexpected end %v (answer %+v)", j, errs[j], a)
						}
					}
				}
				noDrift(t, s.Rec)
			})
		}
	}
	t.Logf("outcomes of %d held calls: %v", len(gatewaytest.Kinds)*schedules*held, counts)
}
