package lease_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/lease"
)

// TestEmbeddedMemberReportsItsFailure: a member whose server stops by
// itself says so on Failed, for authzd to log and exit with; a member
// closed on purpose reports nothing.
func TestEmbeddedMemberReportsItsFailure(t *testing.T) {
	start := func() *lease.Embedded {
		m, err := lease.StartEmbedded(context.Background(), lease.EmbedConfig{Dir: filepath.Join(t.TempDir(), "etcd"), LogFile: filepath.Join(t.TempDir(), "etcd.log")})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	m := start()
	lease.StopServerForTest(m)
	select {
	case err := <-m.Failed():
		if err == nil || !strings.Contains(err.Error(), "stopped by itself") {
			t.Errorf("Failed delivered %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a stopped member did not report it")
	}
	m.Close()

	m = start()
	failed := m.Failed()
	m.Close()
	select {
	case err := <-failed:
		t.Errorf("a member closed on purpose reported %v", err)
	case <-time.After(200 * time.Millisecond):
	}
}
