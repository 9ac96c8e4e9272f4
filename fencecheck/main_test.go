package fencecheck_test

import (
	"testing"

	"github.com/fcd-authz/fcd/internal/leaktest"
)

// TestMain fails the package if a test leaves goroutines behind: reporter
// workers, JWKS fetches, handlers cut off by the middleware's timeout.
// Idle keep-alive connections of http.DefaultClient are not leaks.
func TestMain(m *testing.M) {
	leaktest.VerifyTestMain(m, leaktest.IgnoreIdleHTTP()...)
}
