package faults

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/internal/fixtures"
	"github.com/fcd-authz/fcd/internal/manifesttest"
	"github.com/fcd-authz/fcd/internal/servertest"
	"github.com/fcd-authz/fcd/internal/testutil"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/server"
	"github.com/lestrrat-go/jwx/v2/jwa"
)

// replica is one authzd's use cases on a store of its own, which reaches
// each etcd member through a proxy of its own (so it can be partitioned
// alone).
type replica struct {
	store   *lease.Store
	proxies []*Proxy
	reg     *authz.Registry
	uc      *authz.UseCases
}

func startReplica(t *testing.T, members []*etcdtest.Process, signer *manifesttest.Signer) *replica {
	t.Helper()
	r := &replica{}
	var eps []string
	for _, m := range members {
		p, err := NewProxy(strings.TrimPrefix(m.Endpoints()[0], "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		r.proxies = append(r.proxies, p)
		eps = append(eps, "http://"+p.Addr())
	}
	key, err := manifest.GenerateKey(jwa.EdDSA)
	if err != nil {
		t.Fatal(err)
	}
	auth, err := api.NewAuthenticator(nil)
	if err != nil {
		t.Fatal(err)
	}
	// A replica as it ships (its default policies, its trail), on the
	// cluster through the proxies; the history calls its use cases.
	srv := servertest.Start(t, server.Config{
		EtcdEndpoints: eps, EtcdPrefix: "/linear/",
		Registrars: signer.Verifier, Auth: auth, Signer: key, Issuer: "faults", TokenLifetime: 30 * time.Second,
	})
	r.store, r.uc = srv.Store(), srv.UseCases()
	r.reg = r.uc.Registry
	return r
}

// The operations of the history.
type (
	admitIn  struct{ formation string }
	admitOut struct {
		lease   string // "" unless admitted
		refused bool   // the source is draining or stale
		unknown bool   // failed otherwise: it may have happened
	}
	drainIn  struct{}
	drainOut struct{ unknown bool }
)

// fenceState is the model's state: whether the epoch drained, and each
// formation's lease ("?" for one an unknown admission may have opened).
type fenceState struct {
	drained bool
	leases  string // "f=l;" pairs, sorted
}

func (s fenceState) lease(f string) string {
	for _, kv := range strings.Split(s.leases, ";") {
		if k, v, ok := strings.Cut(kv, "="); ok && k == f {
			return v
		}
	}
	return ""
}

func (s fenceState) with(f, l string) fenceState {
	var kvs []string
	for _, kv := range strings.Split(s.leases, ";") {
		if k, _, ok := strings.Cut(kv, "="); ok && k != f {
			kvs = append(kvs, kv)
		}
	}
	kvs = append(kvs, f+"="+l)
	slices.Sort(kvs)
	return fenceState{drained: s.drained, leases: strings.Join(kvs, ";")}
}

// fenceModel is the drain fence and one lease per formation: a new lease
// only while the epoch has not drained; after the drain, an admitted
// formation's admission answers its one lease again and an unadmitted
// one is refused; no formation ever gets two leases.
var fenceModel = porcupine.NondeterministicModel{
	Init: func() []interface{} { return []interface{}{fenceState{}} },
	Step: func(state, input, output interface{}) []interface{} {
		s := state.(fenceState)
		switch in := input.(type) {
		case drainIn:
			d := s
			d.drained = true
			if output.(drainOut).unknown {
				return []interface{}{s, d}
			}
			return []interface{}{d}
		case admitIn:
			out, cur := output.(admitOut), s.lease(in.formation)
			switch {
			case out.unknown:
				next := []interface{}{s}
				if !s.drained && cur == "" {
					next = append(next, s.with(in.formation, "?"))
				}
				return next
			case out.refused:
				if s.drained && cur == "" {
					return []interface{}{s}
				}
			case cur == out.lease:
				return []interface{}{s}
			case cur == "?" || (cur == "" && !s.drained):
				return []interface{}{s.with(in.formation, out.lease)}
			}
		}
		return nil
	},
}

// TestDrainFenceIsLinearizable: two replicas admit formations
// concurrently (new ones, and some again) while one drains their epoch, with a
// follower frozen and one replica cut off from the leader (a blackhole
// proxy) for part of the run. The history — every admission's answer,
// and the drain — must be linearizable against the drain fence with one
// lease per formation (porcupine): no new lease after the drain, never two
// leases for one formation, whatever the faults made unknown.
func TestDrainFenceIsLinearizable(t *testing.T) {
	members := etcdtest.StartProcessCluster(t, 3)
	signer := manifesttest.NewSigner(t)
	a, b := startReplica(t, members, signer), startReplica(t, members, signer)
	ctx := context.Background()
	rel, err := fixtures.Lookup("github", "v1.4")
	if err != nil {
		t.Fatal(err)
	}
	jws, err := manifest.Sign(rel.ManifestJSON(), signer.Key, manifest.TypManifest)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := a.reg.Register(ctx, jws)
	if err != nil {
		t.Fatal(err)
	}
	epoch := reg.Epoch.ID
	snap, err := a.reg.CreateSnapshot(ctx, []string{"github"})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 240 {
		f, err := a.uc.Formations.Form(ctx, authz.FormRequest{Snapshot: snap.ID, Session: fmt.Sprint("s", i), Tool: "github/get_repository",
			Arguments: []byte(fmt.Sprintf(`{"owner":"o","repo":"r%d"}`, i)), Host: "h"})
		if err != nil || f.Status != "ready" {
			t.Fatalf("formation %d: %+v %v", i, f, err)
		}
		ids = append(ids, f.ID)
	}

	var (
		mu      sync.Mutex
		history []porcupine.Operation
	)
	start := time.Now()
	now := func() int64 { return int64(time.Since(start)) }
	record := func(client int, in, out interface{}, call, ret int64) {
		mu.Lock()
		history = append(history, porcupine.Operation{ClientId: client, Input: in, Output: out, Call: call, Return: ret})
		mu.Unlock()
	}
	const run = 4 * time.Second
	var (
		wg   sync.WaitGroup
		next int // the next formation never admitted
	)
	pick := func(rng *rand.Rand) string {
		mu.Lock()
		defer mu.Unlock()
		if next < len(ids) && (next == 0 || rng.IntN(3) > 0) {
			next++
			return ids[next-1]
		}
		return ids[rng.IntN(max(next, 1))] // again: answered with its lease
	}
	for w := range 4 {
		r := []*replica{a, b}[w%2]
		rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < run {
				f := pick(rng)
				call := now()
				adm, err := r.uc.Admissions.Admit(ctx, f)
				ret := now()
				out := admitOut{}
				switch {
				case err == nil:
					out.lease = adm.Lease
				case errors.Is(err, authz.ErrSourceDraining), errors.Is(err, authz.ErrSourceStale):
					out.refused = true
				default:
					out.unknown, ret = true, math.MaxInt64 // it may take effect at any time after its call
				}
				record(w, admitIn{f}, out, call, ret)
				time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond)
			}
		}()
	}
	// The faults, and the drain from replica b in the middle of them.
	leader := leaderOf(t, members)
	follower := members[(leader+1)%3]
	time.Sleep(500 * time.Millisecond)
	follower.Freeze()
	time.Sleep(500 * time.Millisecond)
	a.proxies[leader].Set(Blackhole, 0)
	time.Sleep(500 * time.Millisecond)
	call := now()
	_, err = b.reg.Drain(ctx, "ops", epoch)
	ret := now()
	if err != nil {
		ret = math.MaxInt64
		t.Logf("the drain answered %v (unknown)", err)
	}
	record(9, drainIn{}, drainOut{unknown: err != nil}, call, ret)
	time.Sleep(time.Second)
	a.proxies[leader].Set(Pass, 0)
	follower.Thaw()
	wg.Wait()

	var admitted, refused, unknown int
	for _, op := range history {
		if out, ok := op.Output.(admitOut); ok {
			switch {
			case out.lease != "":
				admitted++
			case out.refused:
				refused++
			default:
				unknown++
			}
		}
	}
	t.Logf("%d operations: %d admissions answered a lease, %d refused (draining), %d unknown", len(history), admitted, refused, unknown)
	if admitted == 0 || refused == 0 {
		t.Fatalf("the run shows no admission on one side of the drain (%d admitted, %d refused)", admitted, refused)
	}
	switch res := porcupine.CheckOperationsTimeout(fenceModel.ToModel(), history, time.Minute); res {
	case porcupine.Ok:
	case porcupine.Unknown:
		t.Fatal("the linearizability check timed out")
	default:
		t.Fatalf("the history is not linearizable against the drain fence with one lease per formation (%s)", res)
	}
}

// leaderOf is the index of the members' leader.
func leaderOf(t *testing.T, members []*etcdtest.Process) int {
	t.Helper()
	c := &cluster{t: t, members: members}
	return c.leader()
}

// TestFenceModel: the model refuses the histories the drain fence and one
// lease per formation forbid, and accepts their legal variants.
func TestFenceModel(t *testing.T) {
	op := func(in, out interface{}, call, ret int64) porcupine.Operation {
		return porcupine.Operation{Input: in, Output: out, Call: call, Return: ret}
	}
	drain := op(drainIn{}, drainOut{}, 10, 11)
	for _, tc := range []struct {
		note    string
		history []porcupine.Operation
		ok      bool
	}{
		{"admitted, then drained, then admitted again (its lease)", []porcupine.Operation{
			op(admitIn{"f"}, admitOut{lease: "l1"}, 1, 2), drain, op(admitIn{"f"}, admitOut{lease: "l1"}, 20, 21)}, true},
		{"a new lease after the drain", []porcupine.Operation{
			drain, op(admitIn{"f"}, admitOut{lease: "l1"}, 20, 21)}, false},
		{"two leases for one formation", []porcupine.Operation{
			op(admitIn{"f"}, admitOut{lease: "l1"}, 1, 2), op(admitIn{"f"}, admitOut{lease: "l2"}, 3, 4)}, false},
		{"refused before the drain", []porcupine.Operation{
			op(admitIn{"f"}, admitOut{refused: true}, 1, 2), drain}, false},
		{"refused after the drain", []porcupine.Operation{
			drain, op(admitIn{"f"}, admitOut{refused: true}, 20, 21)}, true},
		{"an unknown admission, its lease answered after the drain", []porcupine.Operation{
			op(admitIn{"f"}, admitOut{unknown: true}, 1, math.MaxInt64), drain, op(admitIn{"f"}, admitOut{lease: "l1"}, 20, 21)}, true},
		{"concurrent with the drain, a new lease", []porcupine.Operation{
			op(admitIn{"f"}, admitOut{lease: "l1"}, 9, 12), drain}, true},
	} {
		t.Run(tc.note, func(t *testing.T) {
			got := porcupine.CheckOperations(fenceModel.ToModel(), tc.history)
			if got != tc.ok {
				t.Fatalf("linearizable %v, want %v", got, tc.ok)
			}
		})
	}
}

// TestKeyPublicationOutlivesAQuorumLoss: a quorum loss longer than the
// signing key's etcd lease (4 s here; 331 s with the defaults) neither
// loses the key nor lets a token through: while it lasts the issuer
// reports the key unpublished, so it signs nothing (admission fails
// closed: authz's TestAdmissionNeedsAPublishedKey); after it the same key
// (kid) is published again and the issuer signs.
func TestKeyPublicationOutlivesAQuorumLoss(t *testing.T) {
	members := etcdtest.StartProcessCluster(t, 3)
	quiet := slog.New(slog.DiscardHandler)
	s, err := lease.Open(context.Background(), lease.Config{Endpoints: etcdtest.ClusterEndpoints(members), Prefix: "/keys/", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	key, err := manifest.GenerateKey(jwa.EdDSA)
	if err != nil {
		t.Fatal(err)
	}
	iss, err := authz.NewTokenIssuer(authz.TokenIssuerConfig{Key: key, Issuer: "faults", Lifetime: time.Second, Grace: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { iss.Publish(ctx, s); close(stopped) }()
	defer func() { cancel(); <-stopped }()
	published := func() bool {
		keys, err := s.PublishedKeys(context.Background())
		if err != nil {
			return false
		}
		for _, k := range keys {
			if strings.Contains(string(k), key.KeyID()) {
				return true
			}
		}
		return false
	}
	testutil.Eventually(t, 30*time.Second, "the key published", func() bool { return iss.Published() && published() })

	leader := leaderOf(t, members)
	for i, m := range members {
		if i != leader {
			m.Freeze()
		}
	}
	testutil.Eventually(t, 15*time.Second, "the issuer noticing the loss", func() bool { return !iss.Published() })
	time.Sleep(6 * time.Second) // past the key's lease
	for i, m := range members {
		if i != leader {
			m.Thaw()
		}
	}
	testutil.Eventually(t, 30*time.Second, "the key published again", func() bool { return iss.Published() && published() })
}
