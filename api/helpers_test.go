package api_test

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/internal/testutil"
	"github.com/prometheus/client_golang/prometheus"
)

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// etcdWatchers is the number of watches the etcd members of this process
// serve (etcd's gauge etcd_debugging_mvcc_watcher_total): a retire with
// ?wait= holds one while it waits, and nothing else in fcd watches etcd.
// It reports an error and returns -1 if the gauge cannot be read; it may
// be called from any goroutine.
func etcdWatchers(t testing.TB) float64 {
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Errorf("gather metrics: %v", err)
		return -1
	}
	for _, mf := range mfs {
		if mf.GetName() == "etcd_debugging_mvcc_watcher_total" && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Errorf("etcd's watcher gauge is not registered")
	return -1
}

// waitPublished waits until the signing key is published in etcd.
func (f *fixture) waitPublished() {
	f.t.Helper()
	testutil.Eventually(f.t, 30*time.Second, "the signing key to be published", f.issuer.Published)
}

// newReadyFixture is newFixture(t, 0) ready to form and admit calls: the
// v1.4 example registered, a snapshot of it taken (its id is returned)
// and the token signing key published.
func newReadyFixture(t *testing.T) (*fixture, string) {
	t.Helper()
	f := newFixture(t, 0)
	snap := f.registerAndSnapshot()
	f.waitPublished()
	return f, snap
}

// ranWithEffect plays the backend of an admitted call (the answer to an
// admit): it claims the lease as a fence does before the effect, then
// reports the effect under its claim.
func (f *fixture) ranWithEffect(admission reply) {
	f.t.Helper()
	f.ranWith(admission, `{"outcome":"effect","claim":"cl_test"}`)
}

// ranWith is ranWithEffect reporting report (claimed under cl_test).
func (f *fixture) ranWith(admission reply, report string) {
	f.t.Helper()
	tok, _ := admission.Body["token"].(string)
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		f.t.Fatalf("admission without a token: %s", admission.Raw)
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		f.t.Fatal(err)
	}
	var claims struct {
		Lease    string `json:"jti"`
		Epoch    string `json:"fcd_epoch"`
		Revision int64  `json:"fcd_revision"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		f.t.Fatal(err)
	}
	body, _ := json.Marshal(map[string]any{"claim": "cl_test", "epoch": claims.Epoch, "revision": claims.Revision})
	f.expect(f.do("POST", "/v1/leases/"+claims.Lease+"/claim", api.RoleBackend, body), http.StatusOK, "")
	f.expect(f.do("POST", "/v1/leases/"+claims.Lease+"/complete", api.RoleBackend, []byte(report)), http.StatusOK, "")
}
