package lease

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fcd-authz/fcd/record"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Group commit.
//
// Every write of a call's life (its formation, admission, claim and
// outcome) is one conditional etcd transaction, and under load most of
// their cost is the round trip and the member's per-request work, not the
// bytes. The committer sends concurrent transactions to etcd as one
// transaction of nested per-item transactions, each with its own compares
// and branches, so an item whose compares fail takes its own else branch
// and fails alone with the answer it would have had on its own.
//
// There is no batching window. A transaction that finds a commit slot free
// is sent at once, alone and unnested, by its own caller; the items that
// arrive while MaxInFlight commits are under way queue, and the next free
// slot sends the queue's head as one batch. A lone call is never delayed;
// batches grow only when etcd is the bottleneck, as in a database's group
// commit.
//
// etcd evaluates every compare of a transaction, nested ones included,
// against the state before any of its writes, and refuses two writes of
// one key in one transaction. So a batch never holds two items where one
// writes a key the other reads (compares, ranges) or writes: such an item
// waits for the next batch. Within a batch no item sees another's writes,
// which makes the batch equal to running its items one after another in
// any order — the answers are those of some serial order of concurrent
// requests, as etcd's own order would give.

// Defaults of the committer.
const (
	// DefaultMaxBatch bounds the items of one batch.
	DefaultMaxBatch = 64
	// DefaultMaxInFlight bounds the transactions under way at once. More
	// than one overlaps the member's commit latency (etcd itself commits
	// concurrent requests with one fsync); on this project's 2-vCPU VM,
	// go run ./bench/admission -c 64 -designs ab -max-in-flight N gave
	// b/a 0.63, 0.68, 0.80, 0.74 for N = 1, 2, 4, 8 in one noisy series.
	DefaultMaxInFlight = 4
	// maxTxnOps is etcd's default --max-txn-ops: a bound on the compares
	// and on each branch's operations of one transaction, nested ones
	// counted against what their parent left.
	maxTxnOps = 128
	// maxBatchBytes keeps a batch well under etcd's default request size
	// limit (1.5 MiB): an item larger than that is sent alone.
	maxBatchBytes = 1 << 20
)

// txn is one conditional write: compares, and the operations to run when
// they all hold (then) or not (els).
type txn struct {
	cmps      []clientv3.Cmp
	then, els []clientv3.Op
}

// CommitStats count the committer's work since the store opened.
type CommitStats struct {
	// Transactions is the number of transactions sent to etcd: one per
	// batch, and one per item sent alone.
	Transactions int64
	// Items is the number of conditional writes committed.
	Items int64
	// Batched is the number of items that shared a transaction with
	// another.
	Batched int64
	// Split is the number of batches etcd refused as a whole (size, a
	// lease it did not know) whose items were then sent one by one.
	Split int64
}

// committer groups concurrent transactions; see above.
type committer struct {
	cli      *clientv3.Client
	timeout  time.Duration
	maxBatch int
	maxSlots int

	mu      sync.Mutex
	queue   []*pending
	running int // slots in use
	closed  bool
	// flushing counts the slots a flush holds, the caller's own and those
	// handed to a goroutine: close waits for it to reach zero.
	flushing sync.WaitGroup

	transactions, items, batched, split atomic.Int64
}

// pending is one queued item.
type pending struct {
	ctx   context.Context
	t     txn
	reads []span
	wrote []span
	size  int
	ops   int // max(compares, then, else): what etcd counts
	done  chan struct{}
	resp  *clientv3.TxnResponse
	err   error
}

func (c *committer) stats() CommitStats {
	return CommitStats{
		Transactions: c.transactions.Load(), Items: c.items.Load(),
		Batched: c.batched.Load(), Split: c.split.Load(),
	}
}

// ErrClosed is the answer of a write the store did not send because it
// was closed first. It is an [record.ErrUnavailable]: callers fail closed.
var ErrClosed = fmt.Errorf("%w: the store is closed", record.ErrUnavailable)

// commit runs t, alone or in a batch, and returns its own response: its
// compares' verdict (Succeeded), its branch's responses, and the header of
// the transaction that carried it. An error means etcd did not answer (or
// refused the request); whether t was applied is then unknown, as for any
// etcd request.
func (c *committer) commit(ctx context.Context, t txn) (*clientv3.TxnResponse, error) {
	resps, errs := c.commitAll(ctx, []txn{t})
	return resps[0], errs[0]
}

// commitAll runs ts as commit runs each, queued at once, so that those
// that do not conflict share a transaction even with a slot free.
func (c *committer) commitAll(ctx context.Context, ts []txn) ([]*clientv3.TxnResponse, []error) {
	ps := make([]*pending, len(ts))
	for i, t := range ts {
		ps[i] = newPending(ctx, t)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		errs := make([]error, len(ts))
		for i := range errs {
			errs[i] = ErrClosed
		}
		return make([]*clientv3.TxnResponse, len(ts)), errs
	}
	c.queue = append(c.queue, ps...)
	lead := c.running < c.maxSlots
	if lead {
		c.running++
		c.flushing.Add(1)
	}
	c.mu.Unlock()
	if lead {
		c.flush(true)
	}
	resps, errs := make([]*clientv3.TxnResponse, len(ts)), make([]error, len(ts))
	for i, p := range ps {
		select {
		case <-p.done:
			resps[i], errs[i] = p.resp, p.err
		case <-ctx.Done():
			errs[i] = ctx.Err()
		}
	}
	return resps, errs
}

// flush sends the queue's head while the queue holds items, then frees
// its slot. A caller flushes once (its own item is usually the head) and
// hands what queued meanwhile to a goroutine, so that it answers without
// waiting for others' batches; the goroutine takes over the caller's slot
// and its count in flushing.
func (c *committer) flush(caller bool) {
	for {
		c.mu.Lock()
		batch := c.takeLocked()
		if batch == nil {
			c.freeLocked()
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		c.send(batch)
		if caller {
			c.mu.Lock()
			if len(c.queue) == 0 {
				c.freeLocked()
				c.mu.Unlock()
				return
			}
			c.mu.Unlock()
			go c.flush(false)
			return
		}
	}
}

// freeLocked frees a flush's slot.
func (c *committer) freeLocked() {
	c.running--
	c.flushing.Done()
}

// close stops the committer: the writes still queued fail with ErrClosed,
// later ones at once, and close returns when the batches under way have
// their answers and no flush is left. The client must stay open until
// then; a batch under way ends within the committer's timeout.
func (c *committer) close() {
	c.mu.Lock()
	c.closed = true
	queued := c.queue
	c.queue = nil
	c.mu.Unlock()
	for _, p := range queued {
		p.finish(nil, ErrClosed)
	}
	c.flushing.Wait()
}

// takeLocked removes the next batch from the queue: items in arrival
// order that fit the limits and do not conflict with an item already
// taken. Items whose caller gave up are dropped.
func (c *committer) takeLocked() []*pending {
	var batch []*pending
	var taken footprint
	rest := c.queue[:0]
	size, widest := 0, 0
	for _, p := range c.queue {
		if p.ctx.Err() != nil {
			p.finish(nil, p.ctx.Err())
			continue
		}
		n := len(batch) + 1
		fits := len(batch) == 0 || (n <= c.maxBatch &&
			size+p.size <= maxBatchBytes &&
			max(widest, p.ops) <= maxTxnOps-n &&
			!taken.conflicts(p))
		if !fits {
			rest = append(rest, p)
			continue
		}
		batch = append(batch, p)
		taken.add(p)
		size += p.size
		widest = max(widest, p.ops)
	}
	clear(c.queue[len(rest):])
	c.queue = rest
	return batch
}

// send commits a batch and hands each item its answer.
func (c *committer) send(batch []*pending) {
	if len(batch) == 1 {
		c.sendAlone(batch[0])
		return
	}
	ops := make([]clientv3.Op, len(batch))
	for i, p := range batch {
		ops[i] = clientv3.OpTxn(p.t.cmps, p.t.then, p.t.els)
	}
	ctx, cancel := c.context()
	resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
	cancel()
	c.transactions.Add(1)
	if err != nil && refusedWhole(err) {
		// etcd refused the request as a whole (too large, a retention
		// lease it does not know): each item gets its own answer.
		c.split.Add(1)
		for _, p := range batch {
			c.sendAlone(p)
		}
		return
	}
	c.items.Add(int64(len(batch)))
	c.batched.Add(int64(len(batch)))
	for i, p := range batch {
		if err != nil {
			p.finish(nil, err)
			continue
		}
		inner := resp.Responses[i].GetResponseTxn()
		p.finish(&clientv3.TxnResponse{Header: resp.Header, Succeeded: inner.GetSucceeded(), Responses: inner.GetResponses()}, nil)
	}
}

func (c *committer) sendAlone(p *pending) {
	ctx, cancel := c.context()
	defer cancel()
	resp, err := c.cli.Txn(ctx).If(p.t.cmps...).Then(p.t.then...).Else(p.t.els...).Commit()
	c.transactions.Add(1)
	c.items.Add(1)
	p.finish(resp, err)
}

// context bounds one transaction. It does not end with any one caller:
// a batch carries others' items too; a caller that gives up stops waiting
// (its outcome is then unknown, as it would be for its own request).
func (c *committer) context() (context.Context, context.CancelFunc) {
	return context.WithTimeout(clientv3.WithRequireLeader(context.Background()), c.timeout)
}

// refusedWhole reports an error etcd gives a request before applying any
// of it, for something one of its items alone may cause.
func refusedWhole(err error) bool {
	for _, e := range []error{
		rpctypes.ErrGRPCRequestTooLarge, rpctypes.ErrRequestTooLarge,
		rpctypes.ErrGRPCTooManyOps, rpctypes.ErrTooManyOps,
		rpctypes.ErrGRPCDuplicateKey, rpctypes.ErrDuplicateKey,
		rpctypes.ErrGRPCLeaseNotFound, rpctypes.ErrLeaseNotFound,
	} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func newPending(ctx context.Context, t txn) *pending {
	p := &pending{ctx: ctx, t: t, done: make(chan struct{})}
	p.ops = max(len(t.cmps), len(t.then), len(t.els))
	for _, cmp := range t.cmps {
		pc := cmp.GetCompare()
		p.reads = append(p.reads, spanOf(pc.Key, pc.RangeEnd))
		p.size += len(pc.Key) + len(pc.RangeEnd) + len(cmp.ValueBytes())
	}
	for _, branch := range [][]clientv3.Op{t.then, t.els} {
		for _, op := range branch {
			s := spanOf(op.KeyBytes(), op.RangeBytes())
			p.size += len(op.KeyBytes()) + len(op.RangeBytes()) + len(op.ValueBytes())
			switch {
			case op.IsPut(), op.IsDelete():
				p.wrote = append(p.wrote, s)
			default:
				p.reads = append(p.reads, s)
			}
		}
	}
	return p
}

func (p *pending) finish(resp *clientv3.TxnResponse, err error) {
	p.resp, p.err = resp, err
	close(p.done)
}

// footprint is what the items of a batch read and write: single keys in
// sets, ranges (prefix compares) in lists, which are short.
type footprint struct {
	wrote, read             map[string]struct{}
	wroteRanges, readRanges []span
}

func (f *footprint) add(p *pending) {
	if f.wrote == nil {
		f.wrote, f.read = map[string]struct{}{}, map[string]struct{}{}
	}
	for _, s := range p.wrote {
		if s.point {
			f.wrote[string(s.lo)] = struct{}{}
		} else {
			f.wroteRanges = append(f.wroteRanges, s)
		}
	}
	for _, s := range p.reads {
		if s.point {
			f.read[string(s.lo)] = struct{}{}
		} else {
			f.readRanges = append(f.readRanges, s)
		}
	}
}

// conflicts reports whether p writes what the batch reads or writes, or
// reads what it writes.
func (f *footprint) conflicts(p *pending) bool {
	for _, s := range p.wrote {
		if f.touches(s, f.wrote, f.wroteRanges) || f.touches(s, f.read, f.readRanges) {
			return true
		}
	}
	for _, s := range p.reads {
		if f.touches(s, f.wrote, f.wroteRanges) {
			return true
		}
	}
	return false
}

// touches reports whether s overlaps one of keys or ranges.
func (f *footprint) touches(s span, keys map[string]struct{}, ranges []span) bool {
	if s.point {
		if _, ok := keys[string(s.lo)]; ok {
			return true
		}
	} else {
		for k := range keys {
			if s.overlaps(pointSpan([]byte(k))) {
				return true
			}
		}
	}
	for _, r := range ranges {
		if s.overlaps(r) {
			return true
		}
	}
	return false
}

// span is the key range [lo, hi) an operation touches; a nil hi is
// unbounded. point: the range holds the key lo alone.
type span struct {
	lo, hi []byte
	point  bool
}

// spanOf is the span of etcd's (key, range end) pair: no end is the key
// alone, "\x00" every key from key on.
func spanOf(key, end []byte) span {
	switch {
	case len(end) == 0:
		return pointSpan(key)
	case len(end) == 1 && end[0] == 0:
		return span{lo: key}
	}
	return span{lo: key, hi: end}
}

func pointSpan(key []byte) span {
	return span{lo: key, hi: append(key[:len(key):len(key)], 0), point: true}
}

func (s span) overlaps(t span) bool {
	return (t.hi == nil || bytes.Compare(s.lo, t.hi) < 0) && (s.hi == nil || bytes.Compare(t.lo, s.hi) < 0)
}
