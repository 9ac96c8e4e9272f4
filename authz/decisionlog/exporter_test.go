package decisionlog_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/authz/decisionlog"
	"github.com/fcd-authz/fcd/internal/decisionlogtest"
	"github.com/fcd-authz/fcd/internal/leaktest"
	"github.com/fcd-authz/fcd/internal/testutil"
)

func TestMain(m *testing.M) {
	leaktest.VerifyTestMain(m, leaktest.IgnoreIdleHTTP()...)
}

// fast is a configuration that uploads and retries within milliseconds.
func fast(r *decisionlogtest.Receiver) decisionlog.Config {
	return decisionlog.Config{
		URL: r.URL(), HTTPClient: r.Client(), Logger: slog.New(slog.DiscardHandler),
		MinDelay: 5 * time.Millisecond, MaxDelay: 20 * time.Millisecond, RetryDelay: 5 * time.Millisecond,
	}
}

func start(t *testing.T, cfg decisionlog.Config) *decisionlog.Exporter {
	t.Helper()
	x, err := decisionlog.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.Close(context.Background()) })
	return x
}

func closeWithin(t *testing.T, x *decisionlog.Exporter) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := x.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return out
}

// TestEventInOPAShape: an event reaches the receiver as OPA's
// decision_logs plugin writes one — strictly decodable into EventV1, with
// labels id and version, an RFC 3339 timestamp, path, input, result, the
// policy revision under bundles.fcd.revision, and fcd's extras under
// custom only.
func TestEventInOPAShape(t *testing.T) {
	r := decisionlogtest.New(t, nil)
	cfg := fast(r)
	cfg.ID, cfg.Version, cfg.Labels = "replica-1", "v9.9.9", map[string]string{"env": "test"}
	x := start(t, cfg)
	at := time.Date(2026, 12, 1, 10, 11, 12, 123456789, time.FixedZone("x", 3600))
	input := map[string]any{"phase": "formation", "formation": map[string]any{"id": "f1", "arguments": map[string]any{"n": 1.5}}}
	result := map[string]any{"verdict": "allow", "approvals": 1.0}
	x.Log(context.Background(), decisionlog.Event{
		Input: input, Result: result, Revision: "sha256:abc", Timestamp: at,
		Custom: map[string]any{"fcd": map[string]any{"formation": "f1"}},
	})
	x.Log(context.Background(), decisionlog.Event{DecisionID: "given", Input: input})
	closeWithin(t, x)

	events, raw := r.Events(), r.Raw()
	if len(events) != 2 {
		t.Fatalf("%d events, want 2", len(events))
	}
	e := events[0]
	if !regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`).MatchString(e.DecisionID) {
		t.Errorf("decision_id %q is not a UUID v4", e.DecisionID)
	}
	if events[1].DecisionID != "given" {
		t.Errorf("a given decision id became %q", events[1].DecisionID)
	}
	if want := map[string]string{"id": "replica-1", "version": "v9.9.9", "env": "test"}; !reflect.DeepEqual(e.Labels, want) {
		t.Errorf("labels %v, want %v", e.Labels, want)
	}
	if e.Path != "fcd/authz" || !e.Timestamp.Equal(at) {
		t.Errorf("path %q timestamp %v", e.Path, e.Timestamp)
	}
	var ts string
	if err := json.Unmarshal(raw[0]["timestamp"], &ts); err != nil || ts != "2026-12-01T09:11:12.123456789Z" {
		t.Errorf("timestamp written as %s, want RFC 3339 in UTC", raw[0]["timestamp"])
	}
	if e.Bundles["fcd"].Revision != "sha256:abc" || len(e.Bundles) != 1 {
		t.Errorf("bundles %v, want fcd's revision", e.Bundles)
	}
	if e.Input == nil || !reflect.DeepEqual(*e.Input, input) || e.Result == nil || !reflect.DeepEqual(*e.Result, result) {
		t.Errorf("input %v result %v", e.Input, e.Result)
	}
	if !reflect.DeepEqual(e.Custom, map[string]any{"fcd": map[string]any{"formation": "f1"}}) {
		t.Errorf("custom %v", e.Custom)
	}
	var keys []string
	for k := range raw[0] {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if want := []string{"bundles", "custom", "decision_id", "input", "labels", "path", "result", "timestamp"}; !slices.Equal(keys, want) {
		t.Errorf("members %v, want %v", keys, want)
	}
	if events[1].Result != nil || events[1].Bundles != nil {
		t.Errorf("absent result and revision were written: %v %v", events[1].Result, events[1].Bundles)
	}
	if s := x.Stats(); s.Sent != 2 || s.Dropped != 0 || s.Pending != 0 {
		t.Errorf("stats %+v", s)
	}
}

// randomEvent is an event whose input does not compress away: the batch
// sizes below then depend on the limit, not on repetition.
func randomEvent(id string) decisionlog.Event {
	b := make([]byte, 300)
	_, _ = rand.Read(b)
	return decisionlog.Event{DecisionID: id, Input: map[string]any{"noise": hex.EncodeToString(b)}, Result: true}
}

// TestBatchesRespectTheUploadLimit: many events go up in few requests,
// none larger than the upload limit compressed, each event once, in order.
func TestBatchesRespectTheUploadLimit(t *testing.T) {
	for _, tc := range []struct {
		note   string
		limit  int
		events int
	}{
		{"small limit", 4 << 10, 400},
		{"default limit", 0, 1000},
	} {
		t.Run(tc.note, func(t *testing.T) {
			r := decisionlogtest.New(t, nil)
			cfg := fast(r)
			cfg.UploadSizeLimit = tc.limit
			cfg.MinDelay, cfg.MaxDelay = time.Hour, time.Hour // only the half-full buffer and Close upload
			x := start(t, cfg)
			want := ids("e", tc.events)
			for _, id := range want {
				x.Log(context.Background(), randomEvent(id))
			}
			closeWithin(t, x)
			sizes := r.Sizes()
			if got := r.IDs(); !slices.Equal(got, want) {
				t.Fatalf("received %d events, want %d in order, each once", len(got), len(want))
			}
			limit := cmp(tc.limit, decisionlog.DefaultUploadSizeLimit)
			for i, s := range sizes {
				if s > limit {
					t.Errorf("upload %d is %d bytes, over the limit %d", i, s, limit)
				}
			}
			// ~660 bytes an event, ~1.8x compression: a full batch holds
			// several, and never fewer requests than the limit forces.
			if len(sizes) > tc.events/4 || len(sizes) < 2 {
				t.Errorf("%d requests for %d events", len(sizes), tc.events)
			}
			if s := x.Stats(); s.Sent != int64(tc.events) || s.Batches != int64(len(sizes)) || s.Dropped != 0 {
				t.Errorf("stats %+v", s)
			}
			t.Logf("%d events in %d uploads", tc.events, len(sizes))
		})
	}
}

func cmp(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// TestRetriesWithoutLossOrDuplicates: 503 and 429 answers are retried;
// every event arrives once, in order.
func TestRetriesWithoutLossOrDuplicates(t *testing.T) {
	for _, status := range []int{http.StatusServiceUnavailable, http.StatusTooManyRequests, http.StatusBadGateway} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			r := decisionlogtest.New(t, func(n int) int {
				if n <= 3 {
					return status
				}
				return 0
			})
			x := start(t, fast(r))
			want := ids("r", 30)
			for _, id := range want {
				x.Log(context.Background(), randomEvent(id))
			}
			testutil.Eventually(t, 10*time.Second, "all events", func() bool { return x.Stats().Sent == 30 })
			if got := r.IDs(); !slices.Equal(got, want) {
				t.Fatalf("received %v, want %v", got, want)
			}
			if s := x.Stats(); s.FailedBatches != 3 || s.Dropped != 0 {
				t.Errorf("stats %+v, want 3 failed batches, none dropped", s)
			}
		})
	}
}

// TestReceiverDownDropsOldest: while the receiver is down, a small buffer
// keeps the newest events, drops the oldest and counts them; once it is
// back, exactly the kept ones arrive.
func TestReceiverDownDropsOldest(t *testing.T) {
	var down atomic.Bool
	down.Store(true)
	r := decisionlogtest.New(t, func(int) int {
		if down.Load() {
			return http.StatusServiceUnavailable
		}
		return 0
	})
	cfg := fast(r)
	cfg.BufferSize = 10
	x := start(t, cfg)
	all := ids("d", 25)
	for _, id := range all {
		x.Log(context.Background(), randomEvent(id))
	}
	// Two more failures after the last Log: the second began after the
	// first ended, so it carried only events still buffered.
	failed := x.Stats().FailedBatches
	testutil.Eventually(t, 10*time.Second, "two failed uploads", func() bool { return x.Stats().FailedBatches >= failed+2 })
	down.Store(false)
	testutil.Eventually(t, 10*time.Second, "the kept events", func() bool { return x.Stats().Pending == 0 })
	if got, want := r.IDs(), all[15:]; !slices.Equal(got, want) {
		t.Fatalf("received %v, want the newest %v", got, want)
	}
	if s := x.Stats(); s.Sent != 10 || s.Dropped != 15 {
		t.Errorf("stats %+v, want 10 sent, 15 dropped", s)
	}
}

// TestRefusedBatchIsDropped: a 4xx other than 408 and 429 will not change
// on retry; the batch is dropped and counted, and later events still go.
func TestRefusedBatchIsDropped(t *testing.T) {
	r := decisionlogtest.New(t, func(n int) int {
		if n == 1 {
			return http.StatusBadRequest
		}
		return 0
	})
	cfg := fast(r)
	cfg.MinDelay, cfg.MaxDelay = time.Hour, time.Hour
	cfg.BufferSize = 4 // half full: upload at once
	x := start(t, cfg)
	x.Log(context.Background(), randomEvent("a"))
	x.Log(context.Background(), randomEvent("b"))
	testutil.Eventually(t, 10*time.Second, "the refusal", func() bool { return x.Stats().FailedBatches == 1 })
	x.Log(context.Background(), randomEvent("c"))
	closeWithin(t, x)
	if got := r.IDs(); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("received %v, want [c]", got)
	}
	if s := x.Stats(); s.Dropped != 2 || s.Sent != 1 {
		t.Errorf("stats %+v", s)
	}
}

// TestOversizeEventIsDropped: an event that alone exceeds the upload
// limit is dropped, as OPA drops it, and the others are sent.
func TestOversizeEventIsDropped(t *testing.T) {
	r := decisionlogtest.New(t, nil)
	cfg := fast(r)
	cfg.UploadSizeLimit = 1024
	x := start(t, cfg)
	huge := make([]byte, 4096)
	_, _ = rand.Read(huge)
	x.Log(context.Background(), randomEvent("small-1"))
	x.Log(context.Background(), decisionlog.Event{DecisionID: "huge", Input: hex.EncodeToString(huge)})
	x.Log(context.Background(), randomEvent("small-2"))
	closeWithin(t, x)
	if got := r.IDs(); !slices.Equal(got, []string{"small-1", "small-2"}) {
		t.Fatalf("received %v", got)
	}
	if s := x.Stats(); s.Dropped != 1 || s.Sent != 2 {
		t.Errorf("stats %+v", s)
	}
}

// TestMask: configured pointers are erased from input and result before
// the event leaves, and listed in erased; a pointer to nothing is not.
func TestMask(t *testing.T) {
	input := func() map[string]any {
		return map[string]any{
			"formation": map[string]any{"id": "f1", "arguments": map[string]any{"password": "hunter2"}, "argumentDigest": "sha256:1"},
			"list":      []any{"a", "secret-b", "c"},
			"a/b":       "slash",
		}
	}
	for _, tc := range []struct {
		note       string
		mask       []string
		wantInput  any
		wantResult any
		wantErased []string
	}{
		{
			note:       "arguments",
			mask:       []string{"/input/formation/arguments"},
			wantInput:  map[string]any{"formation": map[string]any{"id": "f1", "argumentDigest": "sha256:1"}, "list": []any{"a", "secret-b", "c"}, "a/b": "slash"},
			wantResult: map[string]any{"verdict": "allow", "reasons": []any{"r"}},
			wantErased: []string{"/input/formation/arguments"},
		},
		{
			note:       "array element, escaped name, result member, missing member",
			mask:       []string{"/input/list/1", "/input/a~1b", "/result/reasons", "/input/nothing/here", "/input/list/9"},
			wantInput:  map[string]any{"formation": map[string]any{"id": "f1", "arguments": map[string]any{"password": "hunter2"}, "argumentDigest": "sha256:1"}, "list": []any{"a", "c"}},
			wantResult: map[string]any{"verdict": "allow"},
			wantErased: []string{"/input/list/1", "/input/a~1b", "/result/reasons"},
		},
		{
			note:       "whole input",
			mask:       []string{"/input"},
			wantResult: map[string]any{"verdict": "allow", "reasons": []any{"r"}},
			wantErased: []string{"/input"},
		},
	} {
		t.Run(tc.note, func(t *testing.T) {
			r := decisionlogtest.New(t, nil)
			cfg := fast(r)
			cfg.Mask = tc.mask
			x := start(t, cfg)
			x.Log(context.Background(), decisionlog.Event{Input: input(), Result: map[string]any{"verdict": "allow", "reasons": []string{"r"}}})
			closeWithin(t, x)
			events, raw := r.Events(), r.Raw()
			if len(events) != 1 {
				t.Fatalf("%d events", len(events))
			}
			e := events[0]
			var gotInput any
			if e.Input != nil {
				gotInput = *e.Input
			}
			if !reflect.DeepEqual(gotInput, tc.wantInput) || !reflect.DeepEqual(*e.Result, tc.wantResult) {
				t.Errorf("input %v\nresult %v", gotInput, *e.Result)
			}
			if !slices.Equal(e.Erased, tc.wantErased) {
				t.Errorf("erased %v, want %v", e.Erased, tc.wantErased)
			}
			if slices.Contains(tc.mask, "/input/formation/arguments") && bytes.Contains(raw[0]["input"], []byte("hunter2")) {
				t.Error("a masked argument was sent")
			}
		})
	}
	for _, bad := range []string{"input/x", "/labels/id", "/custom/fcd", ""} {
		if _, err := decisionlog.New(decisionlog.Config{URL: "http://127.0.0.1:1", Mask: []string{bad}}); err == nil {
			t.Errorf("mask %q accepted", bad)
		}
	}
}

// TestCredential: the credential goes to the receiver as a bearer
// credential and never into a log line, whatever is logged (the
// configuration itself, upload failures at debug level).
func TestCredential(t *testing.T) {
	const secret = "s3cr3t-decision-log-credential"
	r := decisionlogtest.New(t, func(n int) int {
		if n == 1 {
			return http.StatusServiceUnavailable
		}
		return 0
	})
	var logs bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg := fast(r)
	cfg.Credential, cfg.Logger = secret, logger
	logger.Info("decision log export", "config", cfg)
	slog.New(slog.NewJSONHandler(&lockedWriter{w: &logs, mu: &mu}, nil)).Info("as JSON", "config", cfg, "credential", cfg.Credential)
	x := start(t, cfg)
	x.Log(context.Background(), randomEvent("c1"))
	testutil.Eventually(t, 10*time.Second, "the event", func() bool { return x.Stats().Sent == 1 })
	closeWithin(t, x)
	auth := r.Auth()
	if len(auth) != 1 || auth[0] != "Bearer "+secret {
		t.Errorf("Authorization %q", auth)
	}
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	if !strings.Contains(out, "upload failed") {
		t.Errorf("the failed upload was not logged:\n%s", out)
	}
	for _, s := range []string{out, fmt.Sprintf("%v %+v %s", cfg, cfg, cfg.Credential)} {
		if strings.Contains(s, secret) {
			t.Fatalf("the credential leaked:\n%s", s)
		}
	}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestClose: Close uploads what is buffered without waiting for the
// next upload time; it reports what it could not deliver by its deadline;
// an event logged after Close is dropped.
func TestClose(t *testing.T) {
	t.Run("flushes", func(t *testing.T) {
		r := decisionlogtest.New(t, nil)
		cfg := fast(r)
		cfg.MinDelay, cfg.MaxDelay = time.Hour, time.Hour
		x := start(t, cfg)
		want := ids("c", 3)
		for _, id := range want {
			x.Log(context.Background(), randomEvent(id))
		}
		if s := x.Stats(); s.Pending != 3 || s.Sent != 0 {
			t.Fatalf("before Close: %+v", s)
		}
		closeWithin(t, x)
		if got := r.IDs(); !slices.Equal(got, want) {
			t.Fatalf("received %v", got)
		}
		x.Log(context.Background(), randomEvent("late"))
		if s := x.Stats(); s.Dropped != 1 || s.Pending != 0 {
			t.Errorf("after Close: %+v", s)
		}
	})
	t.Run("gives up at its deadline", func(t *testing.T) {
		r := decisionlogtest.New(t, func(int) int { return http.StatusServiceUnavailable })
		x := start(t, fast(r))
		x.Log(context.Background(), randomEvent("lost"))
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		err := x.Close(ctx)
		if err == nil || !strings.Contains(err.Error(), "1 events not delivered") {
			t.Fatalf("Close: %v", err)
		}
		if s := x.Stats(); s.Dropped != 1 || s.Sent != 0 {
			t.Errorf("stats %+v", s)
		}
	})
}

// TestConfig: what New refuses.
func TestConfig(t *testing.T) {
	for _, cfg := range []decisionlog.Config{
		{},
		{URL: "ftp://logs"},
		{URL: "http://user:pw@logs"},
		{URL: "http://logs", MinDelay: 2 * time.Second, MaxDelay: time.Second},
		{URL: "http://logs", BufferSize: -1},
		{URL: "http://logs", Labels: map[string]string{"id": "x"}},
	} {
		if _, err := decisionlog.New(cfg); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
}

// TestEvictedWhileInFlight: events the bound pushes out of the buffer
// while their batch is being sent are sent, not dropped, if that upload
// succeeds: every event is counted once.
func TestEvictedWhileInFlight(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	r := decisionlogtest.New(t, func(n int) int {
		if n == 1 {
			close(entered)
			<-release
		}
		return 0
	})
	cfg := fast(r)
	cfg.MinDelay, cfg.MaxDelay = time.Hour, time.Hour
	cfg.BufferSize = 4 // half full: upload at once
	x := start(t, cfg)
	// Registered last, so it runs first: a failing test must not leave the
	// handler waiting while the exporter and the server close.
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	all := ids("f", 6)
	x.Log(context.Background(), randomEvent(all[0]))
	x.Log(context.Background(), randomEvent(all[1]))
	select { // f-000 and f-001 are in flight
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no upload began")
	}
	for _, id := range all[2:] {
		x.Log(context.Background(), randomEvent(id)) // the last two evict the two in flight
	}
	releaseOnce.Do(func() { close(release) })
	closeWithin(t, x)
	if got := r.IDs(); !slices.Equal(got, all) {
		t.Fatalf("received %v, want %v", got, all)
	}
	if s := x.Stats(); s.Sent != 6 || s.Dropped != 0 {
		t.Errorf("stats %+v, want 6 sent, none dropped", s)
	}
}
