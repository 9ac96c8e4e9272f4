// Package etcdtest runs real embedded etcd members for tests: no store in
// fcd is ever mocked. A member can be stopped and started again on the
// same ports and data, to test that fcd fails closed while etcd is away and
// recovers with nothing lost.
package etcdtest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/record"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Member is one embedded etcd member owned by a test.
type Member struct {
	t      testing.TB
	cfg    lease.EmbedConfig
	member *lease.Embedded
	// tls is the client TLS configuration of a member started by StartTLS.
	tls *tls.Config
}

// Start starts a single-node member in a temporary directory on free
// loopback ports, serving plain http to any local process
// (lease.EmbedConfig.OpenLoopback): a stand-in for an external cluster
// without authentication, which a test can reach through proxies and
// clients of its own. It is stopped when the test ends.
func Start(t testing.TB) *Member {
	t.Helper()
	return StartWith(t, nil)
}

// StartWith is Start with the member's configuration changed by configure
// (nil changes nothing), e.g. a small backend quota.
func StartWith(t testing.TB, configure func(*lease.EmbedConfig)) *Member {
	t.Helper()
	dir := t.TempDir()
	return startFresh(t, func(attempt int) *Member {
		addrs := FreeAddrs(t, 2)
		m := &Member{t: t, cfg: lease.EmbedConfig{
			Dir:          filepath.Join(dir, fmt.Sprintf("etcd-%d", attempt)),
			LogFile:      filepath.Join(dir, "etcd.log"),
			ClientURL:    "http://" + addrs[0],
			PeerURL:      "http://" + addrs[1],
			OpenLoopback: true,
		}}
		if configure != nil {
			configure(&m.cfg)
		}
		return m
	})
}

// Quota returns the backend quota the member runs with (lease.Config's
// Quota of the stores Store opens).
func (m *Member) Quota() int64 {
	if m.cfg.QuotaBytes > 0 {
		return m.cfg.QuotaBytes
	}
	return lease.DefaultQuotaBytes
}

// FillToQuota writes large values under key prefix /fill/ until etcd
// refuses a write for lack of space, which raises the NOSPACE alarm: for
// tests of what fcd does with a full store. Start the member with a small
// QuotaBytes.
func (m *Member) FillToQuota(t testing.TB) {
	t.Helper()
	cli := m.client(t)
	defer cli.Close()
	value := strings.Repeat("x", 64<<10)
	for i := range 10000 {
		_, err := cli.Put(context.Background(), fmt.Sprintf("/fill/%06d", i), value)
		if errors.Is(err, rpctypes.ErrNoSpace) {
			return
		}
		if err != nil {
			t.Fatalf("etcdtest: fill: %v", err)
		}
	}
	t.Fatal("etcdtest: the quota was not reached after 10000 writes")
}

// Disarm frees the space FillToQuota took (deleting its keys, compacting
// and defragmenting) and disarms every alarm, as an operator would.
func (m *Member) Disarm(t testing.TB) {
	t.Helper()
	cli := m.client(t)
	defer cli.Close()
	ctx := context.Background()
	resp, err := cli.Delete(ctx, "/fill/", clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("etcdtest: delete fill: %v", err)
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatalf("etcdtest: compact: %v", err)
	}
	if _, err := cli.Defragment(ctx, m.cfg.ClientURL); err != nil {
		t.Fatalf("etcdtest: defragment: %v", err)
	}
	if _, err := cli.AlarmDisarm(ctx, &clientv3.AlarmMember{}); err != nil {
		t.Fatalf("etcdtest: disarm: %v", err)
	}
}

// startFresh starts the member build makes for each attempt; it is
// stopped when the test ends. A port found free can be taken by another
// process before etcd binds it (tests of several packages run at once):
// then it tries again on the fresh ports of the next attempt.
func startFresh(t testing.TB, build func(attempt int) *Member) *Member {
	t.Helper()
	var err error
	for attempt := 0; attempt < 8; attempt++ {
		m := build(attempt)
		if err = m.start(); err == nil {
			t.Cleanup(m.Stop)
			return m
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	t.Fatalf("etcdtest: start member: %v", err)
	return nil
}

// Cluster is a cluster of embedded members on loopback, to test what fcd
// does when a quorum is lost and comes back.
type Cluster struct {
	Members []*Member
}

// StartCluster starts n members of one new cluster on free loopback ports,
// together (each is ready only once a quorum is); they are stopped when
// the test ends.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	dir := t.TempDir()
	var err error
	for attempt := 0; attempt < 4; attempt++ {
		c := &Cluster{}
		var initial []string
		addrs := FreeAddrs(t, 2*n)
		for i := range n {
			m := &Member{t: t, cfg: lease.EmbedConfig{
				Name:         fmt.Sprintf("m%d", i),
				Dir:          filepath.Join(dir, fmt.Sprintf("try%d-m%d", attempt, i)),
				LogFile:      filepath.Join(dir, fmt.Sprintf("etcd-m%d.log", i)),
				ClientURL:    "http://" + addrs[2*i],
				PeerURL:      "http://" + addrs[2*i+1],
				OpenLoopback: true,
			}}
			initial = append(initial, m.cfg.Name+"="+m.cfg.PeerURL)
			c.Members = append(c.Members, m)
		}
		errs := make(chan error, n)
		for _, m := range c.Members {
			m.cfg.InitialCluster = strings.Join(initial, ",")
			go func() { errs <- m.start() }()
		}
		err = nil
		for range n {
			if e := <-errs; e != nil && err == nil {
				err = e
			}
		}
		if err == nil {
			for _, m := range c.Members {
				t.Cleanup(m.Stop)
			}
			return c
		}
		for _, m := range c.Members {
			m.Stop()
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	t.Fatalf("etcdtest: start cluster: %v", err)
	return nil
}

func (m *Member) start() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := lease.StartEmbedded(ctx, m.cfg)
	if err != nil {
		return err
	}
	m.member = e
	return nil
}

// Endpoints returns the member's client URLs.
func (m *Member) Endpoints() []string { return []string{m.cfg.ClientURL} }

// Stop stops the member, keeping its data. Stopping twice is harmless.
func (m *Member) Stop() {
	if m.member != nil {
		m.member.Close()
		m.member = nil
	}
}

// Restart starts the member again on the same ports and data. If another
// process took a port meanwhile, it waits for it for a while.
func (m *Member) Restart() {
	m.t.Helper()
	if m.member != nil {
		return
	}
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		if err = m.start(); err == nil || !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		m.t.Fatalf("etcdtest: restart member: %v", err)
	}
}

// Store opens a store on the member with a short operation timeout, so
// that tests of an unavailable etcd do not wait long; closed at test end.
func (m *Member) Store(t testing.TB, prefix string) *lease.Store {
	t.Helper()
	s, err := lease.Open(context.Background(), lease.Config{
		Endpoints: m.Endpoints(), Prefix: prefix, OpTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second, DialTimeout: 2 * time.Second, Quota: m.Quota(),
		Logger: slog.New(slog.DiscardHandler), TLS: m.tls,
	})
	if err != nil {
		t.Fatalf("etcdtest: open store: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// FreeAddr returns a loopback host:port that was free a moment ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return FreeAddrs(t, 1)[0]
}

// FreeAddrs returns n distinct free loopback addresses: all n listeners
// stay open until every port is chosen, so the kernel cannot hand out one
// port twice (two members of a cluster on one URL).
func FreeAddrs(t testing.TB, n int) []string {
	t.Helper()
	addrs := make([]string, n)
	for i := range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("etcdtest: free port: %v", err)
		}
		defer l.Close()
		addrs[i] = fmt.Sprintf("127.0.0.1:%d", l.Addr().(*net.TCPAddr).Port)
	}
	return addrs
}

// PutRaw writes key=value straight into etcd, bypassing fcd: for tests
// that plant state without going through the use cases that write it,
// such as a lease marker without an admission.
func (m *Member) PutRaw(t testing.TB, key, value string) {
	t.Helper()
	cli := m.client(t)
	defer cli.Close()
	if _, err := cli.Put(context.Background(), key, value); err != nil {
		t.Fatalf("etcdtest: put %s: %v", key, err)
	}
}

// DeleteRaw deletes key straight from etcd.
func (m *Member) DeleteRaw(t testing.TB, key string) {
	t.Helper()
	cli := m.client(t)
	defer cli.Close()
	if _, err := cli.Delete(context.Background(), key); err != nil {
		t.Errorf("etcdtest: delete %s: %v", key, err)
	}
}

func (m *Member) client(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: m.Endpoints(), TLS: m.tls, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("etcdtest: client: %v", err)
	}
	return cli
}

// LeaseState reads an open lease's state and claim id from s, or the
// error of reading it (record.ErrLeaseClosed once it closed).
func LeaseState(t testing.TB, s *lease.Store, id string) (record.LeaseState, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := s.OpenLease(ctx, id)
	if err != nil {
		return "", "", err
	}
	return l.State, l.ClaimID(), nil
}
