package api_test

import (
	"net/http"
	"testing"

	"github.com/fcd-authz/fcd/internal/leaktest"
)

// TestMain fails the package if a test leaves goroutines behind: the HTTP
// and gRPC servers and clients, the token issuer's key publisher, the
// stores' etcd clients and the embedded members are all stopped by the
// tests that start them. No goroutine is ignored: the etcd server and
// client, gRPC and the HTTP servers all end their goroutines on Close.
//
// Every answer of a server a test watches (oasWatch) is validated against
// api/openapi.yaml on its way through http.DefaultTransport.
func TestMain(m *testing.M) {
	http.DefaultTransport = oasTransport{next: http.DefaultTransport}
	leaktest.VerifyTestMain(m)
}
