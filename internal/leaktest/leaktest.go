// Package leaktest is the TestMain of fcd's test packages that must not
// leave goroutines behind: goleak, after the goroutines that are still
// winding down have had time to end.
package leaktest

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// settle is how long the goroutines still there after the tests get to
// end before goleak looks.
const settle = 10 * time.Second

// VerifyTestMain runs m's tests, then fails the package if goroutines
// other than those opts ignore are left behind. goleak itself looks only
// for a few hundred milliseconds; goroutines that are still winding down
// (a closed connection's reader, an etcd member's last loop) get up to 10s
// first, so that a slow, shared machine does not fail the package. A
// goroutine that is still there after that is a leak.
func VerifyTestMain(m *testing.M, opts ...goleak.Option) {
	goleak.VerifyTestMain(settled{m, opts}, opts...)
}

// IgnoreIdleHTTP ignores the idle keep-alive connections of HTTP clients
// (http.DefaultClient's among them): they are not leaks.
func IgnoreIdleHTTP() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
	}
}

// settled runs the tests, then waits until goleak finds nothing or settle
// has passed.
type settled struct {
	m    *testing.M
	opts []goleak.Option
}

func (s settled) Run() int {
	code := s.m.Run()
	for deadline := time.Now().Add(settle); goleak.Find(s.opts...) != nil && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	return code
}

// Goroutines returns the stack of every goroutine now, by goroutine id:
// for a test that looks for a goroutine of its own by name while others
// run.
func Goroutines() map[string]string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	out := map[string]string{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		id, _, _ := strings.Cut(strings.TrimPrefix(g, "goroutine "), " ")
		out[id] = g
	}
	return out
}
