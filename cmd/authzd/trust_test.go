package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/internal/cmdtest"
	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/lease"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestServeWarnsOfAnOpenExternalCluster: on an external cluster that
// accepts clients without credentials, /readyz stays ready and warns under
// checks.storeAccess, and authzd logs the warning; on one that requires a
// client certificate but has etcd's authentication off it warns of that;
// on one set up as docs/trust.md says (client certificates, the fcd user
// limited to fcd's prefix, authentication on) it says ok and logs no
// warning.
func TestServeWarnsOfAnOpenExternalCluster(t *testing.T) {
	const warned = `msg="etcd is open to clients without fcd's credential"`
	tests := []struct {
		name  string
		start func(t *testing.T) []string // the serve flags
		want  []string                    // in the warnings; none: ok
	}{
		{"open", func(t *testing.T) []string {
			return []string{"--etcd-endpoints", etcdtest.Start(t).Endpoints()[0]}
		}, []string{"accepts clients without credentials", "authentication is off"}},
		{"client certificates, authentication off", func(t *testing.T) []string {
			m, files := etcdtest.StartTLS(t)
			return []string{"--etcd-endpoints", m.Endpoints()[0], "--etcd-ca", files.CA, "--etcd-cert", files.ClientCert, "--etcd-key", files.ClientKey}
		}, []string{"authentication is off"}},
		{"client certificates, fcd's role", func(t *testing.T) []string {
			m, files := etcdtest.StartTLSWithAuth(t, "/fcd/")
			return []string{"--etcd-endpoints", m.Endpoints()[0], "--etcd-ca", files.CA, "--etcd-cert", files.FCDCert, "--etcd-key", files.FCDKey}
		}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"serve", "--dev", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0"}, tc.start(t)...)
			c, url, err := cmdtest.Start(t, "authzd", listeningLine, func(ctx context.Context, stderr io.Writer) int {
				return run(ctx, args, nil, io.Discard, stderr)
			})
			if err != nil {
				t.Fatalf("%v\n%s", err, c.Stderr.String())
			}
			defer c.Stop(t)
			access := readyStoreAccess(t, url)
			log := c.Stderr.String()
			if tc.want == nil {
				if access != "ok" || strings.Contains(log, warned) {
					t.Fatalf("storeAccess %v, log:\n%s", access, log)
				}
				return
			}
			got, _ := access.(map[string]any)
			body, _ := json.Marshal(got)
			for _, w := range tc.want {
				if got["status"] != "open" || !strings.Contains(string(body), w) {
					t.Errorf("storeAccess %s, want a warning %q", body, w)
				}
			}
			for deadline := time.Now().Add(10 * time.Second); !strings.Contains(c.Stderr.String(), warned); time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("no warning logged:\n%s", c.Stderr.String())
				}
			}
			if n := strings.Count(c.Stderr.String(), warned); n != 1 {
				t.Errorf("the warning logged %d times", n)
			}
		})
	}
}

// readyStoreAccess waits for /readyz to answer 200 with a checked
// checks.storeAccess (the first check runs once the server runs) and
// returns it.
func readyStoreAccess(t *testing.T, url string) any {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		code, body := readyz(t, url, http.StatusOK)
		var r struct{ Checks map[string]any }
		if code == http.StatusOK && json.Unmarshal(body, &r) == nil && r.Checks["storeAccess"] != nil && r.Checks["storeAccess"] != "unchecked" {
			return r.Checks["storeAccess"]
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz %d %s", code, body)
		}
	}
}

// TestServeEmbeddedAcceptsOnlyItself: `serve --dev` on a data directory
// of the earlier layout (its embedded member on plain http, the URL
// recorded) starts on the same port, now mutual TLS, with its data; a
// local client dialing the recorded endpoint without the member's
// credential can neither read nor write, nor can one on the old plain URL,
// while the credential storeAccess hands every client of the data
// directory works.
func TestServeEmbeddedAcceptsOnlyItself(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "data")
	etcdDir := filepath.Join(dataDir, "etcd")
	old, err := lease.StartEmbedded(context.Background(), lease.EmbedConfig{Dir: etcdDir, OpenLoopback: true,
		LogFile: filepath.Join(t.TempDir(), "etcd.log")})
	if err != nil {
		t.Fatal(err)
	}
	oldURL := old.Endpoints()[0]
	plain, err := clientv3.New(clientv3.Config{Endpoints: []string{oldURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Put(context.Background(), "/fcd/planted-before", "v"); err != nil {
		t.Fatal(err)
	}
	plain.Close()
	old.Close()

	url, stop := startServerDefaultPorts(t, dataDir)
	defer stop()
	if code, body := readyz(t, url, http.StatusOK); code != http.StatusOK {
		t.Fatalf("readyz after the upgrade %d %s", code, body)
	}
	cfg := Config{DataDir: dataDir}
	acc, err := cfg.storeAccess()
	if err != nil {
		t.Fatal(err)
	}
	if want := "https://" + strings.TrimPrefix(oldURL, "http://"); len(acc.Endpoints) != 1 || acc.Endpoints[0] != want || acc.TLS == nil {
		t.Fatalf("store access %+v, want %s over TLS", acc, want)
	}
	raw, err := os.ReadFile(filepath.Join(etcdDir, lease.EndpointsFile))
	if err != nil || !strings.Contains(string(raw), `"clientURL":"`+acc.Endpoints[0]+`"`) {
		t.Fatalf("recorded %s (%v)", raw, err)
	}
	own, err := clientv3.New(clientv3.Config{Endpoints: acc.Endpoints, TLS: acc.TLS, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if r, err := own.Get(ctx, "/fcd/planted-before"); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("the data from before the upgrade: %v %v", r, err)
	}
	for _, ep := range []string{acc.Endpoints[0], oldURL} {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		octx, ocancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, perr := cli.Put(octx, "/fcd/signing-keys/forged", "{}")
		_, gerr := cli.Get(octx, "/fcd/", clientv3.WithPrefix())
		ocancel()
		cli.Close()
		if perr == nil || gerr == nil {
			t.Fatalf("a client without the credential on %s: put %v, get %v", ep, perr, gerr)
		}
	}
	if r, err := own.Get(ctx, "/fcd/signing-keys/forged"); err != nil || len(r.Kvs) != 0 {
		t.Fatalf("the forged key: %v %v", r, err)
	}
}
