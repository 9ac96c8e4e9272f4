// Command admission measures fcd's admission throughput side by side with
// the two designs docs/design.md ("What fast means here") compares it to, in one
// process against one embedded etcd member:
//
//	(a) floor:  a bare etcd transaction loop of the same shape as admission
//	            (three compares, four puts, a formation-sized value), raw
//	            clientv3;
//	(b) authzd: POST /v1/formations/{id}/admit over HTTP on loopback, through
//	            the full api.New handler (auth, policy digest check, two
//	            reads, the admission transaction, EdDSA token signing);
//	(c) shared: the design docs/design.md warns against, one per-epoch record
//	            updated by compare-and-swap per admission (get, modify,
//	            Txn If ModRevision == rev, retry on conflict).
//
// For each concurrency level it reports throughput, p50/p95/p99 latency,
// the etcd KV RPCs per operation (from etcd's own gRPC counters), the
// process CPU time per operation and the ratios b/a and b/c. The designs
// run interleaved per level, in rounds of alternating order (a b c, c b a,
// ...), after a warm-up of each, so that drift in the member (database
// growth, page cache) or in the machine's other load favours none of them.
// Two diagnostics, off by default (-designs abcde), split the gap between a
// and b: d is the floor preceded by the two linearizable reads admission
// makes first, e the same with serializable reads.
//
//	go run ./bench/admission [-n 2000] [-n1 N] [-c 1,16,64] [-dir DIR] [-designs abc] [-cpuprofile FILE]
//
// Every commit waits for the member to fsync its WAL (batched across
// concurrent requests), so at low concurrency writes are disk-bound; the
// header prints this disk's fsync time. -dir on a tmpfs (/dev/shm) takes
// the disk out of the measurement.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/authz"
	"github.com/fcd-authz/fcd/bench/internal/loadgen"
	"github.com/fcd-authz/fcd/client"
	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/manifest"
	"github.com/fcd-authz/fcd/record"
	"github.com/fcd-authz/fcd/server"
	"github.com/lestrrat-go/jwx/v2/jwa"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func main() {
	opts, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "admission:", err)
		os.Exit(2)
	}
	if err := run(context.Background(), opts, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "admission:", err)
		os.Exit(1)
	}
}

// options are the command-line settings: the plan (-c, -n, -n1, -warmup,
// -rounds; warm-up at least 100) and this program's own.
type options struct {
	loadgen.Plan
	// Dir is the parent of the temporary etcd data directory.
	Dir string
	// Designs selects which of a, b, c run (for profiling one alone).
	Designs string
	// CPUProfile, when set, receives a CPU profile of the timed phases.
	CPUProfile string
	// Manifest is the registered manifest; empty means the repository's
	// examples/github/manifest-v1.4.json.
	Manifest string
	// MaxInFlight and MaxBatch set the store's group commit (lease.Config);
	// zero means its defaults.
	MaxInFlight, MaxBatch int
}

func parseFlags(args []string) (options, error) {
	fs := flag.NewFlagSet("admission", flag.ContinueOnError)
	o := options{Plan: loadgen.Plan{MinWarmup: 100}}
	fs.IntVar(&o.N, "n", 2000, "timed operations per design at each concurrency level ≥ 2")
	fs.IntVar(&o.N1, "n1", 0, "timed operations per design at concurrency 1 (0: same as -n; lower it on a slow disk)")
	fs.StringVar(&o.Dir, "dir", "", "parent directory of the temporary etcd data directory (default: the system temp dir)")
	fs.StringVar(&o.Designs, "designs", "abc", "designs to run: a (floor), b (authzd over HTTP), c (shared record); diagnostics: d (a after admission's two linearizable reads), e (the same reads serializable)")
	fs.StringVar(&o.CPUProfile, "cpuprofile", "", "write a CPU profile of the timed phases to this file")
	fs.StringVar(&o.Manifest, "manifest", "", "manifest to register (default: examples/github/manifest-v1.4.json of this module)")
	fs.IntVar(&o.MaxInFlight, "max-in-flight", 0, "authzd's store: write transactions under way at once (0: lease.DefaultMaxInFlight)")
	fs.IntVar(&o.MaxBatch, "max-batch", 0, "authzd's store: writes group-committed in one transaction at most (0: lease.DefaultMaxBatch; 1: none)")
	if err := o.ParseFlags(fs, args, "1,16,64", "operations"); err != nil {
		return o, err
	}
	return o, o.check()
}

func (o *options) check() error {
	if o.N1 == 0 {
		o.N1 = o.N
	}
	if err := o.Plan.Check("-n, -n1"); err != nil {
		return err
	}
	switch {
	case o.Designs == "" || strings.Trim(o.Designs, "abcde") != "":
		return fmt.Errorf("-designs %q: letters among a, b, c, d, e", o.Designs)
	}
	return nil
}

// command is the exact command line that reproduces this run.
func (o *options) command() string {
	cmd := fmt.Sprintf("go run ./bench/admission -n %d -n1 %d %s", o.N, o.N1, o.Flags())
	if o.Dir != "" {
		cmd += " -dir " + o.Dir
	}
	if o.Designs != "abc" {
		cmd += " -designs " + o.Designs
	}
	if o.MaxInFlight != 0 {
		cmd += fmt.Sprintf(" -max-in-flight %d", o.MaxInFlight)
	}
	if o.MaxBatch != 0 {
		cmd += fmt.Sprintf(" -max-batch %d", o.MaxBatch)
	}
	return cmd
}

// Design names, in table order. d and e are diagnostics, not run by
// default: they tell how much of the gap between a and b the two reads
// before admission's transaction cost.
const (
	floor       = "a"
	authzd      = "b"
	shared      = "c"
	readsLin    = "d"
	readsSerial = "e"
)

var designTitle = map[string]string{
	floor:       "a floor: bare etcd txn",
	authzd:      "b authzd admit over HTTP",
	shared:      "c shared per-epoch record (CAS)",
	readsLin:    "d floor + 2 linearizable Gets first",
	readsSerial: "e floor + 2 serializable Gets first",
}

// bench is one run: the etcd member, the authzd stack and the raw client.
type bench struct {
	opts options
	out  io.Writer

	cli   *clientv3.Client // raw client of designs a and c
	forms *authz.UseCases
	reg   *authz.Registry
	url   string
	http  *http.Client
	gate  api.Secret
	// gateAPI calls the server as the gateway (design b).
	gateAPI *client.ClientWithResponses
	// registrar signs a manifest with the trusted registrar key.
	registrar func(payload []byte) ([]byte, error)

	snapshot string
	epoch    *record.Epoch
	// formationVal and markerVal have the sizes of what one admission
	// writes, taken from a real formation; designs a and c write them.
	formationVal, markerVal []byte
}

func run(ctx context.Context, opts options, out io.Writer) error {
	if err := opts.check(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	b := &bench{opts: opts, out: out}
	quiet := slog.New(slog.DiscardHandler)

	parent := opts.Dir
	if parent == "" {
		parent = os.TempDir()
	}
	dir, err := os.MkdirTemp(parent, "fcd-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	fsync, err := fsyncProbe(dir)
	if err != nil {
		return err
	}
	b.header(dir, fsync)

	clientAddr, err := loadgen.FreeAddr()
	if err != nil {
		return err
	}
	peerAddr, err := loadgen.FreeAddr()
	if err != nil {
		return err
	}
	member, err := lease.StartEmbedded(ctx, lease.EmbedConfig{
		Dir: filepath.Join(dir, "etcd"), LogFile: filepath.Join(dir, "etcd.log"),
		ClientURL: "http://" + clientAddr, PeerURL: "http://" + peerAddr,
		// The run must not compact under itself.
		CompactionRetention: "24h",
	})
	if err != nil {
		return err
	}
	defer member.Close()
	store, err := lease.Open(ctx, lease.Config{Endpoints: member.Endpoints(), TLS: member.Access().TLS, Logger: quiet,
		MaxInFlight: opts.MaxInFlight, MaxBatch: opts.MaxBatch})
	if err != nil {
		return err
	}
	defer store.Close()
	// Designs a and c get their own connection, as the store has its own.
	b.cli, err = clientv3.New(clientv3.Config{Endpoints: member.Endpoints(), TLS: member.Access().TLS, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer b.cli.Close()

	stop, err := b.startServer(ctx, store, dir)
	if err != nil {
		return err
	}
	defer stop()
	if err := b.registerAndSnapshot(ctx); err != nil {
		return err
	}
	if err := b.waitForSigning(ctx); err != nil {
		return err
	}

	// Every formation is formed before any admission: forming reads the
	// epoch with all its lease markers (GetEpoch), so forming after
	// thousands of open leases gets slower and slower.
	formed := map[int][]string{}
	if strings.Contains(opts.Designs, authzd) {
		t0, count := time.Now(), 0
		for _, c := range opts.Levels {
			ids, err := b.formMany(ctx, c, opts.WarmupOps(c)+opts.Ops(c))
			if err != nil {
				return fmt.Errorf("forming: %w", err)
			}
			formed[c], count = ids, count+len(ids)
		}
		fmt.Fprintf(b.out, "# formed %d ready formations (%s, one session each) in %.1fs, before timing\n",
			count, benchTool, time.Since(t0).Seconds())
	}
	if opts.CPUProfile != "" {
		f, err := os.Create(opts.CPUProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	var results []*levelResult
	for _, c := range opts.Levels {
		r, err := b.level(ctx, c, formed[c])
		if err != nil {
			return fmt.Errorf("concurrency %d: %w", c, err)
		}
		results = append(results, r)
	}
	b.report(results)

	var failed []string
	for _, r := range results {
		for _, d := range b.designs() {
			if p := r.phases[d]; p.failures > 0 {
				failed = append(failed, fmt.Sprintf("c=%d design %s: %d of %d operations failed: %s",
					r.c, d, p.failures, p.failures+len(p.lat), strings.Join(p.samples(), "; ")))
			}
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("FAILED OPERATIONS, the figures above are not valid:\n  %s", strings.Join(failed, "\n  "))
	}
	return nil
}

func (b *bench) designs() []string {
	var ds []string
	for _, d := range []string{floor, authzd, shared, readsLin, readsSerial} {
		if strings.Contains(b.opts.Designs, d) {
			ds = append(ds, d)
		}
	}
	return ds
}

func (b *bench) header(dir string, fsync time.Duration) {
	fmt.Fprintf(b.out, "# reproduce: %s\n", b.opts.command())
	fmt.Fprintf(b.out, "# machine: %s/%s, %s, NumCPU=%d, GOMAXPROCS=%d, %s\n",
		runtime.GOOS, runtime.GOARCH, loadgen.CPUModel(), runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version())
	fmt.Fprintf(b.out, "# etcd: one embedded member in this process, data in %s\n", dir)
	fmt.Fprintf(b.out, "# disk: every etcd commit waits for a WAL fsync (batched across concurrent requests), so at low\n")
	fmt.Fprintf(b.out, "#       concurrency writes are disk-bound; here a 4 KiB write+fsync takes %.2f ms (mean of 100)\n", loadgen.MS(fsync))
	fmt.Fprintf(b.out, "# the load generator, the HTTP server, authzd and etcd share this process and its CPUs\n")
}

// startServer builds authzd as it ships (server.New) on the bench's store,
// listening on a loopback port, and runs it until stop. It turns off, and
// says why:
//   - the formation rate limit: one host credential forms every call of
//     the run ahead of timing, standing for many hosts (the limit is per
//     credential, docs/capacity.md);
//   - the 15-minute formation TTL, for an hour: a long run forms its calls
//     before it admits them;
//   - the audit trail: it follows the store in the background and writes
//     its cursor every 100ms, etcd RPCs the per-operation counts of this
//     bench would charge to whichever design runs at the time (the floor
//     included); the trail's cost is bench/gateway's design AT against A.
//
// The store is the bench's own (its member does not compact under the run,
// and -max-in-flight and -max-batch tune it; zero is what ships). The logs
// are formatted at the default level, then dropped.
func (b *bench) startServer(ctx context.Context, store *lease.Store, dir string) (func(), error) {
	var stored []api.Credential
	for _, role := range []api.Role{api.RoleGateway, api.RoleHost} {
		secret, cred, err := api.NewCredential("bench-"+string(role), role)
		if err != nil {
			return nil, err
		}
		if role == api.RoleGateway {
			b.gate = secret
		}
		stored = append(stored, cred)
	}
	auth, err := api.NewAuthenticator(stored)
	if err != nil {
		return nil, err
	}
	registrar, err := manifest.GenerateKey(jwa.EdDSA)
	if err != nil {
		return nil, err
	}
	set, err := manifest.PublicSet(registrar)
	if err != nil {
		return nil, err
	}
	verifier, err := manifest.NewVerifier(set)
	if err != nil {
		return nil, err
	}
	b.registrar = func(payload []byte) ([]byte, error) { return manifest.Sign(payload, registrar, manifest.TypManifest) }
	dispatch, err := manifest.GenerateKey(jwa.EdDSA)
	if err != nil {
		return nil, err
	}
	srv, err := server.New(ctx, server.Config{
		Listen: "127.0.0.1:0", DataDir: dir, Store: store, AuditDir: server.AuditOff,
		Registrars: verifier, Auth: auth, Signer: dispatch, Issuer: "fcd-bench",
		FormationRate: server.NoFormationLimit, FormationTTL: time.Hour,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ran := make(chan error, 1)
	go func() { ran <- srv.Run(rctx) }()
	b.reg, b.forms = srv.UseCases().Registry, srv.UseCases()
	b.url = srv.URL()
	b.http = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024, IdleConnTimeout: time.Minute, DisableCompression: true,
	}}
	stop := func() {
		cancel()
		<-ran
		_ = srv.Close()
		b.http.CloseIdleConnections()
	}
	if b.gateAPI, err = client.New(b.url, string(b.gate), client.WithHTTPClient(b.http)); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

// registerAndSnapshot registers the example manifest as an ACTIVE epoch,
// freezes a snapshot, and measures what one admission writes.
func (b *bench) registerAndSnapshot(ctx context.Context) error {
	path := b.opts.Manifest
	if path == "" {
		root, err := moduleRoot()
		if err != nil {
			return err
		}
		path = filepath.Join(root, "examples", "github", "manifest-v1.4.json")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	jws, err := b.registrar(data)
	if err != nil {
		return err
	}
	reg, err := b.reg.Register(ctx, jws)
	if err != nil {
		return err
	}
	b.epoch = reg.Epoch
	snap, err := b.reg.CreateSnapshot(ctx, []string{reg.Epoch.Server})
	if err != nil {
		return err
	}
	b.snapshot = snap.ID

	f, err := b.form(ctx, "size-probe", 0)
	if err != nil {
		return err
	}
	lid, err := lease.NewLeaseID()
	if err != nil {
		return err
	}
	l := &record.Lease{ID: lid, State: record.LeaseAdmitted, Formation: f.ID, Session: f.Session, Tool: f.Tool,
		ArgumentDigest: f.ArgumentDigest, Target: f.Source, AdmittedAt: time.Now().UTC()}
	f.Status, f.Lease, f.UpdatedAt = record.StatusAdmitted, lid, l.AdmittedAt
	if b.formationVal, err = json.Marshal(f); err != nil {
		return err
	}
	if b.markerVal, err = json.Marshal(l); err != nil {
		return err
	}
	fmt.Fprintf(b.out, "# one admission writes a %d-byte formation and a %d-byte lease marker; designs a and c write the same sizes\n",
		len(b.formationVal), len(b.markerVal))
	return nil
}

// benchTool is the call every formation makes: a read, so it is ready at
// once under the default policies (no approval).
const benchTool = "github/get_repository"

// form records one ready formation in its own session.
func (b *bench) form(ctx context.Context, session string, i int) (*record.Formation, error) {
	f, err := b.forms.Formations.Form(ctx, authz.FormRequest{
		Snapshot: b.snapshot, Session: session, Tool: benchTool,
		Arguments: json.RawMessage(fmt.Sprintf(`{"owner":"bench","repo":"r%d"}`, i)), Host: "bench-host",
	})
	if err != nil {
		return nil, err
	}
	if f.Status != record.StatusReady {
		return nil, fmt.Errorf("formation %s is %s, want ready (decision %+v)", f.ID, f.Status, f.Decision)
	}
	return f, nil
}

// formMany forms n ready formations, in parallel, before any timing.
func (b *bench) formMany(ctx context.Context, c, n int) ([]string, error) {
	ids := make([]string, n)
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				f, err := b.form(ctx, fmt.Sprintf("bench-c%d-%d", c, i), i)
				if err != nil {
					once.Do(func() { first = err })
					return
				}
				ids[i] = f.ID
			}
		})
	}
	wg.Wait()
	return ids, first
}

// waitForSigning waits until the dispatch key is published, so admission
// may sign: until then admission answers 503 signing-key-unpublished.
func (b *bench) waitForSigning(ctx context.Context) error {
	f, err := b.form(ctx, "signing-probe", 0)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := b.admit(ctx, f.ID)
		if err == nil {
			return nil
		}
		if !strings.Contains(err.Error(), "signing-key-unpublished") || time.Now().After(deadline) {
			return fmt.Errorf("admission never became ready: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// admit is one operation of design b: the gateway's admission request,
// through the typed client.
func (b *bench) admit(ctx context.Context, id string) error {
	resp, err := b.gateAPI.AdmitFormationWithResponse(ctx, id)
	if err != nil {
		return err
	}
	if resp.JSON200 == nil || !strings.HasPrefix(resp.JSON200.Token, "ey") {
		return fmt.Errorf("HTTP %d without a token: %.300s", resp.StatusCode(), resp.Body)
	}
	return nil
}

// etcdFixture holds the pre-created formation keys of design a or c.
type etcdFixture struct {
	prefix      string
	formations  []string // keys
	formationID []string
	revs        []int64
	state, gen  string
	record      string // design c: the shared per-epoch record
	open        int    // design c: open leases the record holds
}

// precreate writes n formation-sized values under prefix, in batches, and
// the epoch's ACTIVE state, so that every operation's compares succeed.
func (b *bench) precreate(ctx context.Context, prefix string, n int) (*etcdFixture, error) {
	fx := &etcdFixture{
		prefix: prefix, formations: make([]string, n), formationID: make([]string, n), revs: make([]int64, n),
		state: prefix + "states/" + b.epoch.ID, gen: prefix + "pools/" + b.epoch.Pool + "/generation",
		record: prefix + "epoch-records/" + b.epoch.ID,
	}
	if _, err := b.cli.Put(ctx, fx.state, string(record.StateActive)); err != nil {
		return nil, err
	}
	const batch = 64
	for lo := 0; lo < n; lo += batch {
		var ops []clientv3.Op
		for i := lo; i < min(n, lo+batch); i++ {
			id, err := lease.NewFormationID()
			if err != nil {
				return nil, err
			}
			fx.formationID[i], fx.formations[i] = id, prefix+"formations/"+id
			ops = append(ops, clientv3.OpPut(fx.formations[i], string(b.formationVal)))
		}
		resp, err := b.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, err
		}
		for i := lo; i < min(n, lo+batch); i++ {
			fx.revs[i] = resp.Header.Revision
		}
	}
	return fx, nil
}

func (b *bench) etcdCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	// As the store does: require a leader, bound the operation.
	return context.WithTimeout(clientv3.WithRequireLeader(ctx), 5*time.Second)
}

// floorOp is one operation of design a: the admission transaction alone,
// with the same compares and the same puts, on its own formation key.
func (b *bench) floorOp(ctx context.Context, fx *etcdFixture, i int, rev int64) error {
	lid, err := lease.NewLeaseID()
	if err != nil {
		return err
	}
	session := "s" + strconv.Itoa(i)
	octx, cancel := b.etcdCtx(ctx)
	defer cancel()
	resp, err := b.cli.Txn(octx).If(
		clientv3.Compare(clientv3.ModRevision(fx.formations[i]), "=", rev),
		clientv3.Compare(clientv3.Value(fx.state), "=", string(record.StateActive)),
		clientv3.Compare(clientv3.CreateRevision(fx.gen), "=", 0),
	).Then(
		clientv3.OpPut(fx.prefix+"markers/"+b.epoch.ID+"/"+lid, string(b.markerVal)),
		clientv3.OpPut(fx.prefix+"leases/"+lid, b.epoch.ID),
		clientv3.OpPut(fx.prefix+"sessions/"+session+"/admitted/"+benchTool+"/"+lid, benchTool),
		clientv3.OpPut(fx.formations[i], string(b.formationVal)),
	).Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return errors.New("floor transaction: a compare failed")
	}
	return nil
}

// readThenFloorOp is a diagnostic: the reads admission makes before its
// transaction (the formation for its revision, the pool generation), one
// etcd request each as Store.GetFormationRevision and Store.PoolGeneration
// do, then the floor's transaction on the revision read.
func (b *bench) readThenFloorOp(ctx context.Context, fx *etcdFixture, i int, opts ...clientv3.OpOption) error {
	octx, cancel := b.etcdCtx(ctx)
	f, err := b.cli.Get(octx, fx.formations[i], opts...)
	cancel()
	if err != nil {
		return err
	}
	if len(f.Kvs) == 0 {
		return errors.New("formation missing")
	}
	var probe struct{ Status string }
	if err := json.Unmarshal(f.Kvs[0].Value, &probe); err != nil {
		return err
	}
	octx, cancel = b.etcdCtx(ctx)
	_, err = b.cli.Get(octx, fx.gen, opts...)
	cancel()
	if err != nil {
		return err
	}
	return b.floorOp(ctx, fx, i, f.Kvs[0].ModRevision)
}

// sharedRecord is design c's per-epoch record: every admission to the
// epoch rewrites it.
type sharedRecord struct {
	Epoch    string        `json:"epoch"`
	State    string        `json:"state"`
	Admitted int64         `json:"admitted"`
	Open     []sharedLease `json:"open"`
}

type sharedLease struct {
	ID        string `json:"id"`
	Formation string `json:"formation"`
	Session   string `json:"session"`
}

// resetRecord writes design c's record afresh.
func (b *bench) resetRecord(ctx context.Context, fx *etcdFixture, open int) error {
	fx.open = open
	val, err := json.Marshal(sharedRecord{Epoch: b.epoch.ID, State: string(record.StateActive), Open: []sharedLease{}})
	if err != nil {
		return err
	}
	_, err = b.cli.Put(ctx, fx.record, string(val))
	return err
}

// maxCASAttempts bounds design c's retries of one admission.
const maxCASAttempts = 100000

// sharedOp is one operation of design c: the same transaction as the
// floor, with the per-admission marker replaced by a compare-and-swap of
// the epoch's one record (read, add the lease, write if unchanged; retry
// from the read on conflict). It returns the number of retries.
func (b *bench) sharedOp(ctx context.Context, fx *etcdFixture, i int) (int, error) {
	lid, err := lease.NewLeaseID()
	if err != nil {
		return 0, err
	}
	session := "s" + strconv.Itoa(i)
	for attempt := range maxCASAttempts {
		octx, cancel := b.etcdCtx(ctx)
		got, err := b.cli.Get(octx, fx.record)
		cancel()
		if err != nil {
			return attempt, err
		}
		if len(got.Kvs) == 0 {
			return attempt, errors.New("shared record missing")
		}
		var rec sharedRecord
		if err := json.Unmarshal(got.Kvs[0].Value, &rec); err != nil {
			return attempt, err
		}
		rec.Admitted++
		rec.Open = append(rec.Open, sharedLease{ID: lid, Formation: fx.formationID[i], Session: session})
		if len(rec.Open) > fx.open {
			rec.Open = rec.Open[len(rec.Open)-fx.open:]
		}
		val, err := json.Marshal(rec)
		if err != nil {
			return attempt, err
		}
		octx, cancel = b.etcdCtx(ctx)
		resp, err := b.cli.Txn(octx).If(
			clientv3.Compare(clientv3.ModRevision(fx.record), "=", got.Kvs[0].ModRevision),
			clientv3.Compare(clientv3.ModRevision(fx.formations[i]), "=", fx.revs[i]),
			clientv3.Compare(clientv3.Value(fx.state), "=", string(record.StateActive)),
			clientv3.Compare(clientv3.CreateRevision(fx.gen), "=", 0),
		).Then(
			clientv3.OpPut(fx.record, string(val)),
			clientv3.OpPut(fx.prefix+"leases/"+lid, b.epoch.ID),
			clientv3.OpPut(fx.prefix+"sessions/"+session+"/admitted/"+benchTool+"/"+lid, benchTool),
			clientv3.OpPut(fx.formations[i], string(b.formationVal)),
		).Commit()
		cancel()
		if err != nil {
			return attempt, err
		}
		if resp.Succeeded {
			return attempt, nil
		}
	}
	return maxCASAttempts, fmt.Errorf("shared record: no success in %d attempts", maxCASAttempts)
}

// phase is the outcome of one design's operations at one level.
type phase struct {
	lat      []time.Duration
	wall     time.Duration
	failures int
	errs     map[string]int
	retries  int64
	rpc      map[string]float64 // etcd KV RPCs by method
	cpu      time.Duration      // CPU time of the whole process
}

func (p *phase) add(q *phase) {
	p.lat = append(p.lat, q.lat...)
	p.wall += q.wall
	p.failures += q.failures
	p.retries += q.retries
	p.cpu += q.cpu
	for k, v := range q.errs {
		p.errs[k] += v
	}
	for k, v := range q.rpc {
		p.rpc[k] += v
	}
}

func (p *phase) samples() []string {
	var out []string
	for k, v := range p.errs {
		out = append(out, fmt.Sprintf("%dx %s", v, k))
	}
	slices.Sort(out)
	return out[:min(len(out), 5)]
}

type opFunc func(ctx context.Context, i int) (retries int, err error)

// runPhase runs operations from..to-1 with c workers and times each.
func runPhase(ctx context.Context, c, from, to int, op opFunc) *phase {
	p := &phase{errs: map[string]int{}, rpc: map[string]float64{}}
	var next atomic.Int64
	next.Store(int64(from))
	var mu sync.Mutex
	var wg sync.WaitGroup
	before := loadgen.KVRPCs()
	cpu0 := loadgen.ProcessCPU()
	start := time.Now()
	for range c {
		wg.Go(func() {
			lat := make([]time.Duration, 0, (to-from)/c+1)
			errs := map[string]int{}
			var retries int64
			for {
				i := int(next.Add(1) - 1)
				if i >= to {
					break
				}
				t0 := time.Now()
				r, err := op(ctx, i)
				d := time.Since(t0)
				retries += int64(r)
				if err != nil {
					errs[err.Error()]++
					continue
				}
				lat = append(lat, d)
			}
			mu.Lock()
			defer mu.Unlock()
			p.lat = append(p.lat, lat...)
			p.retries += retries
			for k, v := range errs {
				p.errs[k] += v
				p.failures += v
			}
		})
	}
	wg.Wait()
	p.wall = time.Since(start)
	p.cpu = loadgen.ProcessCPU() - cpu0
	for k, v := range loadgen.KVRPCs() {
		p.rpc[k] = v - before[k]
	}
	return p
}

// levelResult is one concurrency level: every design's phases merged
// over the rounds.
type levelResult struct {
	c, n   int
	phases map[string]*phase
}

// level prepares, warms up and measures every design at concurrency c.
func (b *bench) level(ctx context.Context, c int, formed []string) (*levelResult, error) {
	n, w := b.opts.Ops(c), b.opts.WarmupOps(c)
	total := w + n
	res := &levelResult{c: c, n: n, phases: map[string]*phase{}}
	ops := map[string]opFunc{}
	t0 := time.Now()
	for _, d := range b.designs() {
		switch d {
		case floor, readsLin, readsSerial:
			fx, err := b.precreate(ctx, fmt.Sprintf("/bench/%s/c%d/", d, c), total)
			if err != nil {
				return nil, err
			}
			switch d {
			case floor:
				ops[d] = func(ctx context.Context, i int) (int, error) { return 0, b.floorOp(ctx, fx, i, fx.revs[i]) }
			case readsLin:
				ops[d] = func(ctx context.Context, i int) (int, error) { return 0, b.readThenFloorOp(ctx, fx, i) }
			default:
				ops[d] = func(ctx context.Context, i int) (int, error) {
					return 0, b.readThenFloorOp(ctx, fx, i, clientv3.WithSerializable())
				}
			}
		case shared:
			fx, err := b.precreate(ctx, fmt.Sprintf("/bench/shared/c%d/", c), total)
			if err != nil {
				return nil, err
			}
			if err := b.resetRecord(ctx, fx, c); err != nil {
				return nil, err
			}
			ops[d] = func(ctx context.Context, i int) (int, error) { return b.sharedOp(ctx, fx, i) }
		case authzd:
			ops[d] = func(ctx context.Context, i int) (int, error) { return 0, b.admit(ctx, formed[i]) }
		}
		res.phases[d] = &phase{errs: map[string]int{}, rpc: map[string]float64{}}
	}
	fmt.Fprintf(b.out, "# c=%d: %d warm-up + %d timed operations per design; keys of a and c pre-created in %.1fs\n",
		c, w, n, time.Since(t0).Seconds())

	for _, d := range b.designs() {
		if p := runPhase(ctx, c, 0, w, ops[d]); p.failures > 0 {
			return nil, fmt.Errorf("warm-up of design %s: %d failures: %s", d, p.failures, strings.Join(p.samples(), "; "))
		}
	}
	order := b.designs()
	for r := range b.opts.Rounds {
		lo, hi := w+n*r/b.opts.Rounds, w+n*(r+1)/b.opts.Rounds
		for _, d := range order {
			res.phases[d].add(runPhase(ctx, c, lo, hi, ops[d]))
		}
		slices.Reverse(order)
	}
	return res, nil
}

func (p *phase) throughput() float64 { return loadgen.Rate(len(p.lat), p.wall) }

func (b *bench) report(results []*levelResult) {
	w := b.out
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| c | design | ops | ops/s | p50 ms | p95 ms | p99 ms | etcd KV RPCs/op | CAS retries/op | CPU ms/op |")
	fmt.Fprintln(w, "|---:|---|---:|---:|---:|---:|---:|---|---:|---:|")
	for _, r := range results {
		for _, d := range b.designs() {
			p := r.phases[d]
			slices.Sort(p.lat)
			n := float64(len(p.lat) + p.failures)
			rpc := fmt.Sprintf("%.2f Range + %.2f Txn", p.rpc["Range"]/n, p.rpc["Txn"]/n)
			if p.rpc["Put"] > 0 {
				rpc += fmt.Sprintf(" + %.2f Put", p.rpc["Put"]/n)
			}
			retries := "–"
			if d == shared {
				retries = fmt.Sprintf("%.1f", float64(p.retries)/n)
			}
			fmt.Fprintf(w, "| %d | %s | %d | %.0f | %.2f | %.2f | %.2f | %s | %s | %.2f |\n", r.c, designTitle[d], len(p.lat),
				p.throughput(), loadgen.MS(loadgen.Percentile(p.lat, .50)), loadgen.MS(loadgen.Percentile(p.lat, .95)), loadgen.MS(loadgen.Percentile(p.lat, .99)), rpc, retries,
				loadgen.MS(p.cpu)/n)
		}
	}
	ds := b.opts.Designs
	if !strings.Contains(ds, authzd) || (!strings.Contains(ds, floor) && !strings.Contains(ds, shared)) {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| c | b/a throughput | b/c throughput | b/a p50 latency (a p50 / b p50) |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|")
	ratio := func(x, y float64) string {
		if y == 0 {
			return "–"
		}
		return fmt.Sprintf("%.2f", x/y)
	}
	tp := func(r *levelResult, d string) float64 {
		if p, ok := r.phases[d]; ok {
			return p.throughput()
		}
		return 0
	}
	p50 := func(r *levelResult, d string) float64 {
		if p, ok := r.phases[d]; ok {
			return loadgen.MS(loadgen.Percentile(p.lat, .50))
		}
		return 0
	}
	for _, r := range results {
		fmt.Fprintf(w, "| %d | %s | %s | %s |\n", r.c, ratio(tp(r, authzd), tp(r, floor)), ratio(tp(r, authzd), tp(r, shared)),
			ratio(p50(r, floor), p50(r, authzd)))
	}
	for _, r := range results {
		if r.c != 64 || !strings.Contains(ds, floor) || !strings.Contains(ds, shared) {
			continue
		}
		ba, bc := tp(r, authzd)/tp(r, floor), tp(r, authzd)/tp(r, shared)
		fmt.Fprintf(w, "\ntarget at c=64 (issue 4): b/a ≥ 0.6: %.2f, %s; b/c ≥ 10: %.1f, %s\n",
			ba, verdict(ba >= 0.6), bc, verdict(bc >= 10))
	}
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// fsyncProbe returns the mean time of a 4 KiB append followed by fsync in
// dir: what every etcd commit pays at least once.
func fsyncProbe(dir string) (time.Duration, error) {
	f, err := os.CreateTemp(dir, "fsync-probe-")
	if err != nil {
		return 0, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := bytes.Repeat([]byte{'x'}, 4096)
	const n = 100
	start := time.Now()
	for range n {
		if _, err := f.Write(buf); err != nil {
			return 0, err
		}
		if err := f.Sync(); err != nil {
			return 0, err
		}
	}
	return time.Since(start) / n, nil
}

// moduleRoot finds this module's root from the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(data, []byte("module github.com/fcd-authz/fcd\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the fcd module: run from the repository or pass -manifest")
		}
		dir = parent
	}
}
