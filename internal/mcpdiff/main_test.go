package mcpdiff_test

import (
	"testing"

	"github.com/fcd-authz/fcd/internal/leaktest"
)

// TestMain fails the package if the SDK's server leaves goroutines behind:
// each stateless request must close its session before ServeHTTP returns,
// or the fuzz target would pile goroutines up input after input.
func TestMain(m *testing.M) {
	leaktest.VerifyTestMain(m)
}
