package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/internal/leaktest"
	"github.com/fcd-authz/fcd/internal/testutil"
	"go.uber.org/goleak"
)

// TestServeJoinsEveryGoroutine starts the whole server (embedded etcd,
// policy watcher on a directory, token key publisher, sweeper, SIGHUP
// handler, HTTP and gRPC servers), uses it, and checks that each of its
// loops and servers runs in a goroutine serve waits for; then it stops
// the server and checks that nothing serve started outlives it. No
// goroutine is ignored but those running before the test began.
func TestServeJoinsEveryGoroutine(t *testing.T) {
	// Whatever earlier tests left behind is not this test's business.
	before := goleak.IgnoreCurrent()
	started := goroutineIDs()

	dir := filepath.Join(t.TempDir(), "data")
	url, stop := startServer(t, dir, "--dev", "--policy-dir", "../../policies", "--policy-poll", "10ms",
		"--grpc-listen", "127.0.0.1:0")
	stopped := false
	defer func() {
		if !stopped {
			stop()
		}
	}()

	tr := &http.Transport{}
	client := &http.Client{Timeout: 10 * time.Second, Transport: tr}
	get := func(path string) (int, []byte) {
		t.Helper()
		resp, err := client.Get(url + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, body
	}
	// Ready, and the token key published: the publisher's etcd lease and
	// its keep-alive stream are running.
	var code, jcode int
	var body []byte
	testutil.EventuallyState(t, time.Minute, "ready with a published key", func() bool {
		code, _ = get("/readyz")
		var jwks struct{ Keys []json.RawMessage }
		jcode, body = get("/.well-known/jwks.json")
		return code == http.StatusOK && jcode == http.StatusOK && json.Unmarshal(body, &jwks) == nil && len(jwks.Keys) == 1
	}, func() string { return fmt.Sprintf("/readyz %d, jwks %d %s", code, jcode, body) })
	tr.CloseIdleConnections()

	// Every loop and server runs in a goroutine of run's errgroup, which
	// run waits for before it returns and serve closes the store. A loop
	// started with a bare go statement would end soon after its context
	// and slip past the check below; this one sees it.
	for fn, g := range loopGoroutines(t, started) {
		if g == "" {
			t.Errorf("no goroutine runs %s", fn)
		} else if !strings.Contains(g, "\ncreated by golang.org/x/sync/errgroup.(*Group).Go") {
			t.Errorf("%s runs in a goroutine serve does not wait for:\n%s", fn, g)
		}
	}

	stopped = true
	stop() // cancels serve's context; fails the test unless serve returned nil (exit status 0)

	goleak.VerifyNone(t, before)
}

// serverType is how stacks name the server type serve runs.
const serverType = "github.com/fcd-authz/fcd/server.(*Server)"

// servedLoops are the functions serve runs for as long as it serves, each
// in a goroutine of its own.
var servedLoops = []string{
	"github.com/fcd-authz/fcd/authz/policy.(*Manager).Watch",
	serverType + ".reloadOnHUP",
	"github.com/fcd-authz/fcd/lease.(*Store).KeepPublished", // TokenIssuer.Publish
	"github.com/fcd-authz/fcd/authz.(*Leases).RunSweeper",
	"net/http.(*Server).Serve",
	"google.golang.org/grpc.(*Server).Serve",
}

// loopGoroutines returns, for each of servedLoops, the stack of the one
// goroutine not in old that runs it ("" if none does).
func loopGoroutines(t *testing.T, old map[string]bool) map[string]string {
	t.Helper()
	found := map[string]string{}
	for _, fn := range servedLoops {
		found[fn] = ""
	}
	for id, g := range leaktest.Goroutines() {
		if old[id] || !strings.Contains(g, serverType) {
			continue // not serve's: e.g. the embedded etcd's own HTTP and gRPC servers
		}
		for _, fn := range servedLoops {
			if !strings.Contains(g, "\n"+fn+"(") {
				continue
			}
			if found[fn] != "" {
				t.Errorf("two goroutines run %s:\n%s\n\n%s", fn, found[fn], g)
			}
			found[fn] = g
		}
	}
	return found
}

func goroutineIDs() map[string]bool {
	ids := map[string]bool{}
	for id := range leaktest.Goroutines() {
		ids[id] = true
	}
	return ids
}
