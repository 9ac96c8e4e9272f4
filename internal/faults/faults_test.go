// Package faults is fcd's robustness suite against a real etcd cluster:
// three members, each a separate process, frozen (SIGSTOP), thawed and
// killed under a store that writes all along. Its short form runs in
// every `go test ./...`; FCD_FAULT_ROUNDS=N runs N randomized rounds.
package faults

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/internal/manifesttest"
	"github.com/fcd-authz/fcd/internal/servertest"
	"github.com/fcd-authz/fcd/internal/testutil"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
	"github.com/fcd-authz/fcd/server"
	"github.com/lestrrat-go/jwx/v2/jwa"
)

// cluster is a three-member process cluster and a store on all of it,
// each member reached through a proxy, with the store's default timeouts
// and endpoint guard.
type cluster struct {
	t       *testing.T
	members []*etcdtest.Process
	proxies []*Proxy
	s       *lease.Store
	api     *server.Server
	// acked are the formations whose writes etcd acknowledged.
	acked []string
}

func startCluster(t *testing.T) *cluster {
	t.Helper()
	ps := etcdtest.StartProcessCluster(t, 3)
	c := &cluster{t: t, members: ps}
	var eps []string
	for _, m := range ps {
		p, err := NewProxy(strings.TrimPrefix(m.Endpoints()[0], "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		c.proxies = append(c.proxies, p)
		eps = append(eps, "http://"+p.Addr())
	}
	s, err := lease.Open(context.Background(), lease.Config{Endpoints: eps, Prefix: "/faults/",
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	c.s = s
	return c
}

// write is one store write (a formation record: a conditional
// transaction through the committer, as every write of a call), and how
// long it took.
func (c *cluster) write() (time.Duration, error) {
	id, err := lease.NewFormationID()
	if err != nil {
		c.t.Fatal(err)
	}
	now := time.Now().UTC()
	f := &record.Formation{Call: record.Call{ID: id, Session: "faults", Tool: "s/t", CreatedAt: now, ExpiresAt: now.Add(time.Minute)},
		Status: record.StatusReady, Approvals: []record.Approval{}, UpdatedAt: now}
	start := time.Now()
	_, err = c.s.CreateFormation(context.Background(), f, time.Hour)
	if err == nil {
		c.acked = append(c.acked, id)
	}
	return time.Since(start), err
}

// lost returns the acknowledged formations the store cannot read back.
func (c *cluster) lost() []string {
	var lost []string
	for _, id := range c.acked {
		if _, err := c.s.GetFormation(context.Background(), id); err != nil {
			lost = append(lost, id)
		}
	}
	return lost
}

// leader returns the index of the leader member.
func (c *cluster) leader() int {
	c.t.Helper()
	i, ok := c.findLeader()
	if !ok {
		c.t.Fatal("no leader")
	}
	return i
}

// writeUntil writes every 20 ms until d passed, and returns when each
// write started, whether it succeeded, and the longest a write took.
func (c *cluster) writeUntil(d time.Duration) (starts []time.Duration, oks []bool, errs []error, slowest time.Duration) {
	begin := time.Now()
	for time.Since(begin) < d {
		at := time.Since(begin)
		took, err := c.write()
		starts, oks, errs = append(starts, at), append(oks, err == nil), append(errs, err)
		slowest = max(slowest, took)
		time.Sleep(20 * time.Millisecond)
	}
	return starts, oks, errs, slowest
}

// TestFrozenFollowerIsRoutedAround: freezing a follower — its connections
// open, nothing answering on them — leaves the cluster a quorum, and the
// store stops sending to it: the guard takes it out of the endpoints, and
// every write started from 3 s after the freeze succeeds (the measured
// stall is far shorter; bench/faults reports it). Thawed, it is used
// again.
func TestFrozenFollowerIsRoutedAround(t *testing.T) {
	c := startCluster(t)
	if _, err := c.write(); err != nil {
		t.Fatal(err)
	}
	follower := (c.leader() + 1) % 3
	frozen := c.members[follower]
	frozen.Freeze()
	thawed := false
	defer func() {
		if !thawed {
			frozen.Thaw()
		}
	}()
	starts, oks, errs, slowest := c.writeUntil(6 * time.Second)
	for i, at := range starts {
		if at >= 3*time.Second && !oks[i] {
			t.Fatalf("a write %s after freezing a follower failed: %v", at, errs[i])
		}
	}
	answering, all := c.s.Endpoints()
	if len(all) != 3 || len(answering) != 2 || slices.Contains(answering, "http://"+c.proxies[follower].Addr()) {
		t.Fatalf("endpoints in use %v of %v with %s frozen", answering, all, c.proxies[follower].Addr())
	}
	// authzd on this store is ready, and says the store is degraded.
	if code, body := c.readyz(); code != http.StatusOK || !strings.Contains(body, `"store":"degraded"`) ||
		!strings.Contains(body, c.proxies[follower].Addr()) {
		t.Fatalf("/readyz with a member frozen: %d %s", code, body)
	}
	failed := 0
	for _, ok := range oks {
		if !ok {
			failed++
		}
	}
	t.Logf("%d writes in 6 s after freezing a follower: %d failed, the slowest took %s", len(oks), failed, slowest)

	frozen.Thaw()
	thawed = true
	testutil.EventuallyState(t, 10*time.Second, "the thawed member to be used again", func() bool { answering, _ := c.s.Endpoints(); return len(answering) == 3 },
		func() string {
			answering, all := c.s.Endpoints()
			return fmt.Sprintf("answering %v of %v", answering, all)
		})
}

// TestWritesFailClosedWithoutQuorum: with two of three members frozen no
// write succeeds, and each fails as ErrUnavailable within its deadline
// (1 s, plus scheduling: asserted under 3 s) instead of hanging; once
// they are thawed, writes succeed again.
func TestWritesFailClosedWithoutQuorum(t *testing.T) {
	c := startCluster(t)
	if _, err := c.write(); err != nil {
		t.Fatal(err)
	}
	leader := c.leader()
	for i, p := range c.members {
		if i != leader {
			p.Freeze()
		}
	}
	var slowest time.Duration
	for range 10 {
		took, err := c.write()
		if err == nil {
			t.Fatal("a write succeeded without a quorum")
		}
		if !errors.Is(err, record.ErrUnavailable) {
			t.Fatalf("a write without a quorum: %v, want ErrUnavailable", err)
		}
		slowest = max(slowest, took)
	}
	if slowest > 3*time.Second {
		t.Fatalf("failing closed took up to %s", slowest)
	}
	t.Logf("without a quorum, writes failed within %s", slowest)
	for i, p := range c.members {
		if i != leader {
			p.Thaw()
		}
	}
	testutil.Await(t, 20*time.Second, "a write to succeed after the quorum came back", c.write)
}

// readyz asks /readyz of an authzd API on the cluster's store.
func (c *cluster) readyz() (int, string) {
	c.t.Helper()
	if c.api == nil {
		auth, err := api.NewAuthenticator(nil)
		if err != nil {
			c.t.Fatal(err)
		}
		// A signing key, published: /readyz is ready only when this
		// replica can sign.
		key, err := manifest.GenerateKey(jwa.EdDSA)
		if err != nil {
			c.t.Fatal(err)
		}
		c.api = servertest.Start(c.t, server.Config{Store: c.s, Registrars: manifesttest.NewSigner(c.t).Verifier, Auth: auth,
			Signer: key, Issuer: "faults"})
	}
	resp, err := http.Get(c.api.URL() + "/readyz")
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
