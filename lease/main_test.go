package lease_test

import (
	"testing"

	"github.com/fcd-authz/fcd/internal/leaktest"
)

// TestMain fails the package if a test leaves goroutines behind: the
// stores' etcd clients (their keepalives, watches and the watch of a
// waiting Retire), the embedded members are all stopped by the tests that
// start them. No goroutine is ignored: the etcd server and client, gRPC
// and the HTTP servers all end their goroutines on Close.
func TestMain(m *testing.M) {
	leaktest.VerifyTestMain(m)
}
