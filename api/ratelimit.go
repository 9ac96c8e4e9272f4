package api

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// RateLimit is a token bucket: Rate tokens a second, at most Burst held.
type RateLimit struct {
	// Rate is the sustained rate, per second; zero (or less) means no
	// limit.
	Rate float64
	// Burst is how many requests may come at once after an idle while;
	// zero (or less) means the larger of 1 and one second's Rate.
	Burst int
}

// errRateLimited is the problem of a request over its credential's
// limit; *rateLimitedError carries when to retry.
var errRateLimited = errors.New("too many requests for this credential")

// rateLimitedError is errRateLimited with the wait until a token is there.
type rateLimitedError struct {
	wait  time.Duration
	limit RateLimit
}

func (e *rateLimitedError) Error() string {
	return fmt.Sprintf("%v: at most %g a second, bursts of %d; retry in %s", errRateLimited, e.limit.Rate, e.limit.Burst, e.wait.Round(time.Millisecond))
}

func (e *rateLimitedError) Unwrap() error { return errRateLimited }

// retryAfter is the Retry-After value of e: whole seconds, at least 1
// (RFC 9110 has no fractions, and 0 would invite an immediate retry).
func (e *rateLimitedError) retryAfter() string {
	return strconv.Itoa(max(1, int(math.Ceil(e.wait.Seconds()))))
}

// limiter holds one token bucket per credential id, in memory: each
// replica limits on its own (a credential spread over R replicas gets up
// to R times the rate). Buckets that have been idle long enough to be
// full again are dropped, since a fresh bucket is the same as a full one:
// memory is bounded by the credentials active within one refill time.
type limiter struct {
	limit RateLimit
	now   func() time.Time
	// refill is how long an empty bucket takes to fill: a bucket idle this
	// long is full, and dropping it changes nothing.
	refill time.Duration

	mu        sync.Mutex
	buckets   map[string]*bucket
	lastSweep time.Time
}

type bucket struct {
	lim  *rate.Limiter
	used time.Time
}

// newLimiter returns the limiter of l, or nil when l sets no limit.
func newLimiter(l RateLimit, now func() time.Time) *limiter {
	if l.Rate <= 0 {
		return nil
	}
	if l.Burst <= 0 {
		l.Burst = max(1, int(math.Ceil(l.Rate)))
	}
	if now == nil {
		now = time.Now
	}
	refill := time.Duration(float64(l.Burst) / l.Rate * float64(time.Second))
	return &limiter{limit: l, now: now, refill: refill, buckets: map[string]*bucket{}}
}

// allow takes a token from id's bucket, or returns a *rateLimitedError
// saying how long until one is there. A refused request takes nothing.
func (l *limiter) allow(id string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	l.sweep(now)
	b := l.buckets[id]
	if b == nil {
		b = &bucket{lim: rate.NewLimiter(rate.Limit(l.limit.Rate), l.limit.Burst)}
		l.buckets[id] = b
	}
	b.used = now
	r := b.lim.ReserveN(now, 1)
	if wait := r.DelayFrom(now); wait > 0 {
		r.CancelAt(now)
		return &rateLimitedError{wait: wait, limit: l.limit}
	}
	return nil
}

// sweep drops the buckets idle for a refill time, at most once per refill
// time or minute, whichever is longer, so its cost is amortized over the
// requests of that time.
func (l *limiter) sweep(now time.Time) {
	if now.Sub(l.lastSweep) < max(l.refill, time.Minute) {
		return
	}
	l.lastSweep = now
	for id, b := range l.buckets {
		if now.Sub(b.used) >= l.refill {
			delete(l.buckets, id)
		}
	}
}

// size is how many buckets are held.
func (l *limiter) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}

// limitCaller refuses a request of a credential over its limit with 429
// rate-limited before the handler runs; without a limiter it does nothing.
// It runs after require, which put the credential in the context.
func (s *server) limitCaller(l *limiter) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		if l == nil {
			return next
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			caller, _ := CallerFrom(r.Context())
			if err := l.allow(caller.ID); err != nil {
				s.problem(w, r, err)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}
