package fencecheck_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/fencecheck"
)

func newTestReporter(t *testing.T, url string, opts fencecheck.ReporterConfig) *fencecheck.Reporter {
	t.Helper()
	opts.AuthzdURL = url
	opts.Credential = backendCredential
	if opts.Backoff == 0 {
		opts.Backoff = time.Millisecond
	}
	opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	r, err := fencecheck.NewReporter(opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func closeReporter(t *testing.T, r *fencecheck.Reporter) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestReporterRetriesTransientFailures(t *testing.T) {
	stub := newAuthzdStub(t)
	stub.failNext.Store(2) // two 503s, then success
	r := newTestReporter(t, stub.URL, fencecheck.ReporterConfig{Workers: 1})
	if !r.Report(fencecheck.OutcomeReport{Lease: "lease/with slash", Claim: "cl_1", Outcome: fencecheck.OutcomeEffect, Detail: "answered a result"}) {
		t.Fatal("dropped")
	}
	closeReporter(t, r)
	got := stub.completions()
	want := completion{Lease: "lease/with slash", Claim: "cl_1", Outcome: fencecheck.OutcomeEffect, Detail: "answered a result",
		Auth: "Bearer " + backendCredential, HasClaim: true}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("authzd received %+v, want %+v", got, want)
	}
	if s := r.Stats(); s.Sent != 1 || s.Failed != 0 || s.Dropped != 0 {
		t.Fatalf("stats = %+v", s)
	}
}

func TestReporterFinalStatusNotRetried(t *testing.T) {
	reportFailing(t, http.StatusForbidden, fencecheck.ReporterConfig{}, fencecheck.OutcomeEffect)
}

func TestReporterGivesUpAfterMaxAttempts(t *testing.T) {
	reportFailing(t, http.StatusServiceUnavailable, fencecheck.ReporterConfig{MaxAttempts: 3}, fencecheck.OutcomeUncertain)
}

// reportFailing reports outcome once, with opts, to an authzd answering
// status to every report: the report ends failed, never sent.
func reportFailing(t *testing.T, status int, opts fencecheck.ReporterConfig, outcome fencecheck.Outcome) {
	t.Helper()
	stub := newAuthzdStub(t)
	stub.status.Store(int64(status))
	r := newTestReporter(t, stub.URL, opts)
	r.Report(fencecheck.OutcomeReport{Lease: "lease-1", Outcome: outcome})
	closeReporter(t, r)
	if s := r.Stats(); s.Sent != 0 || s.Failed != 1 {
		t.Fatalf("stats = %+v", s)
	}
}

// TestReporterFullQueueDrops: Report never blocks; what does not fit is
// dropped and counted.
func TestReporterFullQueueDrops(t *testing.T) {
	stub := newAuthzdStub(t)
	block := make(chan struct{})
	stub.block.Store(&block)
	// One report a request: a worker that batches takes what is queued
	// with the report in its hands, and the queue's bound is what this
	// test counts.
	r := newTestReporter(t, stub.URL, fencecheck.ReporterConfig{QueueSize: 2, Workers: 1, MaxBatch: 1})
	start := time.Now()
	accepted := 0
	for range 10 {
		if r.Report(fencecheck.OutcomeReport{Lease: newJTI(), Outcome: fencecheck.OutcomeEffect}) {
			accepted++
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Report blocked for %s", d)
	}
	// One in the worker's hands, two queued; the first Report may not
	// have been picked up yet, so 2 or 3 fit.
	if accepted < 2 || accepted > 3 {
		t.Fatalf("accepted %d reports, want 2 or 3", accepted)
	}
	if s := r.Stats(); s.Dropped != uint64(10-accepted) {
		t.Fatalf("dropped = %d, want %d", s.Dropped, 10-accepted)
	}
	close(block)
	closeReporter(t, r)
	if n := len(stub.completions()); n != accepted {
		t.Fatalf("authzd received %d, want %d", n, accepted)
	}
	if r.Report(fencecheck.OutcomeReport{Lease: newJTI(), Outcome: fencecheck.OutcomeEffect}) {
		t.Fatal("Report accepted after Close")
	}
}

// TestReporterCloseDeadline: Close gives up on an unreachable authzd when
// its context ends, and still stops the workers.
func TestReporterCloseDeadline(t *testing.T) {
	stub := newAuthzdStub(t)
	url := stub.URL
	stub.Close()
	r := newTestReporter(t, url, fencecheck.ReporterConfig{Backoff: 50 * time.Millisecond, MaxAttempts: 1000})
	for range 5 {
		r.Report(fencecheck.OutcomeReport{Lease: newJTI(), Outcome: fencecheck.OutcomeEffect})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := r.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close = %v, want deadline exceeded", err)
	}
	if s := r.Stats(); s.Failed != 5 || s.Sent != 0 {
		t.Fatalf("stats = %+v", s)
	}
}

func TestNewReporterValidates(t *testing.T) {
	for _, o := range []fencecheck.ReporterConfig{
		{AuthzdURL: "", Credential: "x"},
		{AuthzdURL: "ftp://authzd", Credential: "x"},
		{AuthzdURL: "http://authzd"},
	} {
		if _, err := fencecheck.NewReporter(o); err == nil {
			t.Errorf("NewReporter(%+v) accepted", o)
		}
	}
}

// TestReporterBody: an outcome under a claim posts the claim; a release
// (no claim) posts no claim member at all.
func TestReporterBody(t *testing.T) {
	stub := newAuthzdStub(t)
	r := newTestReporter(t, stub.URL, fencecheck.ReporterConfig{Workers: 1})
	r.Report(fencecheck.OutcomeReport{Lease: "ls_1", Claim: "cl_1", Outcome: fencecheck.OutcomeFailed, Detail: "answered a result with isError"})
	r.Report(fencecheck.OutcomeReport{Lease: "ls_2", Outcome: fencecheck.OutcomeRejected, Detail: "refused by the fence before the effect: arguments"})
	closeReporter(t, r)
	auth := "Bearer " + backendCredential
	want := []completion{
		{Lease: "ls_1", Claim: "cl_1", HasClaim: true, Outcome: fencecheck.OutcomeFailed, Detail: "answered a result with isError", Auth: auth},
		{Lease: "ls_2", Outcome: fencecheck.OutcomeRejected, Detail: "refused by the fence before the effect: arguments", Auth: auth},
	}
	got := stub.completions()
	if len(got) != len(want) {
		t.Fatalf("authzd received %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("report %d: authzd received %+v, want %+v", i, got[i], want[i])
		}
	}
}

// TestReporterRefusedRelease: a release (rejected, no claim) that authzd
// refuses because another call claimed the lease, or it closed, is
// counted apart — not sent, not failed — and not retried; the same 409
// for an outcome under a claim is a failure.
func TestReporterRefusedRelease(t *testing.T) {
	for _, slug := range []string{"lease-claimed", "lease-closed", "lease-uncertain"} {
		var posts atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			posts.Add(1)
			problem(w, http.StatusConflict, slug)
		}))
		// One report a request: this server answers 409 to any request,
		// the batch route's too.
		r := newTestReporter(t, srv.URL, fencecheck.ReporterConfig{Workers: 1, MaxBatch: 1})
		r.Report(fencecheck.OutcomeReport{Lease: "lease-1", Outcome: fencecheck.OutcomeRejected, Detail: "refused by the fence"})
		r.Report(fencecheck.OutcomeReport{Lease: "lease-2", Claim: "cl_1", Outcome: fencecheck.OutcomeEffect})
		closeReporter(t, r)
		srv.Close()
		if s := r.Stats(); s.NotReleased != 1 || s.Failed != 1 || s.Sent != 0 || posts.Load() != 2 {
			t.Errorf("%s: stats %+v after %d posts, want one not released, one failed, two posts", slug, s, posts.Load())
		}
	}
}

// TestReporterBatches: what queues while a worker posts goes in its next
// request, one POST /v1/leases/outcomes, with each report's body; each
// report is judged by its own answer in the batch — recorded, final
// (counted failed, not retried) or transient (sent again alone). This
// server stands in for authzd's two routes (the real batch route is
// tested against etcd in api/).
func TestReporterBatches(t *testing.T) {
	type batchItem struct {
		Lease     string                `json:"lease"`
		Outcome   fencecheck.Outcome    `json:"outcome"`
		Detail    string                `json:"detail"`
		Claim     string                `json:"claim"`
		Admission *fencecheck.Admission `json:"admission"`
		Failure   *fencecheck.Failure   `json:"failure"`
	}
	var (
		mu      sync.Mutex
		singles []string
		batches [][]batchItem
	)
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/leases/{lease}/complete", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		singles = append(singles, r.PathValue("lease"))
		first := len(singles) == 1
		mu.Unlock()
		if first {
			arrived <- struct{}{}
			<-release
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{}`)
	})
	mux.HandleFunc("POST /v1/leases/outcomes", func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Reports []batchItem `json:"reports"`
		}
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		batches = append(batches, body.Reports)
		mu.Unlock()
		var results []map[string]any
		for _, rep := range body.Reports {
			switch rep.Lease {
			case "ls_closed":
				results = append(results, map[string]any{"lease": rep.Lease, "status": 409,
					"problem": map[string]any{"type": "https://example/problems#lease-closed", "status": 409}})
			case "ls_busy":
				results = append(results, map[string]any{"lease": rep.Lease, "status": 503,
					"problem": map[string]any{"type": "https://example/problems#store-unavailable", "status": 503}})
			default:
				results = append(results, map[string]any{"lease": rep.Lease, "status": 200})
			}
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"results": results})
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	r := newTestReporter(t, srv.URL, fencecheck.ReporterConfig{Workers: 1})
	facts := &fencecheck.Admission{Epoch: "sha256:ab", Revision: 7, Formation: "fm_a", Session: "s", Tool: "github/get_repository"}
	r.Report(fencecheck.OutcomeReport{Lease: "ls_first", Claim: "cl_1", Outcome: fencecheck.OutcomeEffect})
	<-arrived // the worker is busy with the first report
	for _, l := range []string{"ls_a", "ls_closed", "ls_busy", "ls_b"} {
		r.Report(fencecheck.OutcomeReport{Lease: l, Claim: "cl_" + l, Outcome: fencecheck.OutcomeEffect, Detail: "d", Admission: facts})
	}
	close(release)
	closeReporter(t, r)

	if len(batches) != 1 || len(batches[0]) != 4 {
		t.Fatalf("batches %+v, want one of 4 reports", batches)
	}
	want := batchItem{Lease: "ls_a", Outcome: fencecheck.OutcomeEffect, Detail: "d", Claim: "cl_ls_a", Admission: facts}
	if got := batches[0][0]; got.Lease != want.Lease || got.Outcome != want.Outcome || got.Detail != want.Detail ||
		got.Claim != want.Claim || got.Admission == nil || *got.Admission != *facts {
		t.Errorf("first batched report %+v, want %+v", got, want)
	}
	if !slices.Equal(singles, []string{"ls_first", "ls_busy"}) {
		t.Errorf("single reports %v, want ls_first, then ls_busy again alone", singles)
	}
	if s := r.Stats(); s.Sent != 4 || s.Failed != 1 || s.Requests != 3 || s.Batched != 4 {
		t.Errorf("stats %+v, want 4 sent, 1 failed (lease-closed), 3 requests, 4 batched", s)
	}
}
