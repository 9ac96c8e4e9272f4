// Package testutil holds what tests of many packages share and is too
// small for a package of its own: Eventually and its variants, the one
// polling wait of the server module's tests.
//
// A wait is a bound for a slow shared machine, never an assertion of
// timing: a passing test waits only as long as its condition takes, so
// give timeouts generously. Call these from the test's own goroutine (they
// end the test with Fatal).
package testutil

import (
	"fmt"
	"testing"
	"time"
)

// The condition is checked first at once, then after firstPoll, each
// pause twice the last, up to maxPoll: a quick condition is seen at once,
// and a long wait does not spin.
const (
	firstPoll = 5 * time.Millisecond
	maxPoll   = 100 * time.Millisecond
)

// Eventually checks cond until it is true, and fails t (Fatal) if it is
// still false after timeout, saying what it was waiting for.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	wait(t, timeout, what, cond, nil)
}

// EventuallyState is Eventually for a condition on some state: if cond
// is still false after timeout, the failure shows state() as well (%v),
// read after cond's last check — the state the test last saw.
func EventuallyState[T any](t testing.TB, timeout time.Duration, what string, cond func() bool, state func() T) {
	t.Helper()
	wait(t, timeout, what, cond, func() string { return fmt.Sprintf("last state: %v", state()) })
}

// Await calls try until it returns a nil error and returns its value; if
// try still fails after timeout, Await fails t, saying what it was
// waiting for and try's last error. It suits a call retried until it
// works (etcd back after an outage) and a read retried until it shows a
// state (its error saying what it showed instead).
func Await[T any](t testing.TB, timeout time.Duration, what string, try func() (T, error)) T {
	t.Helper()
	var v T
	var err error
	wait(t, timeout, what, func() bool { v, err = try(); return err == nil },
		func() string { return fmt.Sprintf("last error: %v", err) })
	return v
}

// wait polls done; last, when not nil, describes the last check for the
// failure.
func wait(t testing.TB, timeout time.Duration, what string, done func() bool, last func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for pause := firstPoll; !done(); pause = min(2*pause, maxPoll) {
		if time.Now().After(deadline) {
			msg := fmt.Sprintf("timed out after %s waiting for %s", timeout, what)
			if last != nil {
				msg += "; " + last()
			}
			t.Fatal(msg)
		}
		time.Sleep(pause)
	}
}
