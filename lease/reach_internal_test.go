package lease

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
)

// TestDialReason: the reason logged for an etcd endpoint that does not
// answer is the network's, for real endpoints of each kind.
func TestDialReason(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()
	sock := filepath.Join(t.TempDir(), "etcd.sock")
	for _, tc := range []struct{ endpoint, want string }{
		{"http://" + ln.Addr().String(), "accepts connections, but etcd did not answer"},
		{ln.Addr().String(), "accepts connections"},
		{"http://" + closedAddr, "connection refused"},
		{"https://no-such-host.invalid:2379", "cannot resolve no-such-host.invalid"},
		{"unix://" + sock, "no such file or directory"},
	} {
		if got := dialReason(context.Background(), tc.endpoint); !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.endpoint, got, tc.want)
		}
	}
	r := &reachability{endpoints: []string{"http://" + closedAddr}}
	if got := r.explain(context.Background()); !strings.Contains(got, "http://"+closedAddr+": connection refused") {
		t.Errorf("explain = %q", got)
	}
}
