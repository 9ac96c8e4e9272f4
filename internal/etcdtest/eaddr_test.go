package etcdtest

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/fcd-authz/fcd/lease"
)

// TestBusyPortIsRecognised: Start retries on fresh ports only if a port
// taken meanwhile is reported as EADDRINUSE through etcd's errors.
func TestBusyPortIsRecognised(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = lease.StartEmbedded(context.Background(), lease.EmbedConfig{
		Dir: filepath.Join(t.TempDir(), "etcd"), LogFile: filepath.Join(t.TempDir(), "log"),
		ClientURL: "http://" + l.Addr().String(), PeerURL: "http://" + FreeAddr(t),
	})
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("start on a busy port: %v (not EADDRINUSE)", err)
	}
	// And Start gets past a busy port.
	m := Start(t)
	if len(m.Endpoints()) != 1 {
		t.Fatal("no endpoint")
	}
}
