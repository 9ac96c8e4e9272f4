// Package testutil holds what tests of many packages share and is too
// small for a package of its own: Eventually, the one polling wait.
package testutil

import (
	"testing"
	"time"
)

// poll is how often Eventually checks its condition.
const poll = 10 * time.Millisecond

// Eventually checks cond every few milliseconds until it is true, and
// fails t (Fatal) if it is still false after timeout, saying what it was
// waiting for. Give timeouts generous for a slow shared machine: a passing
// test waits only as long as cond takes. Call it from the test's own
// goroutine.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(poll)
	}
}
