package lease

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Defaults of the endpoint guard.
const (
	// DefaultProbeInterval is how often each member is asked whether it
	// answers.
	DefaultProbeInterval = 250 * time.Millisecond
	// DefaultProbeTimeout is how long a member has to answer a probe.
	DefaultProbeTimeout = 400 * time.Millisecond
)

// endpointGuard keeps the etcd client's endpoints to the members that
// answer. The client balances requests round robin over its endpoints and
// keeps sending to a member whose connection is open even when the member
// does not answer (frozen, stalled on its disk, cut off behind a proxy
// that keeps the connection): gRPC keepalives, which cannot be set below
// 10 s, are the only thing that would notice, and every request sent there
// meanwhile waits out its deadline. The guard asks each member, on a
// connection of its own, for a serializable read that needs a leader
// every ProbeInterval; a member that does not answer within ProbeTimeout,
// or has no leader, leaves the client's endpoints until it answers again.
// So a sick member costs at most about ProbeInterval + ProbeTimeout of
// requests (plus those already sent to it, bounded by their deadline).
// With no member answering, every endpoint stays: requests fail closed by
// their deadlines, as without a guard.
type endpointGuard struct {
	cli      *clientv3.Client
	all      []string
	probes   []*clientv3.Client // one per member, in all's order
	interval time.Duration
	timeout  time.Duration
	log      *slog.Logger
	// key is the key probed: inside fcd's prefix, the only range a
	// cluster's RBAC lets fcd read (docs/trust.md).
	key string

	mu      sync.Mutex
	healthy []string // the client's endpoints now
}

// newEndpointGuard dials one probe connection per endpoint.
func newEndpointGuard(cli *clientv3.Client, cfg clientv3.Config, key string, interval, timeout time.Duration, log *slog.Logger) (*endpointGuard, error) {
	g := &endpointGuard{cli: cli, all: slices.Clone(cfg.Endpoints), interval: interval, timeout: timeout, log: log, key: key,
		healthy: slices.Clone(cfg.Endpoints)}
	for _, ep := range cfg.Endpoints {
		pc := cfg
		pc.Endpoints = []string{ep}
		pc.Logger = zap.NewNop()
		p, err := clientv3.New(pc)
		if err != nil {
			g.close()
			return nil, err
		}
		g.probes = append(g.probes, p)
	}
	return g, nil
}

// run probes until ctx ends.
func (g *endpointGuard) run(ctx context.Context) {
	t := time.NewTicker(g.interval)
	defer t.Stop()
	for {
		g.probeOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// probeOnce asks every member at once and sets the client's endpoints to
// those that answered.
func (g *endpointGuard) probeOnce(ctx context.Context) {
	ok := make([]bool, len(g.all))
	var wg sync.WaitGroup
	for i, p := range g.probes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), g.timeout)
			defer cancel()
			_, err := p.Get(pctx, g.key, clientv3.WithSerializable(), clientv3.WithCountOnly())
			ok[i] = err == nil
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	var healthy []string
	for i, ep := range g.all {
		if ok[i] {
			healthy = append(healthy, ep)
		}
	}
	if len(healthy) == 0 {
		healthy = g.all // nothing answers: leave it to the deadlines
	}
	g.mu.Lock()
	changed := !slices.Equal(healthy, g.healthy)
	g.healthy = healthy
	g.mu.Unlock()
	if changed {
		g.cli.SetEndpoints(healthy...)
		g.log.Warn("etcd endpoints", "answering", healthy, "all", g.all)
	}
}

// status returns the endpoints in use and all of them.
func (g *endpointGuard) status() (healthy, all []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.healthy), slices.Clone(g.all)
}

func (g *endpointGuard) close() {
	for _, p := range g.probes {
		p.Close()
	}
}
