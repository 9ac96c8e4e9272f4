package faults

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/internal/testutil"
)

// TestFaultRounds runs FCD_FAULT_ROUNDS randomized fault rounds (none by
// default: the short form is the tests above) against one three-member
// cluster under a writing store, and prints what they cost:
//
//	FCD_FAULT_ROUNDS=20 go test -run TestFaultRounds -v ./internal/faults/
//
// Each round picks a fault — freeze a follower, freeze the leader, freeze
// two members (quorum lost), cut the store off from the leader (a
// blackhole proxy: connections open, nothing through) or drop its
// connections to the leader (reset, and refused while it holds), delay its traffic
// to a member by 300 ms, kill a follower and restart it — holds it 3 s
// while writing every 20 ms, heals it, and checks: no write succeeds
// without a quorum; with one, the store goes on; after healing, writes
// succeed within 15 s; at the end, every write etcd acknowledged reads
// back. It reports, per fault kind, the stall (the longest time no write
// succeeded while the fault held, from the fault on) and how long failing
// writes took.
func TestFaultRounds(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv("FCD_FAULT_ROUNDS"))
	if rounds <= 0 {
		t.Skip("FCD_FAULT_ROUNDS not set")
	}
	c := startCluster(t)
	if _, err := c.write(); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	stalls := map[string][]time.Duration{}
	failing := map[string][]time.Duration{}
	for r := range rounds {
		kind := faultKinds()[rng.IntN(len(faultKinds()))]
		leader := c.leader()
		other := (leader + 1 + rng.IntN(2)) % 3
		var frozen []int
		heal := func() {}
		switch kind {
		case "follower":
			frozen = []int{other}
		case "leader":
			frozen = []int{leader}
		case "quorum":
			frozen = []int{(leader + 1) % 3, (leader + 2) % 3}
		case "partition":
			c.proxies[leader].Set(Blackhole, 0)
			heal = func() { c.proxies[leader].Set(Pass, 0) }
		case "drop":
			c.proxies[leader].Set(Drop, 0)
			heal = func() { c.proxies[leader].Set(Pass, 0) }
		case "delay":
			c.proxies[other].Set(Delay, 300*time.Millisecond)
			heal = func() { c.proxies[other].Set(Pass, 0) }
		case "restart":
			c.members[other].Kill()
			heal = func() {
				if err := c.members[other].Restart(); err != nil {
					t.Fatalf("round %d: restart member %d: %v", r, other, err)
				}
			}
		}
		for _, i := range frozen {
			c.members[i].Freeze()
		}
		start := time.Now()
		lastOK, stall := start, time.Duration(0)
		for time.Since(start) < 3*time.Second {
			took, err := c.write()
			now := time.Now()
			if err == nil {
				if kind == "quorum" {
					t.Fatalf("round %d: a write succeeded with two of three members frozen", r)
				}
				stall = max(stall, now.Sub(lastOK))
				lastOK = now
			} else {
				failing[kind] = append(failing[kind], took)
			}
			time.Sleep(20 * time.Millisecond)
		}
		stall = max(stall, time.Since(lastOK))
		for _, i := range frozen {
			c.members[i].Thaw()
		}
		heal()
		if kind != "quorum" {
			stalls[kind] = append(stalls[kind], stall)
		}
		testutil.Await(t, 15*time.Second, fmt.Sprintf("round %d (%s): a write to succeed after healing", r, kind), c.write)
		t.Logf("round %d: %s (leader %d, other %d), stall %s", r, kind, leader, other, stall.Round(time.Millisecond))
	}
	for _, kind := range faultKinds() {
		t.Logf("%-9s (%d rounds): stall %s; %d writes failed, in %s", kind, len(stalls[kind]), summary(stalls[kind]),
			len(failing[kind]), summary(failing[kind]))
	}
	if lost := c.lost(); len(lost) > 0 {
		t.Fatalf("%d of %d acknowledged writes are lost: %v", len(lost), len(c.acked), lost)
	}
	t.Logf("all %d acknowledged writes read back", len(c.acked))
}

// faultKinds are the faults a round picks from.
func faultKinds() []string {
	return []string{"follower", "leader", "quorum", "partition", "drop", "delay", "restart"}
}

// summary is "p50 … p99 … max …" of ds.
func summary(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	q := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))].Round(time.Millisecond) }
	return fmt.Sprintf("p50 %s, p99 %s, max %s", q(0.5), q(0.99), s[len(s)-1].Round(time.Millisecond))
}
