package api

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestLimiter drives one limiter on a fake clock: bursts, refill, the
// wait a refusal reports, credentials apart, and idle buckets dropped.
func TestLimiter(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	l := newLimiter(RateLimit{Rate: 2, Burst: 3}, func() time.Time { return now })
	type step struct {
		note    string
		advance time.Duration
		id      string
		n       int           // requests made
		allowed int           // how many of them pass
		wait    time.Duration // the last refusal's wait; 0: none refused
	}
	steps := []step{
		{note: "a burst passes", id: "h1", n: 3, allowed: 3},
		{note: "over the burst waits half a second", id: "h1", n: 2, allowed: 0, wait: 500 * time.Millisecond},
		{note: "another credential has its own bucket", id: "h2", n: 3, allowed: 3},
		{note: "half a second refills one", advance: 500 * time.Millisecond, id: "h1", n: 2, allowed: 1, wait: 500 * time.Millisecond},
		{note: "a refill time refills the burst", advance: 1500 * time.Millisecond, id: "h1", n: 4, allowed: 3, wait: 500 * time.Millisecond},
	}
	for _, st := range steps {
		now = now.Add(st.advance)
		allowed, wait := 0, time.Duration(0)
		for range st.n {
			err := l.allow(st.id)
			var rl *rateLimitedError
			switch {
			case err == nil:
				allowed++
			case errors.As(err, &rl) && errors.Is(err, errRateLimited):
				wait = rl.wait
			default:
				t.Fatalf("%s: %v", st.note, err)
			}
		}
		if allowed != st.allowed || wait != st.wait {
			t.Errorf("%s: %d allowed, wait %s; want %d, %s", st.note, allowed, wait, st.allowed, st.wait)
		}
	}
	// Buckets idle past the refill time (and the sweep interval) are
	// dropped; a busy one stays.
	for i := range 100 {
		if err := l.allow(fmt.Sprint("idle-", i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := l.size(); n != 102 {
		t.Fatalf("%d buckets, want 102", n)
	}
	now = now.Add(time.Minute)
	if err := l.allow("busy"); err != nil {
		t.Fatal(err)
	}
	if n := l.size(); n != 1 {
		t.Fatalf("%d buckets after a minute idle, want 1 (the one just used)", n)
	}
	if newLimiter(RateLimit{}, nil) != nil || newLimiter(RateLimit{Rate: -1, Burst: 5}, nil) != nil {
		t.Fatal("a zero or negative rate must disable the limit")
	}
	if d := newLimiter(RateLimit{Rate: 0.5}, nil).limit.Burst; d != 1 {
		t.Fatalf("default burst for 0.5/s is %d, want 1", d)
	}
}
