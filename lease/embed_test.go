package lease_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/lease"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestEmbeddedMemberPicksAndKeepsItsPorts: with no URLs given, the
// embedded member listens on free loopback ports (https, its generated
// credential), records them in its directory, and a restart listens on the
// same ones, its data resumed.
func TestEmbeddedMemberPicksAndKeepsItsPorts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "etcd")
	ctx := context.Background()
	cfg := lease.EmbedConfig{Dir: dir, LogFile: filepath.Join(t.TempDir(), "etcd.log")}
	m, err := lease.StartEmbedded(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	first := m.Endpoints()
	raw, err := os.ReadFile(filepath.Join(dir, lease.EndpointsFile))
	if err != nil {
		t.Fatal(err)
	}
	var rec struct{ ClientURL, PeerURL string }
	if err := json.Unmarshal(raw, &rec); err != nil || rec.ClientURL != first[0] || !strings.HasPrefix(rec.ClientURL, "https://127.0.0.1:") ||
		!strings.HasPrefix(rec.PeerURL, "https://127.0.0.1:") ||
		strings.HasSuffix(rec.ClientURL, ":2379") {
		t.Fatalf("recorded %s (%v), endpoints %v", raw, err, first)
	}
	put(t, m.Access(), "k", "v")
	m.Close()

	m, err = lease.StartEmbedded(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if got := m.Endpoints(); len(got) != 1 || got[0] != first[0] {
		t.Fatalf("restarted on %v, first on %v", got, first)
	}
	if v := get(t, m.Access(), "k"); v != "v" {
		t.Fatalf("after the restart k = %q", v)
	}
}

// TestEmbeddedMemberRefusesALockedDirectory: a second member on a
// directory in use fails within its lock timeout naming the directory and
// the process that holds it (instead of waiting forever for etcd's
// database lock); a cancelled context ends the wait at once; once the
// first member stopped, the directory starts.
func TestEmbeddedMemberRefusesALockedDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "etcd")
	cfg := lease.EmbedConfig{Dir: dir, LogFile: filepath.Join(t.TempDir(), "etcd.log")}
	m, err := lease.StartEmbedded(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	second := cfg
	second.LockTimeout = 300 * time.Millisecond
	start := time.Now()
	_, err = lease.StartEmbedded(context.Background(), second)
	if !errors.Is(err, lease.ErrDataDirLocked) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), fmt.Sprint(os.Getpid())) {
		t.Fatalf("a second member on %s: %v", dir, err)
	}
	if waited := time.Since(start); waited > 10*time.Second {
		t.Fatalf("the refusal took %s", waited)
	}
	ctx, cancel := context.WithCancel(context.Background())
	second.LockTimeout = time.Hour
	time.AfterFunc(100*time.Millisecond, cancel)
	if _, err := lease.StartEmbedded(ctx, second); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled wait: %v", err)
	}
	m.Close()
	again, err := lease.StartEmbedded(context.Background(), second)
	if err != nil {
		t.Fatalf("after the first stopped: %v", err)
	}
	again.Close()
}

func put(t *testing.T, acc lease.ClientAccess, k, v string) {
	t.Helper()
	cli := client(t, acc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, k, v); err != nil {
		t.Fatal(err)
	}
}

func get(t *testing.T, acc lease.ClientAccess, k string) string {
	t.Helper()
	cli := client(t, acc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := cli.Get(ctx, k)
	if err != nil || len(r.Kvs) != 1 {
		t.Fatalf("get %s: %v %v", k, r, err)
	}
	return string(r.Kvs[0].Value)
}

func client(t *testing.T, acc lease.ClientAccess) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: acc.Endpoints, TLS: acc.TLS, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}
