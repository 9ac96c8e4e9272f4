// Command gateway measures what fcd adds to an MCP tools/call through real
// nginx (issue 5, "Benchmark"), and what the fence's lease claim adds to
// that (issue 10), in one run, side by side:
//
//	(A)  fcd:  nginx running examples/gateways/nginx.conf (auth_basic of
//	           the client, auth_request forward-auth to authzd, which checks
//	           the caller and admits the call: an etcd transaction and an
//	           EdDSA dispatch token) → the real fencecheck middleware in
//	           online mode (token verified against authzd's JWKS, the lease
//	           claimed in authzd — a round trip and an etcd transaction —
//	           before the effect, outcome reported under the claim
//	           asynchronously) → the github v1.4 MCP fixture (official MCP
//	           Go SDK);
//	(A0) fcd, fence offline: the same, but the fence neither claims nor
//	           reports (fencecheck's offline mode): A/A0 is the claim's cost;
//	(B)  plain: nginx with the same configuration minus fcd (auth_basic
//	           kept, no auth_request; see plainNginx for exactly what
//	           differs) → the same fixture instance, without fencecheck:
//	           A/B is what fcd adds to a gateway that authenticates its
//	           clients;
//	(B0) bare: B without auth_basic, the unprotected path earlier runs
//	           and the performance budget compare against: A/B0 is what fcd
//	           and the client authentication of the examples add.
//
//	(AF) fcd, formed in the call: A, but each call is first formed over
//	           authzd's REST API (POST /v1/formations: policy decision and
//	           the formation's etcd write) by the same worker, inside the
//	           timed operation — the host's whole cost of one protected
//	           call, where A charges only the gateway's and the fence's.
//
// The timed operation is one MCP tools/call of github/get_repository by an
// official MCP Go SDK client, one client session per worker. For A each
// call (and each A0 call) carries a fresh formation id (params._meta["dev.fcd/formation"] and,
// through gatewaytest.FormationTransport, the Fcd-Formation header), formed
// ready over authzd's REST API before any timing, one formation per call.
// B sends the same call without a formation. Any error, refusal or tool
// error fails the run.
//
//	go run ./bench/gateway [-n1 300] [-n32 2000] [-c 1,32] [-rounds 4] [-warmup N] [-dir DIR] [-cpuprofile FILE]
//
// Per concurrency level, after a warm-up of every design, the timed calls
// run in rounds of rotating order (A AF A0 B B0, AF A0 B B0 A, ...), so
// drift favours none. The wall time of A and AF for a round ends when its
// last call has returned and fencecheck has reported every outcome to
// authzd, so the background reporting is charged to them and never runs
// during another design's rounds.
// The summary also gives each ratio with that drain excluded (calls only).
//
// Everything but nginx (etcd, authzd, the fixture, fencecheck and the load
// generator) shares this process and the machine's CPUs with the two nginx
// processes (2 workers each).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fcd-authz/fcd/api"
	"github.com/fcd-authz/fcd/bench/internal/loadgen"
	"github.com/fcd-authz/fcd/internal/fixtures"
	"github.com/fcd-authz/fcd/internal/gatewayconf"
	"github.com/fcd-authz/fcd/internal/gatewaytest"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/crypto/bcrypt"
)

func main() {
	opts, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(2)
	}
	if err := run(context.Background(), opts, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "gateway: FAILED:", err)
		os.Exit(1)
	}
}

// options are the command-line settings: the plan (-c, -n1, -n32,
// -warmup, -rounds; warm-up at least 50) and this program's own.
type options struct {
	loadgen.Plan
	// Dir is the parent of the temporary directory (etcd data, nginx
	// prefixes); empty means the system's.
	Dir string
	// ReportWorkers is fencecheck's outcome-reporter concurrency; zero
	// means its default.
	ReportWorkers int
	// CPUProfile, when set, receives a CPU profile of this process (etcd,
	// authzd, fencecheck, the fixture, the load) over the timed levels.
	CPUProfile string
}

func parseFlags(args []string) (options, error) {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	o := options{Plan: loadgen.Plan{MinWarmup: 50}}
	fs.IntVar(&o.N1, "n1", 300, "timed calls per design at concurrency 1")
	fs.IntVar(&o.N, "n32", 2000, "timed calls per design at every other concurrency level")
	fs.StringVar(&o.Dir, "dir", "", "parent of the temporary directory for etcd's data and nginx (default: the system's)")
	fs.IntVar(&o.ReportWorkers, "report-workers", 0, "fencecheck outcome-reporter workers (0: fencecheck's default)")
	fs.StringVar(&o.CPUProfile, "cpuprofile", "", "write a CPU profile of this process over the timed levels to this file")
	if err := o.ParseFlags(fs, args, "1,32", "calls"); err != nil {
		return o, err
	}
	return o, o.Check("-n1, -n32")
}

// command is the command line that reproduces this run.
func (o *options) command() string {
	cmd := fmt.Sprintf("go run ./bench/gateway -n1 %d -n32 %d %s", o.N1, o.N, o.Flags())
	if o.Dir != "" {
		cmd += " -dir " + o.Dir
	}
	if o.ReportWorkers > 0 {
		cmd += fmt.Sprintf(" -report-workers %d", o.ReportWorkers)
	}
	if o.CPUProfile != "" {
		cmd += " -cpuprofile " + o.CPUProfile
	}
	return cmd
}

// The designs, in the order of the first round.
const (
	designA  = "A"
	designAT = "AT"
	designAF = "AF"
	designA0 = "A0"
	designB  = "B"
	designB0 = "B0"
)

var designs = []string{designA, designAT, designAF, designA0, designB, designB0}

var designTitle = map[string]string{
	designA:  "A nginx + fcd (forward-auth admission + fencecheck claiming the lease)",
	designAT: "AT A, authzd keeping the audit trail",
	designAF: "AF A, each call formed over REST inside the timed call",
	designA0: "A0 nginx + fcd, fence offline (no claim, no report)",
	designB:  "B nginx, no fcd (auth_basic kept)",
	designB0: "B0 nginx, no fcd, no client authentication",
}

// formed says whether design d's calls carry a formation formed before
// timing; formsInline, whether the timed call forms its own.
func formed(d string) bool      { return d == designA || d == designAT || d == designA0 }
func formsInline(d string) bool { return d == designAF }

// reports says whether design d's fence claims and reports every call.
func reports(d string) bool { return d == designA || d == designAT || d == designAF }

// gatewayOf is the nginx design d's calls go through: AF's are A's.
func gatewayOf(d string) string {
	if d == designAF {
		return designA
	}
	return d
}

// comparisons are the ratios the summary gives.
var comparisons = []struct{ a, other, says string }{
	{designA, designB, "A/B: what fcd adds to a gateway that authenticates its clients"},
	{designA, designB0, "A/B0: what fcd and the examples' client authentication add"},
	{designA, designA0, "A/A0: the lease claim's cost (claim round trip + etcd txn, and the outcome report)"},
	{designAT, designA, "AT/A: the audit trail's cost (admission, claim and outcome recorded)"},
	{designAF, designB, "AF/B: fcd with the host's formation, against the same gateway without fcd"},
	{designAF, designA, "AF/A: the formation's cost (policy decision + etcd write) on top of A"},
}

// userName and userPassword are the client every nginx authenticates
// (auth_basic, bcrypt at gatewaytest's cost) and authzd's formations name
// as principal: the gateway's Fcd-Caller.
const (
	userName     = "alice"
	userPassword = "alice-bench-password"
)

type bench struct {
	opts   options
	out    io.Writer
	s      *stack
	gw     map[string]*nginx
	client *http.Transport
	// aCalls counts A's and AF's calls that reached fencecheck and
	// succeeded: each has one outcome report.
	aCalls atomic.Uint64
	// inline numbers the sessions of AF's formations.
	inline atomic.Uint64
}

// phase is the outcome of some calls of one design.
type phase struct {
	lat     []time.Duration
	elapsed time.Duration
	drain   time.Duration // A: waiting for outcome reports after the last call
	fails   []string
	// cpu is the CPU time of this process (load generator, authzd, etcd,
	// fencecheck, the fixture) and of the design's nginx during the
	// phase; rpc counts etcd's KV calls by method.
	cpu time.Duration
	rpc map[string]float64
}

func run(ctx context.Context, opts options, out io.Writer) error {
	if err := opts.Check("-n1, -n32"); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dir, err := os.MkdirTemp(opts.Dir, "fcd-bench-gateway-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	fmt.Fprintf(out, "# reproduce: %s\n", opts.command())
	fmt.Fprintf(out, "# machine: %s/%s, %s, NumCPU=%d, GOMAXPROCS=%d, %s, kernel %s, %s (%d workers per nginx)\n",
		runtime.GOOS, runtime.GOARCH, loadgen.CPUModel(), runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(),
		kernel(), nginxVersion(), nginxWorkers)
	fmt.Fprintf(out, "# timed op: MCP tools/call github/%s %s through nginx, official MCP Go SDK client, one session per worker\n", benchTool, benchArgs)
	fmt.Fprintf(out, "# A: examples/gateways/nginx.conf (auth_basic) → authzd /v1/forward_auth (caller check, admission, etcd txn, token) → fencecheck online (claim: authzd round trip + etcd txn; outcome report) → fixture; one fresh ready formation per call\n")
	fmt.Fprintf(out, "# AT: A through a second authzd keeping the audit trail, on the same etcd member under a prefix of its own (formation, admission, claim and outcome: four events a call)\n")
	fmt.Fprintf(out, "# AF: A, and the worker forms each call (POST /v1/formations, ready) inside the timed call: the host's whole cost\n")
	fmt.Fprintf(out, "# A0: the same, fencecheck offline (no claim, no outcome report) → the same fixture; A/A0 is the claim's cost\n")
	fmt.Fprintf(out, "# B: the same nginx.conf without auth_request (auth_basic kept; plainNginx in bench/gateway/nginx.go) → the same fixture without fencecheck\n")
	fmt.Fprintf(out, "# one process holds etcd (data in %s), authzd, fencecheck, the fixture and the load generator; nginx runs apart\n", dir)

	b := &bench{opts: opts, out: out, gw: map[string]*nginx{},
		client: &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024, IdleConnTimeout: time.Minute, DisableCompression: true}}
	defer b.client.CloseIdleConnections()
	b.s, err = startStack(ctx, dir, opts.ReportWorkers)
	if err != nil {
		return fmt.Errorf("stack: %w", err)
	}
	defer b.s.close()
	user, err := gatewayconf.NewUser(userName, userPassword, bcrypt.MinCost)
	if err != nil {
		return err
	}
	for _, g := range []struct {
		d, name, upstream string
		render            func(gatewayconf.Data) ([]byte, error)
	}{
		{designA, "fcd", b.s.guarded, renderFCD},
		{designAT, "fcd-trail", b.s.guardedTrail, renderFCD},
		{designA0, "fcd-offline", b.s.offline, renderFCD},
		{designB, "plain", b.s.bare, renderPlain},
		{designB0, "bare", b.s.bare, renderPlain},
	} {
		authzdURL := b.s.url
		if g.d == designAT {
			authzdURL = b.s.urlTrail
		}
		data, err := gatewayconf.NewData("127.0.0.1:1", authzdURL, string(b.s.creds[api.RoleGateway]), map[string]string{poolV14: g.upstream}, poolV14)
		if err != nil {
			return err
		}
		if g.d != designB0 {
			data.Users = []gatewayconf.User{user}
		}
		if b.gw[g.d], err = startNginx(dir, g.name, data, g.render); err != nil {
			return err
		}
		defer b.gw[g.d].stop()
	}

	// One formation per A, AT and A0 call, formed before any timing; AT's
	// through its own authzd, which (like A's) then admits them from its
	// cache of formations it saw become ready.
	t0, total := time.Now(), 0
	formed, formedAT := map[int][]string{}, map[int][]string{}
	for _, c := range opts.Levels {
		n := opts.WarmupOps(c) + opts.Ops(c)
		if formed[c], err = b.s.formMany(ctx, b.s.url, fmt.Sprintf("bench-c%d", c), 2*n); err != nil {
			return fmt.Errorf("forming: %w", err)
		}
		if formedAT[c], err = b.s.formMany(ctx, b.s.urlTrail, fmt.Sprintf("bench-at-c%d", c), n); err != nil {
			return fmt.Errorf("forming: %w", err)
		}
		total += 3 * n
	}
	fmt.Fprintf(out, "# formed %d ready formations over REST (one session each) in %.1fs, before timing\n", total, time.Since(t0).Seconds())

	type result struct {
		c      int
		phases map[string]*phase
	}
	var results []result
	var failed []string
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
	for _, c := range opts.Levels {
		ph, err := b.level(ctx, c, formed[c], formedAT[c])
		if err != nil {
			return fmt.Errorf("concurrency %d: %w", c, err)
		}
		results = append(results, result{c, ph})
		for _, d := range designs {
			if f := ph[d].fails; len(f) > 0 {
				failed = append(failed, fmt.Sprintf("c=%d design %s: %d calls failed, first: %s", c, d, len(f), f[0]))
			}
		}
	}

	// CPU: this process (load generator, authzd, etcd, fencecheck, the
	// fixture) plus the design's nginx.
	fmt.Fprintln(out)
	fmt.Fprintln(out, "| c | design | ops | ops/s | p50 ms | p95 ms | p99 ms | CPU ms/op | etcd KV RPCs/op |")
	fmt.Fprintln(out, "|---:|---|---:|---:|---:|---:|---:|---:|---|")
	for _, r := range results {
		for _, d := range designs {
			p := r.phases[d]
			slices.Sort(p.lat)
			n := float64(len(p.lat))
			rpc := fmt.Sprintf("%.2f Txn + %.2f Range", p.rpc["Txn"]/n, p.rpc["Range"]/n)
			if p.rpc["Put"] > 0 || p.rpc["DeleteRange"] > 0 {
				rpc += fmt.Sprintf(" + %.2f Put + %.2f DeleteRange", p.rpc["Put"]/n, p.rpc["DeleteRange"]/n)
			}
			fmt.Fprintf(out, "| %d | %s | %d | %.0f | %.2f | %.2f | %.2f | %.2f | %s |\n", r.c, designTitle[d], len(p.lat), p.rate(),
				loadgen.MS(loadgen.Percentile(p.lat, .50)), loadgen.MS(loadgen.Percentile(p.lat, .95)), loadgen.MS(loadgen.Percentile(p.lat, .99)),
				loadgen.MS(p.cpu)/n, rpc)
		}
	}
	fmt.Fprintln(out)
	fmt.Fprintln(out, "| c | comparison | throughput ratio | ratio, report drain excluded | added p50 ms | added p95 ms |")
	fmt.Fprintln(out, "|---:|---|---:|---:|---:|---:|")
	for _, r := range results {
		for _, cmp := range comparisons {
			a, o := r.phases[cmp.a], r.phases[cmp.other]
			calls := float64(len(a.lat)) / (a.elapsed - a.drain).Seconds()
			fmt.Fprintf(out, "| %d | %s | %.2f | %.2f | %+.2f | %+.2f |\n", r.c, cmp.says, a.rate()/o.rate(), calls/o.rate(),
				loadgen.MS(loadgen.Percentile(a.lat, .50)-loadgen.Percentile(o.lat, .50)), loadgen.MS(loadgen.Percentile(a.lat, .95)-loadgen.Percentile(o.lat, .95)))
		}
	}
	fmt.Fprintln(out)
	for _, r := range results {
		fmt.Fprintf(out, "# c=%d: report drain after the last call, counted in the design's time: A %.1f ms, AF %.1f ms\n", r.c,
			loadgen.MS(r.phases[designA].drain), loadgen.MS(r.phases[designAF].drain))
	}

	// What ran where: every A and A0 call ran under a lease (its token
	// reached the fixture through fencecheck), no B call did; every A call
	// was claimed and reported.
	var leased, bare int
	for _, e := range b.s.rec.Effects(fixtures.Filter{Tool: benchTool}) {
		if e.Lease != "" {
			leased++
		} else {
			bare++
		}
	}
	var wantA, wantA0, wantB int
	for _, r := range results {
		wantA += len(r.phases[designA].lat) + len(r.phases[designAT].lat) + len(r.phases[designAF].lat) + 3*opts.WarmupOps(r.c)
		wantA0 += len(r.phases[designA0].lat) + opts.WarmupOps(r.c)
		wantB += len(r.phases[designB].lat) + len(r.phases[designB0].lat) + 2*opts.WarmupOps(r.c)
	}
	sent, rerr := b.s.reported()
	claims, cerr := b.s.claims(ctx)
	fmt.Fprintf(out, "\n# fixture effects: %d under a lease (A, AT, AF and A0, want %d), %d without (B and B0, want %d); leases claimed in authzd: %d (A, AT and AF, want %d); outcome reports sent to authzd: %d\n",
		leased, wantA+wantA0, bare, wantB, claims, wantA, sent)
	for d := range b.gw {
		if err := b.gw[d].alive(); err != nil {
			failed = append(failed, fmt.Sprintf("design %s: %v", d, err))
		}
	}
	// AT's trail follows AT's store (a prefix of its own): it holds each
	// formation formed through AT and three events a call (admission,
	// claim, outcome), beside its few setup events (the registration, the
	// snapshot, the policy set in force).
	var wantEvents uint64
	for _, r := range results {
		n := uint64(len(r.phases[designAT].lat) + opts.WarmupOps(r.c))
		wantEvents += n + 3*n
	}
	const setupEvents = 8 // at most
	events, _ := b.s.trail.Head()
	fmt.Fprintf(out, "# audit trail of AT's authzd: %d events (want %d calls' and at most %d of setup)\n", events, wantEvents, setupEvents)
	if events < wantEvents || events > wantEvents+setupEvents {
		failed = append(failed, fmt.Sprintf("the audit trail holds %d events, want %d and at most %d more", events, wantEvents, setupEvents))
	}
	switch {
	case rerr != nil:
		failed = append(failed, rerr.Error())
	case cerr != nil:
		failed = append(failed, cerr.Error())
	case leased != wantA+wantA0 || bare != wantB:
		failed = append(failed, fmt.Sprintf("effects: %d leased, %d bare, want %d and %d", leased, bare, wantA+wantA0, wantB))
	case claims != uint64(wantA) || sent != uint64(wantA):
		failed = append(failed, fmt.Sprintf("%d leases claimed and %d outcomes reported, want %d each (A's, AT's and AF's calls)", claims, sent, wantA))
	}
	if len(failed) > 0 {
		return fmt.Errorf("the figures above are not valid:\n  %s", strings.Join(failed, "\n  "))
	}
	return nil
}

func (p *phase) rate() float64 { return loadgen.Rate(len(p.lat), p.elapsed) }

// level runs one concurrency level: sessions, warm-up, alternating rounds.
func (b *bench) level(ctx context.Context, c int, ids, idsAT []string) (map[string]*phase, error) {
	sessions := map[string][]*session{}
	defer func() {
		for _, ss := range sessions {
			for _, s := range ss {
				s.close()
			}
		}
	}()
	for _, d := range designs {
		for range c {
			s, err := b.connect(ctx, d)
			if err != nil {
				return nil, err
			}
			sessions[d] = append(sessions[d], s)
		}
	}
	warm := b.opts.WarmupOps(c)
	take := func(ids *[]string) func(int) []string {
		return func(n int) []string { out := (*ids)[:n]; *ids = (*ids)[n:]; return out }
	}
	nextOf := func(d string) func(int) []string {
		if d == designAT {
			return take(&idsAT)
		}
		return take(&ids)
	}
	for _, d := range designs {
		p := b.phase(ctx, d, sessions[d], warm, nextOf(d))
		if len(p.fails) > 0 {
			return nil, fmt.Errorf("warm-up of %s: %d calls failed, first: %s", d, len(p.fails), p.fails[0])
		}
	}
	res := map[string]*phase{}
	for _, d := range designs {
		res[d] = &phase{}
	}
	n := b.opts.Ops(c)
	for r := range b.opts.Rounds {
		k := n / b.opts.Rounds
		if r == b.opts.Rounds-1 {
			k = n - k*(b.opts.Rounds-1)
		}
		for i := range designs {
			d := designs[(r+i)%len(designs)]
			p := b.phase(ctx, d, sessions[d], k, nextOf(d))
			t := res[d]
			t.lat = append(t.lat, p.lat...)
			t.elapsed += p.elapsed
			t.drain += p.drain
			t.fails = append(t.fails, p.fails...)
			t.cpu += p.cpu
			if t.rpc == nil {
				t.rpc = map[string]float64{}
			}
			for k, v := range p.rpc {
				t.rpc[k] += v
			}
		}
	}
	return res, ctx.Err()
}

// phase runs n calls of design d over the sessions (one worker each).
// For A and A0, it takes n formation ids from next; AF forms its own. For
// A and AF, after the last call, it waits until fencecheck reported every
// outcome (counted in elapsed).
func (b *bench) phase(ctx context.Context, d string, ss []*session, n int, next func(int) []string) *phase {
	var ids []string
	if formed(d) {
		ids = next(n)
	}
	lats := make([][]time.Duration, len(ss))
	fails := make([][]string, len(ss))
	var cursor atomic.Int64
	var wg sync.WaitGroup
	gw := b.gw[gatewayOf(d)].cmd.Process.Pid // nginx runs in a process group of its own
	rpc0, cpu0 := loadgen.KVRPCs(), loadgen.ProcessCPU()+loadgen.GroupCPU(gw)
	start := time.Now()
	for w, s := range ss {
		wg.Go(func() {
			for {
				i := int(cursor.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				id := ""
				if ids != nil {
					id = ids[i]
				}
				t := time.Now()
				var err error
				if formsInline(d) {
					id, err = b.s.form(ctx, fmt.Sprintf("bench-af-%d", b.inline.Add(1)))
				}
				if err == nil {
					err = s.call(ctx, id)
				}
				if err != nil {
					fails[w] = append(fails[w], err.Error())
					continue
				}
				lats[w] = append(lats[w], time.Since(t))
				if reports(d) {
					b.aCalls.Add(1)
				}
			}
		})
	}
	wg.Wait()
	p := &phase{}
	if reports(d) {
		last := time.Now()
		if err := b.s.waitReported(ctx, b.aCalls.Load()); err != nil {
			p.fails = append(p.fails, err.Error())
		}
		p.drain = time.Since(last)
	}
	p.elapsed = time.Since(start)
	p.cpu = loadgen.ProcessCPU() + loadgen.GroupCPU(gw) - cpu0
	p.rpc = map[string]float64{}
	for k, v := range loadgen.KVRPCs() {
		p.rpc[k] = v - rpc0[k]
	}
	for w := range ss {
		p.lat = append(p.lat, lats[w]...)
		p.fails = append(p.fails, fails[w]...)
	}
	return p
}

// session is one MCP client session of one worker, through one design's
// nginx.
type session struct {
	b      *bench
	design string
	cs     *mcp.ClientSession
}

func (b *bench) connect(ctx context.Context, d string) (*session, error) {
	tr := &mcp.StreamableClientTransport{
		Endpoint: b.gw[gatewayOf(d)].url + "/mcp",
		// FormationTransport copies _meta's formation id into the
		// Fcd-Formation header (what a host in front of forward-auth
		// does); B's calls carry none, and pass through the same code.
		// Every nginx authenticates the client (auth_basic).
		HTTPClient:           &http.Client{Transport: gatewaytest.FormationTransport(gatewaytest.BasicAuth(b.client, userName, userPassword))},
		DisableStandaloneSSE: true,
	}
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "fcd-bench-gateway", Version: "0"}, nil).Connect(cctx, tr, nil)
	if err != nil {
		return nil, fmt.Errorf("connect through nginx (%s): %w", d, err)
	}
	return &session{b: b, design: d, cs: cs}, nil
}

func (s *session) close() {
	if s.cs != nil {
		_ = s.cs.Close()
	}
}

// call sends the timed tools/call; id is the formation (A, A0) or "" (B). A
// call that errs or returns a tool error is a failure; after a transport
// error the session is replaced, as a real host must (the SDK client ends
// its session on a gateway's non-JSON-RPC refusal). There should be none.
func (s *session) call(ctx context.Context, id string) error {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	p := &mcp.CallToolParams{Name: benchTool, Arguments: json.RawMessage(benchArgs)}
	if id != "" {
		p.Meta = mcp.Meta{gatewaytest.FormationMetaKey: id}
	}
	res, err := s.cs.CallTool(cctx, p)
	if err != nil {
		s.close()
		cs, cerr := s.b.connect(ctx, s.design)
		if cerr != nil {
			return fmt.Errorf("formation %q: %v; reconnect: %v", id, err, cerr)
		}
		s.cs = cs.cs
		return fmt.Errorf("formation %q: %v (session replaced)", id, err)
	}
	if res.IsError {
		raw, _ := json.Marshal(res)
		return fmt.Errorf("formation %q: tool error: %s", id, raw)
	}
	return nil
}

func kernel() string {
	data, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(data))
}
