package api_test

import (
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/fcd-authz/fcd/api"
)

// TestOperatorGauges: /metrics says what runs (fcd_build_info) and what
// an operator watches in the store, read at the scrape: the formations
// waiting for approval, the open leases of each epoch and the uncertain
// ones among them.
func TestOperatorGauges(t *testing.T) {
	f, snap := newReadyFixture(t)
	w := f.do("POST", "/v1/formations", api.RoleHost, formationBody(snap, "g-w", "github/create_repository", `{"name":"x"}`, "alice"))
	f.expect(w, http.StatusCreated, "")
	if w.Body["status"] != "pending_approval" {
		t.Fatalf("write formed %v, want pending_approval", w.Body["status"])
	}
	f.admittedAndClaimed(snap, "g-running")
	uncertain, facts := f.admittedAndClaimed(snap, "g-uncertain")
	f.expect(f.do("POST", "/v1/leases/"+uncertain+"/complete", api.RoleBackend, []byte(`{"outcome":"uncertain","detail":"timeout","claim":"cl_g-uncertain"}`)), http.StatusOK, "")
	epoch := facts["epoch"].(string)

	m := f.do("GET", "/metrics", "", nil)
	f.expect(m, http.StatusOK, "")
	body := string(m.Raw)
	for _, want := range []string{
		`fcd_formations_pending_approval 1`,
		`fcd_leases_open{epoch="` + epoch + `"} 2`,
		`fcd_leases_uncertain{epoch="` + epoch + `"} 1`,
		`fcd_leases_open_partial 0`,
		`fcd_store_gauges_up 1`,
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if !strings.Contains(body, `fcd_build_info{goversion="`+runtime.Version()+`",revision="`) || !strings.Contains(body, `",version="`) {
		t.Errorf("/metrics lacks fcd_build_info with the Go version %s:\n%s", runtime.Version(), grep(body, "fcd_build_info"))
	}
}

func grep(body, prefix string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
