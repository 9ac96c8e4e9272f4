package fencecheck

import (
	"container/heap"
	"context"
	"errors"
	"sync"
	"time"
)

// ReplayStore remembers the ids (jti) of accepted tokens for as long as
// the tokens could still be presented.
//
// Seen reports whether jti was recorded before and, if it was not,
// records it until exp. It must be atomic: of two concurrent calls with
// the same new jti exactly one reports false. An error means the store
// could not decide or could not record; the verifier then refuses the
// token (fail closed). Implementations must be safe for concurrent use.
//
// A pool of several backend instances needs one store shared by all of
// them (for example a Redis SET NX with expiry); with a store per
// instance, a token could be accepted once by each instance.
type ReplayStore interface {
	Seen(ctx context.Context, jti string, exp time.Time) (bool, error)
}

// ReplayForgetter is a [ReplayStore] that can drop a jti it recorded: the
// verifier forgets a token whose lease claim could not be made, so that a
// retry is decided by the claim, not refused as a replay of a call that
// never ran.
type ReplayForgetter interface {
	Forget(ctx context.Context, jti string)
}

// DefaultReplayCapacity is the capacity of the store a [Verifier] uses
// when its Replay is nil. Size a store for the peak number of tokens
// accepted within one token lifetime plus the skew: with 30 s tokens,
// 100,000 entries hold more than 2,500 calls a second.
const DefaultReplayCapacity = 100_000

// ErrReplayFull is returned by [MemoryReplay.Seen] when every entry is
// still live: the store refuses the new jti rather than forget one that a
// token could still replay.
var ErrReplayFull = errors.New("fencecheck: replay store is full of live entries")

// MemoryReplay is a bounded in-memory [ReplayStore]. Entries expire at the
// exp given to Seen and are evicted, soonest-expiring first, as new ids
// arrive; when the store is at capacity and no entry has expired, Seen
// fails with [ErrReplayFull]. The zero value is a store of
// [DefaultReplayCapacity]. It is safe for concurrent use.
type MemoryReplay struct {
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	mu       sync.Mutex
	capacity int
	entries  map[string]time.Time
	byExp    expiryHeap
}

// NewMemoryReplay returns a store holding at most capacity live ids;
// capacity <= 0 means [DefaultReplayCapacity].
func NewMemoryReplay(capacity int) *MemoryReplay {
	if capacity <= 0 {
		capacity = DefaultReplayCapacity
	}
	return &MemoryReplay{capacity: capacity, entries: make(map[string]time.Time)}
}

// Seen implements [ReplayStore].
func (m *MemoryReplay) Seen(_ context.Context, jti string, exp time.Time) (bool, error) {
	now := time.Now
	if m.Now != nil {
		now = m.Now
	}
	t := now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.evictExpired(t)
	if _, ok := m.entries[jti]; ok {
		return true, nil
	}
	if m.entries == nil {
		m.entries = make(map[string]time.Time)
	}
	capacity := m.capacity
	if capacity <= 0 {
		capacity = DefaultReplayCapacity
	}
	if len(m.entries) >= capacity {
		return false, ErrReplayFull
	}
	m.entries[jti] = exp
	heap.Push(&m.byExp, expiry{jti: jti, exp: exp})
	return false, nil
}

// Forget implements [ReplayForgetter]. The id's heap entry stays until it
// expires; a later Seen of the id records it again.
func (m *MemoryReplay) Forget(_ context.Context, jti string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.entries, jti)
}

// Len returns the number of ids held, live or not yet evicted.
func (m *MemoryReplay) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.entries)
}

// evictExpired drops every entry whose exp is not after now, soonest
// first. Amortized, each entry is pushed and popped once.
func (m *MemoryReplay) evictExpired(now time.Time) {
	for len(m.byExp) > 0 && !m.byExp[0].exp.After(now) {
		e := heap.Pop(&m.byExp).(expiry)
		if exp, ok := m.entries[e.jti]; ok && exp.Equal(e.exp) {
			delete(m.entries, e.jti) // not an entry forgotten and recorded again
		}
	}
}

type expiry struct {
	jti string
	exp time.Time
}

// expiryHeap is a min-heap of entries by exp.
type expiryHeap []expiry

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].exp.Before(h[j].exp) }
func (h expiryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap) Push(x any)        { *h = append(*h, x.(expiry)) }
func (h *expiryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = expiry{}
	*h = old[:len(old)-1]
	return e
}
