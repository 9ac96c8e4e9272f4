package faults

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/audit"
	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/authz/policy"
	"github.com/fcd-authz/fcd/internal/authztest"
	"github.com/fcd-authz/fcd/internal/testutil"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/policies"
	"github.com/fcd-authz/fcd/record"
	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwk"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// trailPrefix is the key prefix of the trail suite's deployment.
const trailPrefix = "/faults-trail/"

// replica is one authzd replica of the trail suite: its own store client
// on the cluster (through the proxies), use cases, signing key, and an
// audit trail kept by a follower of the store.
type trailReplica struct {
	name  string
	root  string
	key   jwk.Key
	store *lease.Store
	// uc is what calls go through; a restart swaps it while they run.
	uc atomic.Pointer[authz.UseCases]

	cancel   context.CancelFunc
	done     chan struct{}
	trail    *audit.Trail
	follower *authz.Follower
}

// startReplica opens a replica on the cluster, its trail under root.
func (c *cluster) startReplica(name, root string, decider authz.Decider) *trailReplica {
	t := c.t
	t.Helper()
	var eps []string
	for _, p := range c.proxies {
		eps = append(eps, "http://"+p.Addr())
	}
	quiet := slog.New(slog.DiscardHandler)
	s, err := lease.Open(context.Background(), lease.Config{Endpoints: eps, Prefix: trailPrefix, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	key, err := manifest.GenerateKey(jwa.EdDSA)
	if err != nil {
		t.Fatal(err)
	}
	iss, err := authz.NewTokenIssuer(authz.TokenIssuerConfig{Key: key, Issuer: "faults"})
	if err != nil {
		t.Fatal(err)
	}
	r := &trailReplica{name: name, root: root, key: key, store: s}
	r.open(t)
	r.uc.Store(authztest.New(t, authz.Config{Store: s, Decider: decider, Logger: quiet, Issuer: iss, Trail: r.follower}))
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { iss.Publish(ctx, s); close(stopped) }()
	t.Cleanup(func() { cancel(); <-stopped })
	testutil.Eventually(t, 30*time.Second, "the signing key to be published", iss.Published)
	return r
}

// open opens the replica's trail where it ended and starts its follower.
// The use cases keep the follower they were built with: a crash and
// restart (crash, then open) gives them a new one through restart.
func (r *trailReplica) open(t *testing.T) {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	tr, err := audit.Open(audit.Config{Root: r.root, Replica: r.name, Key: r.key, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	f := authz.NewFollower(authz.FollowerConfig{Store: r.store, Trail: authztest.TrailWriter{Trail: tr}, Replica: r.name, Logger: quiet})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()
	r.trail, r.follower, r.cancel, r.done = tr, f, cancel, done
}

// crash stops the replica's follower where it stands, without closing its
// trail (its file keeps what was written, unsigned since the last
// checkpoint): what a kill -9 of the process leaves of the trail. An
// in-process stand-in for the process: the trail's writes are single
// write(2) calls, so a kill leaves no more than this. The replica's use
// cases stop with it (t.Cleanup closes the rest).
func (r *trailReplica) crash() {
	r.cancel()
	<-r.done
}

// closeTrail waits until the trail holds every revision up to rev, then
// stops the follower and closes the trail (signing its head).
func (r *trailReplica) closeTrail(t *testing.T, rev int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := r.follower.WaitRecorded(ctx, rev); err != nil {
		t.Errorf("replica %s: the trail did not catch up with revision %d: %v", r.name, rev, err)
	}
	r.crash()
	if err := r.trail.Close(); err != nil {
		t.Errorf("replica %s: close the trail: %v", r.name, err)
	}
}

// acked is what the replicas answered as done: admissions (leases),
// claims and outcomes.
type acked struct {
	mu                         sync.Mutex
	admissions, claims, closes map[string]bool
}

func (a *acked) add(m map[string]bool, id string) {
	a.mu.Lock()
	m[id] = true
	a.mu.Unlock()
}

// call is one call's life through random replicas: formed on one,
// admitted through another, claimed and reported through a third. Each
// step may fail under a fault; what was answered is acknowledged.
func call(ctx context.Context, rng *rand.Rand, rs []*trailReplica, snap string, n int, a *acked) {
	pick := func() *trailReplica { return rs[rng.IntN(len(rs))] }
	f, err := pick().uc.Load().Formations.Form(ctx, authz.FormRequest{Snapshot: snap, Session: fmt.Sprint("s-", n),
		Tool: "github/get_repository", Arguments: json.RawMessage(fmt.Sprintf(`{"owner":"o","repo":"r%d"}`, n)),
		PrincipalID: "alice", Host: "faults"})
	if err != nil {
		return
	}
	adm, err := pick().uc.Load().Admissions.Admit(ctx, f.ID)
	if err != nil {
		return
	}
	a.add(a.admissions, adm.Lease)
	l, err := pick().store.OpenLease(ctx, adm.Lease)
	if err != nil {
		return
	}
	claim := fmt.Sprint("cl-", n)
	if _, err := pick().uc.Load().Leases.Claim(ctx, authz.ClaimRequest{Lease: adm.Lease, Epoch: l.Target.Epoch, Revision: l.Revision, Claim: claim}); err != nil {
		return
	}
	a.add(a.claims, adm.Lease)
	if _, err := pick().uc.Load().Leases.Complete(ctx, authz.CompleteRequest{Lease: adm.Lease, Claim: claim, Outcome: record.OutcomeEffect}); err == nil {
		a.add(a.closes, adm.Lease)
	}
}

// TestTrailUnderFaults: two replicas on the three-member process cluster
// run calls (formed, admitted, claimed and reported through random
// replicas) while members are frozen, killed and restarted, the quorum is
// lost, and a replica crashes and restarts. Afterwards every replica's
// trail holds every admission, claim and outcome a replica acknowledged —
// and, since a trail follows the store, also those no one acknowledged
// (a commit after its deadline, an answer lost) — and both chains verify
// clean together. The short form runs one of each fault;
// FCD_TRAIL_FAULT_ROUNDS=N runs N randomized ones:
//
//	FCD_TRAIL_FAULT_ROUNDS=20 go test -run TestTrailUnderFaults -v ./internal/faults/
func TestTrailUnderFaults(t *testing.T) {
	c := startCluster(t)
	decider, err := policy.Load(context.Background(), policies.FS)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	rs := []*trailReplica{c.startReplica("r1", root, decider), c.startReplica("r2", root, decider)}
	ctx := context.Background()
	data, err := os.ReadFile("../../examples/github/manifest-v1.4.json")
	if err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	id, err := m.EpochID()
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := rs[0].store.RegisterEpoch(ctx, &manifest.Signed{Manifest: m, Epoch: id, KeyID: "faults", JWS: "faults"}); err != nil {
		t.Fatal(err)
	}
	snap, _, err := rs[0].store.CreateSnapshot(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}

	a := &acked{admissions: map[string]bool{}, claims: map[string]bool{}, closes: map[string]bool{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var calls sync.Mutex
	n := 0
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(w)))
			for {
				select {
				case <-stop:
					return
				default:
				}
				calls.Lock()
				n++
				i := n
				calls.Unlock()
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				call(cctx, rng, rs, snap.ID, i, a)
				cancel()
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}

	kinds := []string{"follower", "quorum", "replica", "kill"}
	rounds, _ := strconv.Atoi(os.Getenv("FCD_TRAIL_FAULT_ROUNDS"))
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	var plan []string
	if rounds <= 0 {
		plan = kinds
	} else {
		for range rounds {
			plan = append(plan, kinds[rng.IntN(len(kinds))])
		}
	}
	for _, kind := range plan {
		leader := c.waitLeader()
		other := (leader + 1 + rng.IntN(2)) % 3
		switch kind {
		case "follower":
			c.members[other].Freeze()
			time.Sleep(2 * time.Second)
			c.members[other].Thaw()
		case "quorum":
			c.members[(leader+1)%3].Freeze()
			c.members[(leader+2)%3].Freeze()
			time.Sleep(2 * time.Second)
			c.members[(leader+1)%3].Thaw()
			c.members[(leader+2)%3].Thaw()
		case "replica":
			r := rs[rng.IntN(len(rs))]
			r.crash()
			time.Sleep(time.Second)
			// The replica's new process: a new follower on the same
			// trail, and use cases that answer through it.
			r.open(t)
			restart(t, r, decider)
		case "kill":
			c.members[other].Kill()
			time.Sleep(time.Second)
			if err := c.members[other].Restart(); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Second)
	}
	close(stop)
	wg.Wait()

	// Every change is in the store's history; the trails catch up with it.
	head := testutil.Await(t, 30*time.Second, "the store's revision", func() (int64, error) { return rs[0].store.Revision(ctx) })
	for _, r := range rs {
		r.closeTrail(t, head)
	}
	keys, err := manifest.PublicSet(rs[0].key, rs[1].key)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := audit.Verify(root, keys)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK {
		t.Errorf("the trails do not verify:\n%s", rep.Summary())
	}
	for _, r := range rs {
		got := trailLeases(t, filepath.Join(root, r.name))
		for kind, want := range map[string]map[string]bool{"admission": a.admissions, "claim": a.claims, "outcome": a.closes} {
			for l := range want {
				if !got[kind][l] {
					t.Errorf("replica %s's trail lacks the acknowledged %s of lease %s", r.name, kind, l)
				}
			}
		}
		t.Logf("replica %s: %d admissions, %d claims, %d outcomes in the trail; acknowledged: %d, %d, %d",
			r.name, len(got["admission"]), len(got["claim"]), len(got["outcome"]), len(a.admissions), len(a.claims), len(a.closes))
	}
	if len(a.closes) == 0 {
		t.Error("no call completed: the run proves nothing")
	}
}

// restart gives r the use cases of a new process on the same store and
// trail: their trail is r's new follower.
func restart(t *testing.T, r *trailReplica, decider authz.Decider) {
	t.Helper()
	iss, err := authz.NewTokenIssuer(authz.TokenIssuerConfig{Key: r.key, Issuer: "faults"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { iss.Publish(ctx, r.store); close(stopped) }()
	t.Cleanup(func() { cancel(); <-stopped })
	testutil.Eventually(t, 30*time.Second, "the signing key to be published", iss.Published)
	r.uc.Store(authztest.New(t, authz.Config{Store: r.store, Decider: decider, Logger: slog.New(slog.DiscardHandler), Issuer: iss, Trail: r.follower}))
}

// trailLeases reads a chain's admission, claim and outcome events, by
// kind and lease.
func trailLeases(t *testing.T, dir string) map[string]map[string]bool {
	t.Helper()
	out := map[string]map[string]bool{"admission": {}, "claim": {}, "outcome": {}}
	files, _ := filepath.Glob(filepath.Join(dir, "trail-*.jsonl"))
	for _, path := range files {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var ev audit.Event
			if json.Unmarshal(sc.Bytes(), &ev) != nil || out[ev.Kind] == nil {
				continue
			}
			var d struct {
				Lease string `json:"lease"`
			}
			if json.Unmarshal(ev.Data, &d) == nil {
				out[ev.Kind][d.Lease] = true
			}
		}
		f.Close()
	}
	return out
}

// waitLeader is leader once the cluster has one again (an election after
// a fault takes a few seconds).
func (c *cluster) waitLeader() int {
	c.t.Helper()
	var leader int
	testutil.Eventually(c.t, 30*time.Second, "a leader", func() bool {
		var ok bool
		leader, ok = c.findLeader()
		return ok
	})
	return leader
}

// findLeader is the index of the member that is leader, if one is.
func (c *cluster) findLeader() (int, bool) {
	for i, p := range c.members {
		cli, err := clientv3.New(clientv3.Config{Endpoints: p.Endpoints(), DialTimeout: time.Second, Logger: zap.NewNop()})
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, err := cli.Status(ctx, p.Endpoints()[0])
		cancel()
		cli.Close()
		if err == nil && st.Header.MemberId == st.Leader {
			return i, true
		}
	}
	return -1, false
}
