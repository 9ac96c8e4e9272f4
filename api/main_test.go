package api_test

import (
	"testing"

	"github.com/fcd-authz/fcd/internal/leaktest"
)

// TestMain fails the package if a test leaves goroutines behind: the HTTP
// and gRPC servers and clients, the token issuer's key publisher, the
// stores' etcd clients and the embedded members are all stopped by the
// tests that start them. No goroutine is ignored: the etcd server and
// client, gRPC and the HTTP servers all end their goroutines on Close.
func TestMain(m *testing.M) {
	leaktest.VerifyTestMain(m)
}
