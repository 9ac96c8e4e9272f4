package lease_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/record"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// The store conformance suite: each behaviour of lease.Store is a subtest
// that gets a freshly opened store on a fresh prefix, and the table runs
// against every backend — an embedded member in this process, an etcd
// member in a separate OS process, reached only over the network, and a
// cluster of three members. What the store promises must not depend on
// which etcd it talks to.

// backend is an etcd the suite runs against; start returns its client
// endpoints and stops it when the test ends.
type backend struct {
	name  string
	start func(t *testing.T) []string
}

var backends = []backend{
	{"embedded", func(t *testing.T) []string { return etcdtest.Start(t).Endpoints() }},
	{"external", func(t *testing.T) []string { return etcdtest.StartProcess(t).Endpoints() }},
	{"cluster", func(t *testing.T) []string {
		var eps []string
		for _, m := range etcdtest.StartCluster(t, 3).Members {
			eps = append(eps, m.Endpoints()...)
		}
		return eps
	}},
}

// behaviour is one entry of the suite.
type behaviour struct {
	name string
	run  func(t *testing.T, x *fixture)
}

// conformance is the suite; its entries live in conformance_*_test.go.
var conformance = []behaviour{
	{"store/prefix-isolation", prefixIsolation},
	{"store/corrupt-records-fail-closed", corruptRecords},
	{"epoch/register-and-lifecycle", epochLifecycle},
	{"snapshot/content-addressed", snapshotContentAddressed},
	{"formation/create-get-update", formationCreateGetUpdate},
	{"formation/retention-and-expiry", formationRetention},
	{"formation/pending-approval-index", formationPendingIndex},
	{"formation/list-pages", formationPages},
	{"admit/marker-and-compares", admitMarkerAndCompares},
	{"claim/first-wins", claimFirstWins},
	{"close/who-may-close", closeWhoMayClose},
	{"close/session-ledger", closeSessionLedger},
	{"generation/release-older", generationReleasesOlder},
	{"unreported/sweep", unreportedSweep},
	{"jwks/publish-list-expire", jwksPublished},
	{"certificate/register-get-revoke", certificateRegisterGet},
}

// TestConformance runs every behaviour on every backend: the backends in
// parallel, each starting its etcd once, and the behaviours on one
// backend in parallel, each on its own prefix. One backend alone:
// go test -run 'TestConformance/external' ./lease/
func TestConformance(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			endpoints := b.start(t)
			for _, c := range conformance {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					c.run(t, newFixture(t, endpoints, "/conformance/"+c.name+"/"))
				})
			}
		})
	}
}

// fixture is what a behaviour gets: a store freshly opened on its own
// prefix, and a raw etcd client for what the store's API cannot show
// (retention leases) or set up (an interrupted release, a corrupt
// record). The raw helpers find keys by the ids or values they hold,
// never by the store's key layout.
type fixture struct {
	s         *lease.Store
	endpoints []string
	prefix    string
	raw       *clientv3.Client
	t0        time.Time
	n         int
}

func newFixture(t *testing.T, endpoints []string, prefix string) *fixture {
	t.Helper()
	raw, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	return &fixture{
		s: etcdtest.OpenStore(t, endpoints, prefix), endpoints: endpoints, prefix: prefix, raw: raw,
		t0: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC),
	}
}

// open opens another store on the fixture's etcd.
func (x *fixture) open(t *testing.T, prefix string) *lease.Store {
	t.Helper()
	return etcdtest.OpenStore(t, x.endpoints, prefix)
}

// env is the fixture as the claim tests' environment, for their helpers
// (req, mustClaim, state, status).
func (x *fixture) env(ep *record.Epoch) *claimEnv { return &claimEnv{s: x.s, ep: ep, t0: x.t0} }

// call is one admission to make: a fresh ready formation of tool in
// session, admitted to ep at generation gen, at x.t0 plus at.
type call struct {
	ep        *record.Epoch
	session   string // empty: a session of its own
	tool      string // empty: github/get_repository
	gen       int64
	at        time.Duration
	requires  []string
	exclusive []string
}

// form creates a ready formation of tool in session and returns it with
// its revision.
func (x *fixture) form(t *testing.T, session, tool string) (*record.Formation, int64) {
	t.Helper()
	fid, err := lease.NewFormationID()
	if err != nil {
		t.Fatal(err)
	}
	f := &record.Formation{Call: record.Call{ID: fid, Session: session, Tool: tool,
		CreatedAt: x.t0, ExpiresAt: x.t0.Add(time.Hour)}, Status: record.StatusReady}
	rev, err := x.s.CreateFormation(testCtx(t), f, time.Hour)
	if err != nil {
		t.Fatalf("create formation: %v", err)
	}
	return f, rev
}

// tryAdmit makes the admission c and returns the lease it asked for and
// Admit's answer.
func (x *fixture) tryAdmit(t *testing.T, c call) (*record.Lease, error) {
	t.Helper()
	x.n++
	if c.session == "" {
		c.session = fmt.Sprint("session-", x.n)
	}
	if c.tool == "" {
		c.tool = "github/get_repository"
	}
	f, rev := x.form(t, c.session, c.tool)
	lid, err := lease.NewLeaseID()
	if err != nil {
		t.Fatal(err)
	}
	l := &record.Lease{ID: lid, Formation: f.ID, Session: c.session, Tool: c.tool, Generation: c.gen,
		AdmittedAt: x.t0.Add(c.at), Target: c.ep.Target()}
	return l, x.s.Admit(testCtx(t), lease.AdmitRequest{Formation: f, FormationRev: rev, Lease: l,
		Requires: c.requires, Exclusive: c.exclusive})
}

// admit makes the admission c, which must succeed, and returns the lease
// as read back.
func (x *fixture) admit(t *testing.T, c call) *record.Lease {
	t.Helper()
	l, err := x.tryAdmit(t, c)
	if err != nil {
		t.Fatalf("admit: %v", err)
	}
	got, err := x.s.OpenLease(testCtx(t), l.ID)
	if err != nil {
		t.Fatalf("read back the admitted lease: %v", err)
	}
	return got
}

// release closes an unclaimed lease as rejected (a release).
func (x *fixture) release(t *testing.T, l *record.Lease) {
	t.Helper()
	if _, err := x.s.CloseLease(testCtx(t), lease.CloseRequest{Lease: l.ID, Outcome: record.OutcomeRejected, Keep: time.Hour}); err != nil {
		t.Fatalf("release %s: %v", l.ID, err)
	}
}

// rawKeys returns the keys under the fixture's prefix that match.
func (x *fixture) rawKeys(t *testing.T, match func(kv *mvccpb.KeyValue) bool) []*mvccpb.KeyValue {
	t.Helper()
	resp, err := x.raw.Get(testCtx(t), x.prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var out []*mvccpb.KeyValue
	for _, kv := range resp.Kvs {
		if match(kv) {
			out = append(out, kv)
		}
	}
	return out
}

// rawKey returns the one key under the prefix whose name ends in "/"+id
// (ids are random: formation, lease and key ids name one key each).
func (x *fixture) rawKey(t *testing.T, suffix string) *mvccpb.KeyValue {
	t.Helper()
	kvs := x.rawKeys(t, func(kv *mvccpb.KeyValue) bool { return strings.HasSuffix(string(kv.Key), "/"+suffix) })
	if len(kvs) != 1 {
		t.Fatalf("%d keys end in %s, want 1", len(kvs), suffix)
	}
	return kvs[0]
}

// rawValue returns the one key under the prefix holding value.
func (x *fixture) rawValue(t *testing.T, value []byte) *mvccpb.KeyValue {
	t.Helper()
	kvs := x.rawKeys(t, func(kv *mvccpb.KeyValue) bool { return bytes.Equal(kv.Value, value) })
	if len(kvs) != 1 {
		t.Fatalf("%d keys hold %q, want 1", len(kvs), value)
	}
	return kvs[0]
}

// grantedTTL is the TTL an etcd lease was granted with.
func (x *fixture) grantedTTL(t *testing.T, id int64) time.Duration {
	t.Helper()
	resp, err := x.raw.TimeToLive(testCtx(t), clientv3.LeaseID(id))
	if err != nil {
		t.Fatal(err)
	}
	if resp.TTL <= 0 {
		t.Fatalf("etcd lease %x has expired", id)
	}
	return time.Duration(resp.GrantedTTL) * time.Second
}

// revoke ends an etcd lease now, as its TTL passing would.
func (x *fixture) revoke(t *testing.T, id int64) {
	t.Helper()
	if _, err := x.raw.Revoke(testCtx(t), clientv3.LeaseID(id)); err != nil {
		t.Fatal(err)
	}
}

// isDependency matches a *record.DependencyError on tool.
func isDependency(tool string, exclusive bool) func(error) bool {
	return func(err error) bool {
		var de *record.DependencyError
		return errors.As(err, &de) && de.Tool == tool && de.Exclusive == exclusive
	}
}

// check fails the test unless err is what want accepts (nil: no error).
func check(t *testing.T, what string, err error, want func(error) bool) {
	t.Helper()
	switch {
	case want == nil && err != nil:
		t.Fatalf("%s: unexpected error %v", what, err)
	case want != nil && !want(err):
		t.Fatalf("%s: error %v is not the expected one", what, err)
	}
}

// sameJSON reports whether a and b encode to the same JSON.
func sameJSON(t *testing.T, a, b any) bool {
	t.Helper()
	ja, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(ja, jb)
}

func ids(ls ...*record.Lease) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.ID
	}
	return out
}

// sameSet reports whether got and want hold the same ids, each once.
func sameSet(got, want []string) bool {
	if len(got) != len(want) {
		return false
	}
	seen := map[string]int{}
	for _, id := range want {
		seen[id]++
	}
	for _, id := range got {
		if seen[id]--; seen[id] < 0 {
			return false
		}
	}
	return true
}

// prefixIsolation: two stores on different prefixes of one etcd share
// nothing; a prefix without its trailing slash is the same prefix.
func prefixIsolation(t *testing.T, x *fixture) {
	ctx := testCtx(t)
	if err := x.s.Ping(ctx); err != nil {
		t.Fatalf("ping: %v", err)
	}
	sm := testManifest(t, "github", "v1.4.0", "private")
	ep := register(t, x.s, sm)
	other := x.open(t, x.prefix+"other/")
	if eps, err := other.ListEpochs(ctx, record.EpochFilter{}); err != nil || len(eps) != 0 {
		t.Fatalf("another prefix lists %d epochs (%v), want none", len(eps), err)
	}
	if _, err := other.GetEpoch(ctx, ep.ID); !errors.Is(err, record.ErrEpochNotFound) {
		t.Fatalf("another prefix gets the epoch: %v", err)
	}
	if _, created, err := other.RegisterEpoch(ctx, sm); err != nil || !created {
		t.Fatalf("the same manifest under another prefix: created %v, %v", created, err)
	}
	if _, err := other.Drain(ctx, ep.ID); err != nil {
		t.Fatal(err)
	}
	same := x.open(t, strings.TrimSuffix(x.prefix, "/"))
	got, err := same.GetEpoch(ctx, ep.ID)
	if err != nil || got.State != record.StateActive {
		t.Fatalf("the prefix without its slash reads %+v, %v; want the ACTIVE epoch", got, err)
	}
}
