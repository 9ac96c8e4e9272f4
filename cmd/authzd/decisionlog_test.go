package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/client"
	"github.com/fcd-authz/fcd/internal/decisionlogtest"
	"github.com/fcd-authz/fcd/internal/testutil"
	"github.com/fcd-authz/fcd/manifest"
)

// TestServeExportsDecisionLogs: `serve --decision-log-url` sends the
// decision of a call formed through the API to a real OPA-compatible
// receiver, with the bearer credential from its file, the configured
// labels and the arguments erased — and the credential appears in no log
// line.
func TestServeExportsDecisionLogs(t *testing.T) {
	const secret = "dl-secret-credential-value"
	r := decisionlogtest.New(t, nil)
	dir := filepath.Join(t.TempDir(), "data")
	credFile := filepath.Join(t.TempDir(), "dl-credential")
	if err := os.WriteFile(credFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	url, log, stop := startServerLog(t, dir, "--dev", "--decision-log-url", r.URL(),
		"--decision-log-credential-file", credFile, "--decision-log-labels", "env=test,team=fcd",
		"--decision-log-min-delay", "10ms", "--decision-log-max-delay", "50ms", "--log-level", "debug")
	stopped := false
	defer func() {
		if !stopped {
			stop()
		}
	}()
	c := newDevClient(t, url, dir)
	key, err := manifest.LoadPrivateKey(c.dc.Keys["registrar"])
	if err != nil {
		t.Fatal(err)
	}
	m, err := os.ReadFile("../../examples/github/manifest-v1.4.json")
	if err != nil {
		t.Fatal(err)
	}
	jws, err := manifest.Sign(bytes.TrimSpace(m), key, manifest.TypManifest)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.as(api.RoleRegistrar).RegisterManifestWithBodyWithResponse(t.Context(), "application/jose", bytes.NewReader(jws))
	c.must("register", err)
	host := c.as(api.RoleHost)
	snap, err := host.CreateSnapshotWithResponse(t.Context(), client.SnapshotRequest{Servers: &[]string{"github"}})
	c.must("snapshot", err)
	args, alice := map[string]any{"name": "payroll-exports", "private": true}, "alice"
	formed, err := host.CreateFormationWithResponse(t.Context(), client.FormationRequest{Snapshot: snap.JSON201.Id, Session: "s", Tool: "github/create_repository",
		Arguments: &args, Principal: &client.FormationRequest_Principal{Id: &alice}})
	c.must("form", err)
	f := formed.JSON201

	testutil.Eventually(t, 10*time.Second, "a decision to reach the receiver", func() bool { return len(r.Events()) > 0 })
	events, rawEvents := r.Events(), r.Raw()
	ev := events[0]
	fcd, _ := ev.Custom["fcd"].(map[string]any)
	if len(events) != 1 || fcd["formation"] != f.Id || ev.Bundles["fcd"].Revision != f.Decision.PolicyDigest || f.Decision.PolicyDigest == "" {
		t.Fatalf("%d events; first: custom %v bundles %v; formation %s policy %s", len(events), ev.Custom, ev.Bundles, f.Id, f.Decision.PolicyDigest)
	}
	if ev.Labels["env"] != "test" || ev.Labels["team"] != "fcd" || ev.Labels["id"] == "" {
		t.Errorf("labels %v", ev.Labels)
	}
	if bytes.Contains(rawEvents[0]["input"], []byte("payroll-exports")) || len(ev.Erased) != 1 {
		t.Errorf("arguments not erased by default: erased %v", ev.Erased)
	}
	if auth := r.Auth(); auth[0] != "Bearer "+secret {
		t.Errorf("Authorization %q", auth[0])
	}
	// The exporter's counts are on /metrics once the upload's answer is in.
	want := []string{"fcd_decision_log_events_sent_total 1\n", `fcd_decision_log_uploads_total{result="ok"} 1` + "\n",
		"fcd_decision_log_events_pending 0\n", "fcd_decision_log_events_dropped_total 0\n"}
	var metrics string
	var missing []string
	testutil.EventuallyState(t, 10*time.Second, "the exporter's counts on /metrics", func() bool {
		resp, err := c.as("").GetMetricsWithResponse(t.Context())
		c.must("metrics", err)
		metrics = string(resp.Body)
		missing = slices.DeleteFunc(slices.Clone(want), func(w string) bool { return strings.Contains(metrics, w) })
		return len(missing) == 0
	}, func() string { return fmt.Sprintf("/metrics lacks %q:\n%s", missing, metrics) })
	stop()
	stopped = true
	if !strings.Contains(log, "decision logs exported") || !strings.Contains(log, ev.Labels["id"]) {
		t.Errorf("the exporter's start (with the replica id %s) was not logged:\n%s", ev.Labels["id"], log)
	}
	if strings.Contains(log, secret) {
		t.Fatal("the decision-log credential was logged")
	}
}
