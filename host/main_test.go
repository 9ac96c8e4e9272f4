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
