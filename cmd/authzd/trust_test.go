package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/internal/cmdtest"
	"github.com/fcd-authz/fcd/internal/etcdtest"
	"github.com/fcd-authz/fcd/internal/testutil"
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
			testutil.EventuallyState(t, 10*time.Second, "the warning logged", func() bool { return strings.Contains(c.Stderr.String(), warned) },
				func() string { return "log:\n" + c.Stderr.String() })
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
	var code int
	var body []byte
	var r struct{ Checks map[string]any }
	testutil.EventuallyState(t, 30*time.Second, "/readyz to answer 200 with storeAccess checked", func() bool {
		code, body = getReadyz(t, url)
		return code == http.StatusOK && json.Unmarshal(body, &r) == nil && r.Checks["storeAccess"] != nil && r.Checks["storeAccess"] != "unchecked"
	}, func() string { return fmt.Sprintf("%d %s", code, body) })
	return r.Checks["storeAccess"]
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
	readyz(t, url, http.StatusOK) // after the upgrade
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

// TestInitExternalCluster: `authzd init --etcd-endpoints ...` with the
// cluster's CA and its key and the root user's certificate writes fcd's
// client credential into DIR/etcd (0700, the key 0600; CN fcd), creates
// the etcd user fcd whose role may read and write /fcd/ alone, turns
// authentication on, and writes a configuration that `serve --config`
// accepts unchanged: ready, and no storeAccess warning. Afterwards a
// client certificate of the same CA that is not fcd's can neither read nor
// write fcd's keys, and fcd's own cannot write outside its prefix. Without
// the CA key, init writes a request to have signed instead.
func TestInitExternalCluster(t *testing.T) {
	m, files := etcdtest.StartTLS(t)
	dir := filepath.Join(t.TempDir(), "fcd")
	var out, errb strings.Builder
	if code := run(context.Background(), []string{"init", "--listen", "127.0.0.1:0", "--etcd-endpoints", m.Endpoints()[0],
		"--etcd-ca", files.CA, "--etcd-ca-key", files.CAKey, "--etcd-admin-cert", files.RootCert, "--etcd-admin-key", files.RootKey,
		"--etcd-enable-auth", dir}, nil, &out, &errb); code != 0 {
		t.Fatalf("init: exit %d %s", code, errb.String())
	}
	var report struct {
		EtcdGrant lease.AccessGrant
		Warning   string
	}
	if err := json.Unmarshal([]byte(out.String()), &report); err != nil || !report.EtcdGrant.AuthEnabled ||
		report.EtcdGrant.User != "fcd" || report.EtcdGrant.Prefix != "/fcd/" || report.Warning != "" {
		t.Fatalf("init reported %s (%v)", out.String(), err)
	}
	assertPerm(t, filepath.Join(dir, "etcd"), 0o700)
	assertPerm(t, filepath.Join(dir, "etcd", "fcd.key"), 0o600)

	args := []string{"serve", "--config", filepath.Join(dir, "authzd.yaml")}
	c, url, err := cmdtest.Start(t, "authzd", listeningLine, func(ctx context.Context, stderr io.Writer) int {
		return run(ctx, args, nil, io.Discard, stderr)
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, c.Stderr.String())
	}
	defer c.Stop(t)
	if access := readyStoreAccess(t, url); access != "ok" {
		t.Fatalf("storeAccess %v\n%s", access, c.Stderr.String())
	}

	dial := func(cert, key string) *clientv3.Client {
		cli, err := clientv3.New(clientv3.Config{Endpoints: m.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
			TLS: etcdtest.TLSFiles{CA: files.CA, ClientCert: cert, ClientKey: key}.ClientConfig(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
		return cli
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	other := dial(files.ClientCert, files.ClientKey) // CN authzd: signed by the CA, no etcd user
	if _, err := other.Put(ctx, "/fcd/signing-keys/forged", "{}"); err == nil {
		t.Error("another certificate of the CA wrote fcd's keys")
	}
	if _, err := other.Get(ctx, "/fcd/", clientv3.WithPrefix()); err == nil {
		t.Error("another certificate of the CA read fcd's keys")
	}
	fcd := dial(filepath.Join(dir, "etcd", "fcd.crt"), filepath.Join(dir, "etcd", "fcd.key"))
	if r, err := fcd.Get(ctx, "/fcd/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || r.Count == 0 {
		t.Fatalf("fcd's certificate reads its prefix: %v %v", r, err)
	}
	if _, err := fcd.Put(ctx, "/elsewhere", "v"); err == nil {
		t.Error("fcd's certificate wrote outside its prefix")
	}

	csrDir := filepath.Join(t.TempDir(), "fcd")
	out.Reset()
	if code := run(context.Background(), []string{"init", "--etcd-endpoints", m.Endpoints()[0], "--etcd-ca", files.CA, csrDir}, nil, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "fcd.csr") {
		t.Fatalf("init without the CA key: exit %d %s %s", code, out.String(), errb.String())
	}
	if _, err := os.Stat(filepath.Join(csrDir, "etcd", "fcd.csr")); err != nil {
		t.Fatal(err)
	}
}

func assertPerm(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != want {
		t.Errorf("%s: %v %v, want mode %o", path, fi, err, want)
	}
}
