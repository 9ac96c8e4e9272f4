package lease_test

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves goroutines behind: the stores' etcd clients (their keepalives, watches and the watch of a waiting Retire), the embedded members
// are all stopped by the tests that start them. No goroutine is
// ignored: the etcd server and client, gRPC and the HTTP servers all end
// their goroutines on Close.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(settled{m})
}

// settled runs the tests, then gives goroutines that are still winding
// down (a closed connection's reader, a member's last loop) up to 10s to
// end before goleak looks, which it does only for a few hundred
// milliseconds: a slow, shared machine must not fail the package. A
// goroutine that is still there after that is a leak.
type settled struct{ m *testing.M }

func (s settled) Run() int {
	code := s.m.Run()
	for deadline := time.Now().Add(10 * time.Second); goleak.Find() != nil && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	return code
}
