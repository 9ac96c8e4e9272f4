package fencecheck_test

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves goroutines behind: reporter
// workers, JWKS fetches, handlers cut off by the middleware's timeout.
// Idle keep-alive connections of HTTP clients are not leaks. Goroutines
// still winding down (a closed connection's reader) get up to 10 s to end
// first, so that a slow, shared machine does not fail the package. (The
// main module's internal/leaktest does the same; this module cannot
// import it.)
func TestMain(m *testing.M) {
	idle := []goleak.Option{
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
	}
	goleak.VerifyTestMain(settled{m, idle}, idle...)
}

// settled runs the tests, then waits until goleak finds nothing or 10 s
// have passed.
type settled struct {
	m    *testing.M
	opts []goleak.Option
}

func (s settled) Run() int {
	code := s.m.Run()
	for deadline := time.Now().Add(10 * time.Second); goleak.Find(s.opts...) != nil && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	return code
}
