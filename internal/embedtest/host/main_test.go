// Package host_test runs the host library (the module
// github.com/fcd-authz/fcd/host) against real stacks: authzd as it ships,
// embedded etcd, nginx and fencecheck in front of the MCP fixtures. These
// tests assemble the server from this module's packages, so they live
// here: the host module's go.mod must not require this module, or an MCP
// host embedding the library would take part in its whole version
// selection (etcd, OPA, Cedar, gRPC). `go test ./host/...` runs what the
// host module holds itself.
package host_test

import (
	"testing"

	"github.com/fcd-authz/fcd/internal/leaktest"
)

// TestMain fails the package if a test leaves goroutines behind: a call
// still waiting for approval, an SSE reader of a session not closed.
// Idle keep-alive connections of http.DefaultClient are not leaks.
func TestMain(m *testing.M) {
	leaktest.VerifyTestMain(m, leaktest.IgnoreIdleHTTP()...)
}
