// Command listing measures what bounded listing and the store's size cost,
// in one process with one embedded etcd member and the full HTTP stack
// (issue 16, "bounded resources"):
//
//  1. It forms -n calls through the use cases (the example github manifest:
//     half get_repository, ready; half create_repository, waiting for
//     approval), then compacts etcd and reports the database bytes in use
//     per stored formation: the figure docs/capacity.md sizes the quota
//     and the default formation rate with.
//
//  2. It admits calls one at a time (POST /v1/formations/{id}/admit over
//     HTTP) with nothing else running, for a baseline latency.
//
//  3. It starts -c listers, each walking GET /v1/formations page by page
//     (-limit a page, -status filter) until `next` is absent, and admits
//     calls one at a time meanwhile. It samples the Go heap every 20 ms and
//     reports its growth over the baseline taken before (etcd's server is
//     in this process too, so its range buffers count) — both HeapAlloc,
//     garbage included, and the live heap the GC found reachable — and the
//     admissions' latency and failures during the listings.
//
//     go run ./bench/listing [-n 100000] [-c 16] [-limit 1000] [-status ""] [-admit 300] [-dir DIR]
//
// With -n 100000 it takes a few minutes on 2 cores, most of it forming.
package main

import (
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
	"runtime/metrics"
	"slices"
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
		fmt.Fprintln(os.Stderr, "listing:", err)
		os.Exit(2)
	}
	if err := run(context.Background(), opts, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "listing:", err)
		os.Exit(1)
	}
}

// options are the command-line settings.
type options struct {
	N       int    // formations stored
	Listers int    // parallel listers
	Limit   int    // page size
	Status  string // the listers' status filter
	Admit   int    // admissions timed in each phase
	Dir     string // parent of the etcd data directory
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("listing", flag.ContinueOnError)
	fs.IntVar(&o.N, "n", 100000, "formations to store")
	fs.IntVar(&o.Listers, "c", 16, "parallel listers, each walking every page")
	fs.IntVar(&o.Limit, "limit", 1000, "page size (limit=) of the listers")
	fs.StringVar(&o.Status, "status", "", "status= filter of the listers (empty: all)")
	fs.IntVar(&o.Admit, "admit", 300, "admissions timed before and during the listings")
	fs.StringVar(&o.Dir, "dir", "", "parent directory of the etcd data (default: the system temp dir)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.N < 2 || o.Listers < 1 || o.Limit < 1 || o.Limit > authz.MaxListLimit || o.Admit < 1 {
		return o, errors.New("-n >= 2, -c >= 1, -limit 1-1000 and -admit >= 1 are required")
	}
	return o, nil
}

type bench struct {
	opts  options
	out   io.Writer
	store *lease.Store
	reg   *authz.Registry
	uc    *authz.UseCases
	url   string
	http  *http.Client
	host  api.Secret
	gate  api.Secret
	// hostAPI and gateAPI call the server as the host and the gateway.
	hostAPI   *client.ClientWithResponses
	gateAPI   *client.ClientWithResponses
	snapshot  string
	registrar func([]byte) ([]byte, error)
}

func run(ctx context.Context, opts options, out io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	b := &bench{opts: opts, out: out}
	quiet := slog.New(slog.DiscardHandler)
	parent := opts.Dir
	if parent == "" {
		parent = os.TempDir()
	}
	dir, err := os.MkdirTemp(parent, "fcd-listing-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
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
		CompactionRetention: "24h", // the run compacts when it measures, not before
	})
	if err != nil {
		return err
	}
	defer member.Close()
	if b.store, err = lease.Open(ctx, lease.Config{Endpoints: member.Endpoints(), TLS: member.Access().TLS, Logger: quiet, Quota: member.Quota()}); err != nil {
		return err
	}
	defer b.store.Close()
	raw, err := clientv3.New(clientv3.Config{Endpoints: member.Endpoints(), TLS: member.Access().TLS, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer raw.Close()
	stop, err := b.startServer(ctx, dir)
	if err != nil {
		return err
	}
	defer stop()

	fmt.Fprintf(out, "# reproduce: go run ./bench/listing -n %d -c %d -limit %d -status %q -admit %d\n", opts.N, opts.Listers, opts.Limit, opts.Status, opts.Admit)
	fmt.Fprintf(out, "# machine: %s/%s, %s, NumCPU=%d, GOMAXPROCS=%d, %s; etcd, authzd and the load share this process\n",
		runtime.GOOS, runtime.GOARCH, loadgen.CPUModel(), runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version())
	if err := b.registerAndSnapshot(ctx); err != nil {
		return err
	}
	// The size before any formation, compacted.
	before, err := b.compacted(ctx, raw)
	if err != nil {
		return err
	}
	t0 := time.Now()
	admissible, err := b.formMany(ctx, opts.N)
	if err != nil {
		return fmt.Errorf("forming: %w", err)
	}
	fmt.Fprintf(out, "# formed %d calls (half ready get_repository, half pending create_repository) in %.1fs\n", opts.N, time.Since(t0).Seconds())
	after, err := b.compacted(ctx, raw)
	if err != nil {
		return err
	}
	perFormation := float64(after.DBSizeInUse-before.DBSizeInUse) / float64(opts.N)
	fmt.Fprintf(out, "\n## etcd size per formation (compacted)\n\n| formations | db size in use before / after | db size after | bytes in use per formation |\n|---:|---:|---:|---:|\n")
	fmt.Fprintf(out, "| %d | %d / %d | %d | **%.0f** |\n", opts.N, before.DBSizeInUse, after.DBSizeInUse, after.DBSize, perFormation)

	if len(admissible) < 2*opts.Admit {
		return fmt.Errorf("only %d ready formations to admit, need %d (raise -n)", len(admissible), 2*opts.Admit)
	}
	if err := b.waitForSigning(ctx, admissible[0]); err != nil {
		return err
	}
	admissible = admissible[1:]
	base := b.admitSeq(ctx, admissible[:opts.Admit], nil)

	// The listings, with admissions meanwhile.
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	heap0 := ms.HeapAlloc
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(live)
	live0 := live[0].Value.Uint64()
	var peak, peakLive atomic.Uint64
	sampling, stopSampling := context.WithCancel(ctx)
	var sampler sync.WaitGroup
	sampler.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			if m.HeapAlloc > peak.Load() {
				peak.Store(m.HeapAlloc)
			}
			s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
			metrics.Read(s)
			if v := s[0].Value.Uint64(); v > peakLive.Load() {
				peakLive.Store(v)
			}
			select {
			case <-sampling.Done():
				return
			case <-tick.C:
			}
		}
	})
	var listed atomic.Int64
	var pages atomic.Int64
	var listErr error
	var once sync.Once
	listing, stopListing := context.WithCancel(ctx)
	var listers sync.WaitGroup
	var walks atomic.Int64
	t1 := time.Now()
	for range opts.Listers {
		listers.Go(func() {
			n, p, err := b.walk(listing)
			listed.Add(int64(n))
			pages.Add(int64(p))
			walks.Add(1)
			if err != nil && listing.Err() == nil {
				once.Do(func() { listErr = err })
			}
		})
	}
	during := b.admitSeq(ctx, admissible[opts.Admit:2*opts.Admit], &walks)
	listers.Wait()
	wall := time.Since(t1)
	stopListing()
	stopSampling()
	sampler.Wait()
	if listErr != nil {
		return fmt.Errorf("listing: %w", listErr)
	}
	growth := float64(peak.Load()) - float64(heap0)
	fmt.Fprintf(out, "\n## %d parallel listings of %d formations (limit=%d, status=%q)\n\n", opts.Listers, opts.N, opts.Limit, opts.Status)
	fmt.Fprintf(out, "| listed (all listers) | pages | wall | heap before | peak heap | heap growth | live heap before | peak live heap | **live heap growth** |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	fmt.Fprintf(out, "| %d | %d | %.1fs | %.0f MiB | %.0f MiB | %.0f MiB | %.0f MiB | %.0f MiB | **%.0f MiB** |\n", listed.Load(), pages.Load(), wall.Seconds(),
		float64(heap0)/(1<<20), float64(peak.Load())/(1<<20), growth/(1<<20),
		float64(live0)/(1<<20), float64(peakLive.Load())/(1<<20), (float64(peakLive.Load())-float64(live0))/(1<<20))
	fmt.Fprintf(out, "\nheap: HeapAlloc, garbage included (the GC lets it reach about twice the live heap, GOGC=100); live heap: what the last GC found reachable (/gc/heap/live:bytes)\n")
	fmt.Fprintf(out, "\n## admissions one at a time (POST /v1/formations/{id}/admit)\n\n| when | admitted | failed | p50 ms | p95 ms | p99 ms | max ms |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range []struct {
		name string
		p    *phase
	}{{"alone", base}, {"during the listings", during}} {
		fmt.Fprintf(out, "| %s | %d | %d | %.2f | %.2f | %.2f | %.2f |\n", r.name, len(r.p.lat), r.p.failures,
			loadgen.MS(loadgen.Percentile(r.p.lat, 0.5)), loadgen.MS(loadgen.Percentile(r.p.lat, 0.95)),
			loadgen.MS(loadgen.Percentile(r.p.lat, 0.99)), loadgen.MS(r.p.lat[len(r.p.lat)-1]))
	}
	if base.failures+during.failures > 0 {
		return fmt.Errorf("%d admissions failed, the first: %s", base.failures+during.failures, during.first+base.first)
	}
	return nil
}

// compacted compacts etcd at its current revision and returns its health.
func (b *bench) compacted(ctx context.Context, raw *clientv3.Client) (lease.Health, error) {
	resp, err := raw.Get(ctx, "/", clientv3.WithCountOnly())
	if err != nil {
		return lease.Health{}, err
	}
	if _, err := raw.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		return lease.Health{}, err
	}
	return b.store.Health(ctx)
}

// startServer builds authzd as it ships (server.New) on the bench's store
// (its member compacts only when the run measures it), listening on a
// loopback port, with its audit trail in dir and its logs formatted at the
// default level, then dropped. It turns off, and says why: the formation
// rate limit (one host credential forms every call of the run, standing
// for many hosts; the limit is per credential) and the 15-minute TTL, for
// an hour (the run forms its calls before it lists and admits them).
func (b *bench) startServer(ctx context.Context, dir string) (func(), error) {
	var stored []api.Credential
	for _, role := range []api.Role{api.RoleGateway, api.RoleHost} {
		secret, cred, err := api.NewCredential("bench-"+string(role), role)
		if err != nil {
			return nil, err
		}
		if role == api.RoleGateway {
			b.gate = secret
		} else {
			b.host = secret
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
		Listen: "127.0.0.1:0", DataDir: dir, Store: b.store, Replica: "bench",
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
	b.reg, b.uc = srv.UseCases().Registry, srv.UseCases()
	b.url = srv.URL()
	b.http = &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}
	stop := func() {
		cancel()
		<-ran
		_ = srv.Close()
		b.http.CloseIdleConnections()
	}
	if b.hostAPI, err = client.New(b.url, string(b.host), client.WithHTTPClient(b.http)); err != nil {
		stop()
		return nil, err
	}
	if b.gateAPI, err = client.New(b.url, string(b.gate), client.WithHTTPClient(b.http)); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

func (b *bench) registerAndSnapshot(ctx context.Context) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	data, err := os.ReadFile(filepath.Join(root, "examples", "github", "manifest-v1.4.json"))
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
	snap, err := b.reg.CreateSnapshot(ctx, []string{reg.Epoch.Server})
	if err != nil {
		return err
	}
	b.snapshot = snap.ID
	return nil
}

// formMany forms n calls, 16 at a time, and returns the ids of the ready
// ones (the even ones): half ready reads, half writes pending approval.
func (b *bench) formMany(ctx context.Context, n int) ([]string, error) {
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
				req := authz.FormRequest{Snapshot: b.snapshot, Session: fmt.Sprint("bench-", i), Host: "bench-host",
					Tool: "github/get_repository", Arguments: json.RawMessage(fmt.Sprintf(`{"owner":"bench","repo":"r%d"}`, i))}
				if i%2 == 1 {
					req.Tool, req.PrincipalID = "github/create_repository", "alice"
					req.Arguments = json.RawMessage(fmt.Sprintf(`{"name":"payroll-exports-%d","private":true}`, i))
				}
				f, err := b.uc.Formations.Form(ctx, req)
				if err == nil && f.Status != record.StatusReady && f.Status != record.StatusPendingApproval {
					err = fmt.Errorf("formation %s is %s", f.ID, f.Status)
				}
				if err != nil {
					once.Do(func() { first = err })
					return
				}
				if f.Status == record.StatusReady {
					ids[i] = f.ID
				}
			}
		})
	}
	wg.Wait()
	return slices.DeleteFunc(ids, func(id string) bool { return id == "" }), first
}

// walk lists every page once and returns the formations and pages seen.
// It builds each request with the typed client but decodes only what it
// counts: the listers share the machine with the server, and decoding
// every record in full would take CPU from the admissions measured.
func (b *bench) walk(ctx context.Context) (n, pages int, err error) {
	params := client.ListFormationsParams{Limit: &b.opts.Limit}
	if b.opts.Status != "" {
		status := client.FormationStatus(b.opts.Status)
		params.Status = &status
	}
	for {
		var page struct {
			Formations []json.RawMessage `json:"formations"`
			Next       string            `json:"next"`
		}
		if err := b.listPage(ctx, &params, &page); err != nil {
			return n, pages, err
		}
		n, pages = n+len(page.Formations), pages+1
		if page.Next == "" {
			return n, pages, nil
		}
		params.After = &page.Next
	}
}

// listPage reads one page of GET /v1/formations as the host into page.
func (b *bench) listPage(ctx context.Context, params *client.ListFormationsParams, page any) error {
	resp, err := b.hostAPI.ListFormations(ctx, params)
	if err != nil {
		return fmt.Errorf("list formations: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("list formations: HTTP %d", resp.StatusCode)
	}
	return json.NewDecoder(resp.Body).Decode(page)
}

// phase is the latencies (sorted) and failures of timed admissions.
type phase struct {
	lat      []time.Duration
	failures int
	first    string
}

// admitSeq admits ids one at a time. With walks, it stops early once
// every lister finished (admissions after that are not "during").
func (b *bench) admitSeq(ctx context.Context, ids []string, walks *atomic.Int64) *phase {
	p := &phase{}
	for _, id := range ids {
		if walks != nil && walks.Load() == int64(b.opts.Listers) {
			break
		}
		t := time.Now()
		err := b.admit(ctx, id)
		d := time.Since(t)
		if err != nil {
			p.failures++
			if p.first == "" {
				p.first = err.Error()
			}
			continue
		}
		p.lat = append(p.lat, d)
	}
	slices.Sort(p.lat)
	if len(p.lat) == 0 {
		p.lat = []time.Duration{0}
	}
	return p
}

func (b *bench) admit(ctx context.Context, id string) error {
	resp, err := b.gateAPI.AdmitFormationWithResponse(ctx, id)
	if err != nil {
		return err
	}
	if resp.JSON200 == nil {
		return fmt.Errorf("HTTP %d: %.300s", resp.StatusCode(), resp.Body)
	}
	return nil
}

// waitForSigning admits id once the dispatch key is published.
func (b *bench) waitForSigning(ctx context.Context, id string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := b.admit(ctx, id)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("admission never became ready: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the working directory")
		}
		dir = parent
	}
}
