package e2e_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/internal/fixtures"
	"github.com/fcd-authz/fcd/internal/gatewaytest"
)

// sixCalls forms, on the current snapshot (v1.4), six create_repository
// calls and approves them: three with an explicit "private": true
// (explicit-0..2), three with private omitted (omitted-0..2). On v1.4 all
// six would be private; on v1.3 the omitted ones would be public.
func sixCalls(s *stack, label string) (explicit, omitted []formation) {
	s.t.Helper()
	snap := s.snapshot()
	for i := range 3 {
		e := s.form(snap, "sess-"+label, "create_repository", fmt.Sprintf(`{"name":"%s-explicit-%d","private":true}`, label, i))
		o := s.form(snap, "sess-"+label, "create_repository", fmt.Sprintf(`{"name":"%s-omitted-%d"}`, label, i))
		for _, f := range []formation{e, o} {
			if f.Status != "pending_approval" || f.Pool != poolV14 {
				s.t.Fatalf("formation %+v: want pending_approval on %s", f, poolV14)
			}
			s.approve(f)
		}
		explicit, omitted = append(explicit, e), append(omitted, o)
	}
	return explicit, omitted
}

// args is the arguments a call was formed with, as the host sends them.
func args(label, kind string, i int) string {
	if kind == "explicit" {
		return fmt.Sprintf(`{"name":"%s-explicit-%d","private":true}`, label, i)
	}
	return fmt.Sprintf(`{"name":"%s-omitted-%d"}`, label, i)
}

// afterRetire starts a gateway for the world after v1.4 retired: its
// backends are gone, so whatever would go to github-v1-4 (session traffic
// included) reaches the v1.3 fixture.
func afterRetire(t *testing.T, s *stack, kind string) *host {
	t.Helper()
	return connectHost(t, s.gateway(t, kind, map[string]string{poolV14: poolV13}))
}

// noPublic fails on any public effect.
func noPublic(t *testing.T, rec *fixtures.Recorder) {
	t.Helper()
	for _, e := range rec.Effects(fixtures.Filter{}) {
		if e.Did["visibility"] != "private" {
			t.Errorf("public effect: %+v", e)
		}
	}
}

// TestCertifiedSuccessor is the schedule of issue 6 through real nginx and
// Caddy: six pending create_repository calls formed on v1.4, three with an
// explicit private: true and three with private omitted; a certificate
// v1.4 → v1.3 whose envelope requires private to be present; v1.4 drains
// (a call with a successor is refused then, never substituted) and
// retires. The three explicit calls run on v1.3, private; the three
// omitted ones are refused before any effect (410 source-stale, folded
// into 403 by the gateway) and must be formed — and approved — again. Zero
// public effects.
func TestCertifiedSuccessor(t *testing.T) {
	eachGateway(t, func(t *testing.T, kind string, s *stack) {
		cert := s.certify()
		explicit, omitted := sixCalls(s, "cert")
		for i := range 3 {
			if f := explicit[i]; f.Successor != poolV13 || f.Certificate != cert {
				t.Fatalf("explicit call %+v: want the v1.3 successor through %s", f, cert)
			}
			if f := omitted[i]; f.Successor != "" {
				t.Fatalf("omitted call %+v captured a successor", f)
			}
		}
		// While v1.4 drains, a call with a successor is not substituted:
		// 409 source-draining (403 at the gateway), nothing runs.
		s.drain(poolV14)
		h := afterRetire(t, s, kind)
		_, err := h.call(explicit[0], "create_repository", args("cert", "explicit", 0))
		refusedBy(t, h, explicit[0], err, "source-draining")
		if es := s.Rec.Effects(fixtures.Filter{}); len(es) != 0 {
			t.Fatalf("effects while draining: %+v", es)
		}
		s.retireDrained(poolV14)

		for i, f := range explicit {
			res, err := h.call(f, "create_repository", args("cert", "explicit", i))
			if err != nil || res.IsError {
				t.Fatalf("explicit call %d: %v %+v (answer %+v)", i, err, res, h.last(f.ID))
			}
			es := effectsOf(s.Rec, fmt.Sprintf("cert-explicit-%d", i))
			if len(es) != 1 || es[0].Release != "v1.3" || es[0].Pool != poolV13 ||
				es[0].Did["visibility"] != "private" || es[0].Did["visibilitySource"] != "argument" || es[0].Lease == "" {
				t.Fatalf("effects of explicit call %d: %+v, want one explicit private effect on v1.3", i, es)
			}
			s.waitStatus(f.ID, "completed")
		}
		for i, f := range omitted {
			_, err := h.call(f, "create_repository", args("cert", "omitted", i))
			refusedBy(t, h, f, err, "source-stale")
			if es := effectsOf(s.Rec, fmt.Sprintf("cert-omitted-%d", i)); len(es) != 0 {
				t.Fatalf("omitted call %d had effects: %+v", i, es)
			}
		}
		if n := len(s.Rec.Effects(fixtures.Filter{})); n != 3 {
			t.Fatalf("%d effects, want 3", n)
		}
		noPublic(t, s.Rec)
		if n := s.hits[poolV14].Load(); n != 0 {
			t.Fatalf("%d calls reached v1.4 with a token", n)
		}

		// authzd's metrics count the same story.
		m, err := s.with("").GetMetricsWithResponse(t.Context())
		s.must("read /metrics", err)
		for _, want := range []string{
			`fcd_formations_total{status="pending_approval",successor="true"} 3`,
			`fcd_formations_total{status="pending_approval",successor="false"} 3`,
			`fcd_admissions_total{result="successor"} 3`,
			`fcd_admissions_total{result="source_stale"} 3`,
			`fcd_admissions_total{result="source_draining"} 1`,
		} {
			if !strings.Contains(string(m.Body), want+"\n") {
				t.Errorf("/metrics lacks %s", want)
			}
		}

		// An omitted call needs a new formation: it is formed on v1.3
		// now and waits for approval again.
		again := s.form(s.snapshot(), "sess-cert", "create_repository", args("cert", "omitted", 0))
		if again.Pool != poolV13 || again.Status != "pending_approval" || again.Successor != "" {
			t.Fatalf("the omitted call formed again: %+v, want pending_approval on v1.3", again)
		}
	})
}

// TestExactPinningStopsAllSix: the same schedule without a certificate.
// Every call is pinned to v1.4 and v1.4 is gone: all six are refused
// before any effect.
func TestExactPinningStopsAllSix(t *testing.T) {
	eachGateway(t, func(t *testing.T, kind string, s *stack) {
		explicit, omitted := sixCalls(s, "pin")
		s.retire(poolV14)
		h := afterRetire(t, s, kind)
		for _, group := range []struct {
			kind  string
			calls []formation
		}{{"explicit", explicit}, {"omitted", omitted}} {
			for i, f := range group.calls {
				if f.Successor != "" {
					t.Fatalf("%+v has a successor without a certificate", f)
				}
				_, err := h.call(f, "create_repository", args("pin", group.kind, i))
				refusedBy(t, h, f, err, "source-stale")
			}
		}
		if es := s.Rec.Effects(fixtures.Filter{}); len(es) != 0 {
			t.Fatalf("effects under exact pinning: %+v", es)
		}
		if n := s.hits[poolV13].Load() + s.hits[poolV14].Load(); n != 0 {
			t.Fatalf("%d calls reached a backend with a token", n)
		}
	})
}

// TestCertificateAfterFormation: the certificate is registered after the
// six calls were formed. It gives none of them a successor (monotonic
// authority): zero executions of the old calls on v1.3, in three trials.
func TestCertificateAfterFormation(t *testing.T) {
	m := etcdtest.Start(t)
	for trial := range 3 {
		kind := gatewaytest.Kinds[trial%len(gatewaytest.Kinds)]
		t.Run(fmt.Sprintf("trial-%d-%s", trial, kind), func(t *testing.T) {
			s := startStack(t, m)
			explicit, omitted := sixCalls(s, "late")
			s.certify()
			s.retire(poolV14)
			h := afterRetire(t, s, kind)
			for i := range 3 {
				for _, c := range []struct {
					kind string
					f    formation
				}{{"explicit", explicit[i]}, {"omitted", omitted[i]}} {
					_, err := h.call(c.f, "create_repository", args("late", c.kind, i))
					refusedBy(t, h, c.f, err, "source-stale")
					// Admission answers the same over REST: 410.
					_, err = s.as(api.RoleHost).AdmitFormationWithResponse(t.Context(), c.f.ID)
					if p := s.problem("admit "+c.f.ID, err); p.Status != http.StatusGone {
						t.Fatalf("admit %s: %v, want 410", c.f.ID, p)
					}
				}
			}
			if es := s.Rec.Effects(fixtures.Filter{Release: "v1.3"}); len(es) != 0 {
				t.Fatalf("old calls executed on v1.3: %+v", es)
			}
			if es := s.Rec.Effects(fixtures.Filter{}); len(es) != 0 {
				t.Fatalf("effects: %+v", es)
			}
		})
	}
}
