package testutil

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fatalTB records the message of Fatal and stops the wait as Fatal would.
type fatalTB struct {
	testing.TB
	msg string
}

type stopped struct{}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatal(args ...any) {
	f.msg = args[0].(string)
	panic(stopped{})
}

// failure runs wait with a fatalTB and returns the message it failed
// with ("" when it returned).
func failure(t *testing.T, wait func(testing.TB)) (msg string) {
	f := &fatalTB{TB: t}
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(stopped); !ok {
				panic(r)
			}
			msg = f.msg
		}
	}()
	wait(f)
	return ""
}

func TestEventually(t *testing.T) {
	n := 0
	if msg := failure(t, func(tb testing.TB) { Eventually(tb, time.Minute, "three checks", func() bool { n++; return n == 3 }) }); msg != "" || n != 3 {
		t.Errorf("a condition met on the third check: %q after %d checks", msg, n)
	}
	msg := failure(t, func(tb testing.TB) { Eventually(tb, 20*time.Millisecond, "never", func() bool { return false }) })
	if msg != "timed out after 20ms waiting for never" {
		t.Errorf("a condition never met: %q", msg)
	}
}

func TestEventuallyStateShowsTheLastState(t *testing.T) {
	n := 0
	msg := failure(t, func(tb testing.TB) {
		EventuallyState(tb, 20*time.Millisecond, "n to be negative", func() bool { n++; return n < 0 }, func() []int { return []int{n} })
	})
	if want := "timed out after 20ms waiting for n to be negative; last state: ["; !strings.HasPrefix(msg, want) || !strings.HasSuffix(msg, "]") {
		t.Errorf("failure %q, want %q and the last n", msg, want)
	}
	if !strings.Contains(msg, "["+strconv.Itoa(n)+"]") {
		t.Errorf("failure %q does not show the state after the last check (n = %d)", msg, n)
	}
}

func TestAwait(t *testing.T) {
	n := 0
	var got int
	msg := failure(t, func(tb testing.TB) {
		got = Await(tb, time.Minute, "the third try", func() (int, error) {
			if n++; n < 3 {
				return 0, errors.New("not yet")
			}
			return 42, nil
		})
	})
	if msg != "" || got != 42 {
		t.Errorf("a try that works the third time: %q, value %d", msg, got)
	}
	msg = failure(t, func(tb testing.TB) {
		Await(tb, 20*time.Millisecond, "a working try", func() (int, error) { return 0, errors.New("status 503") })
	})
	if msg != "timed out after 20ms waiting for a working try; last error: status 503" {
		t.Errorf("a try that never works: %q", msg)
	}
}
