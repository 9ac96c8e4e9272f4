package lease

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
)

// How often, at most, a failing store looks again at why etcd does not
// answer, and how long it waits for each endpoint's TCP handshake.
const (
	reachEvery   = 2 * time.Second
	reachTimeout = 500 * time.Millisecond
)

// reachability explains, for the log, why etcd did not answer: the etcd
// client only says "context deadline exceeded" while it waits for a
// connection that never comes, which names neither the endpoint nor the
// cause. It opens a TCP connection to each endpoint and reports what
// happened ("connection refused", "i/o timeout", "no such host", or that
// the endpoint accepts connections but etcd did not answer in time). It
// looks at most every reachEvery; between looks, and while one is under
// way, it answers the last explanation, so that failing requests do not
// each dial.
type reachability struct {
	endpoints []string
	mu        sync.Mutex
	at        time.Time // of the last look started
	text      string    // its explanation, "" before the first
	looking   bool
}

// explain returns why etcd does not answer, by endpoint.
func (r *reachability) explain(ctx context.Context) string {
	r.mu.Lock()
	if r.looking || (!r.at.IsZero() && time.Since(r.at) < reachEvery) {
		text := r.text
		r.mu.Unlock()
		if text == "" {
			return "etcd at " + strings.Join(r.endpoints, ", ") + " did not answer in time"
		}
		return text
	}
	r.looking, r.at = true, time.Now()
	r.mu.Unlock()

	parts := make([]string, len(r.endpoints))
	var wg sync.WaitGroup
	for i, ep := range r.endpoints {
		wg.Go(func() { parts[i] = ep + ": " + dialReason(context.WithoutCancel(ctx), ep) })
	}
	wg.Wait()
	text := "etcd did not answer in time (" + strings.Join(parts, "; ") + ")"

	r.mu.Lock()
	r.text, r.looking = text, false
	r.mu.Unlock()
	return text
}

// dialReason says whether a TCP connection to an etcd endpoint opens, and
// why not when it does not, in the network's words.
func dialReason(ctx context.Context, endpoint string) string {
	network, addr := "tcp", endpoint
	if u, err := url.Parse(endpoint); err == nil && u.Host != "" {
		addr = u.Host
		if u.Port() == "" {
			addr = net.JoinHostPort(u.Hostname(), "2379")
		}
	} else if err == nil && (u.Scheme == "unix" || u.Scheme == "unixs") {
		network, addr = "unix", u.Opaque+u.Path
	}
	d := net.Dialer{Timeout: reachTimeout}
	conn, err := d.DialContext(ctx, network, addr)
	if err == nil {
		conn.Close()
		return "accepts connections, but etcd did not answer (overloaded, no leader, or not etcd)"
	}
	var dns *net.DNSError
	switch {
	case errors.As(err, &dns):
		return fmt.Sprintf("cannot resolve %s (%s)", dns.Name, dns.Err)
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused (nothing listens there)"
	case errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("no answer to a TCP connection within %s (host down or filtered)", reachTimeout)
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err.Error()
	}
	return err.Error()
}
