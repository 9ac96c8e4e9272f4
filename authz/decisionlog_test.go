package authz_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/plugins/logs"

	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/authz/decisionlog"
	"github.com/fcd-authz/fcd/authz/policy"
	"github.com/fcd-authz/fcd/internal/authztest"
	"github.com/fcd-authz/fcd/internal/decisionlogtest"
	"github.com/fcd-authz/fcd/record"
)

// exporterTo returns an exporter uploading to r within milliseconds and
// masking the call's arguments, as authzd does by default.
func exporterTo(t *testing.T, r *decisionlogtest.Receiver) *decisionlog.Exporter {
	t.Helper()
	x, err := decisionlog.New(decisionlog.Config{
		URL: r.URL(), HTTPClient: r.Client(), Logger: quiet, ID: "replica-test",
		MinDelay: 5 * time.Millisecond, MaxDelay: 20 * time.Millisecond, RetryDelay: 5 * time.Millisecond,
		Mask: []string{"/input/formation/arguments"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.Close(context.Background()) })
	return x
}

// received closes x (uploading everything) and returns what r accepted.
func received(t *testing.T, x *decisionlog.Exporter, r *decisionlogtest.Receiver) ([]logs.EventV1, []map[string]json.RawMessage) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := x.Close(ctx); err != nil {
		t.Fatal(err)
	}
	return r.Events(), r.Raw()
}

// fcdIDs is custom.fcd of an event.
func fcdIDs(t *testing.T, e logs.EventV1) map[string]any {
	t.Helper()
	ids, ok := e.Custom["fcd"].(map[string]any)
	if !ok {
		t.Fatalf("custom %v has no fcd member", e.Custom)
	}
	return ids
}

// TestFormationDecisionReachesDecisionLog: a call formed with the default
// policies on a real etcd member reaches a real receiver as one OPA event:
// the policy set digest as bundles.fcd.revision, the formation's id and
// digest under custom.fcd, the policy input the engines saw (arguments
// erased, their digest kept) and the combined decision as result.
func TestFormationDecisionReachesDecisionLog(t *testing.T) {
	r := decisionlogtest.New(t, nil)
	x := exporterTo(t, r)
	e := newEnv(t, nil, nil)
	e.forms = authztest.New(t, authz.Config{Store: e.store, Decider: defaultSet(t), Now: e.clock.Now, Logger: quiet, DecisionLog: x})
	f, err := e.form(t, "s", "github/create_repository", `{"name":"payroll-exports","private":true}`, "alice", nil)
	if err != nil {
		t.Fatal(err)
	}
	events, raw := received(t, x, r)
	if len(events) != 1 {
		t.Fatalf("%d events for one formation", len(events))
	}
	ev := events[0]
	if ev.Bundles["fcd"].Revision != f.Decision.PolicyDigest || f.Decision.PolicyDigest == "" {
		t.Errorf("revision %v, the formation's policy digest %q", ev.Bundles, f.Decision.PolicyDigest)
	}
	ids := fcdIDs(t, ev)
	if ids["formation"] != f.ID || ids["digest"] != f.Digest || ids["phase"] != "formation" ||
		ids["status"] != string(record.StatusPendingApproval) || ids["approvalsRequired"] != 1.0 {
		t.Errorf("custom.fcd %v, formation %s %s %s", ids, f.ID, f.Digest, f.Status)
	}
	if ev.Labels["id"] != "replica-test" || ev.Labels["version"] == "" || ev.Path != "fcd/authz" || ev.DecisionID == "" {
		t.Errorf("labels %v path %q decision_id %q", ev.Labels, ev.Path, ev.DecisionID)
	}
	if !ev.Timestamp.Equal(f.Decision.DecidedAt) {
		t.Errorf("timestamp %v, decided at %v", ev.Timestamp, f.Decision.DecidedAt)
	}
	// The result is the stored decision, member for member.
	var result record.Decision
	if err := json.Unmarshal(raw[0]["result"], &result); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(result, f.Decision) || len(result.Engines) != 2 {
		t.Errorf("result %+v\nstored decision %+v", result, f.Decision)
	}
	// The input is the policy document; the arguments are erased.
	var in struct {
		Phase     string         `json:"phase"`
		Formation map[string]any `json:"formation"`
		Tool      map[string]any `json:"tool"`
	}
	if err := json.Unmarshal(raw[0]["input"], &in); err != nil {
		t.Fatal(err)
	}
	if in.Phase != "formation" || in.Formation["id"] != f.ID || in.Formation["argumentDigest"] != f.ArgumentDigest ||
		in.Tool["qualifiedName"] != "github/create_repository" {
		t.Errorf("input %+v", in)
	}
	if _, ok := in.Formation["arguments"]; ok || bytes.Contains(raw[0]["input"], []byte("payroll-exports")) {
		t.Error("the call's arguments were sent")
	}
	if !slices.Equal(ev.Erased, []string{"/input/formation/arguments"}) {
		t.Errorf("erased %v", ev.Erased)
	}
}

// TestAdmissionRedecisionReachesDecisionLog: a formation decided under one
// policy set and admitted under another is decided again at admission;
// that decision is logged too, with the new set's digest, and one that
// the policy set did not change is not decided again and not logged.
func TestAdmissionRedecisionReachesDecisionLog(t *testing.T) {
	dir, write := policyDir(t)
	write(allowAllRego, allowAllCedar)
	pm, err := policy.NewManager(context.Background(), policy.Source{Dir: dir}, policy.ManagerConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	r := decisionlogtest.New(t, nil)
	x := exporterTo(t, r)
	e := newAdmitEnv(t, pm)
	e.forms = authztest.New(t, authz.Config{Store: e.store, Decider: pm, Now: e.clock.Now, Issuer: e.iss, Logger: quiet, DecisionLog: x})
	ctx := context.Background()
	same := e.ready(t, "s", "github/get_repository", `{"owner":"o","repo":"same"}`, nil)
	if _, err := e.forms.Admissions.Admit(ctx, same.ID); err != nil {
		t.Fatal(err)
	}
	f := e.ready(t, "s", "github/get_repository", `{"owner":"o","repo":"r"}`, nil)
	write(allowAllRego+"\ndeny contains {\"rule\": \"no-reads\", \"reason\": \"reads are off\"} if input.tool.sideEffects == \"read\"\n", allowAllCedar)
	if err := pm.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.forms.Admissions.Admit(ctx, f.ID); !errors.Is(err, authz.ErrPolicyNowDenies) {
		t.Fatalf("admission under a policy that now denies: %v", err)
	}
	events, raw := received(t, x, r)
	var phases []string
	for _, ev := range events {
		phases = append(phases, fcdIDs(t, ev)["phase"].(string))
	}
	if want := []string{"formation", "formation", "admission"}; !slices.Equal(phases, want) {
		t.Fatalf("phases %v, want %v", phases, want)
	}
	ad := events[2]
	var result record.Decision
	if err := json.Unmarshal(raw[2]["result"], &result); err != nil {
		t.Fatal(err)
	}
	if ids := fcdIDs(t, ad); ids["formation"] != f.ID || ids["digest"] != f.Digest || ids["status"] != nil {
		t.Errorf("custom.fcd %v, formation %s", ids, f.ID)
	}
	if result.Verdict != record.VerdictDeny || ad.Bundles["fcd"].Revision != pm.Digest() || pm.Digest() == f.Decision.PolicyDigest {
		t.Errorf("admission event: verdict %s revision %v; policy now %s, at formation %s",
			result.Verdict, ad.Bundles, pm.Digest(), f.Decision.PolicyDigest)
	}
	if events[1].Bundles["fcd"].Revision != f.Decision.PolicyDigest {
		t.Errorf("formation event revision %v, want %s", events[1].Bundles, f.Decision.PolicyDigest)
	}
}
