// Package cmdtest runs fcd's commands in-process for their tests, as
// their run function, and collects what a command or a process writes
// while the test reads it.
package cmdtest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"regexp"
	"sync"
	"testing"
	"time"
)

// SyncBuffer is a bytes.Buffer safe for a command's or a process's
// writers and the test's readers.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// How long a command may take to print the line that says it is ready,
// and to return once stopped.
const (
	readyWait = 2 * time.Minute
	stopWait  = time.Minute
)

// Command is a command run in a goroutine of the test by Start.
type Command struct {
	// Name names the command in the test's messages.
	Name string
	// Stderr is what the command wrote to its stderr so far.
	Stderr *SyncBuffer

	cancel context.CancelFunc
	exited chan struct{}
	code   int // once exited is closed
	once   sync.Once
}

// Start runs run (a command's run function, given its stderr; it returns
// the exit status once ctx ends) in a goroutine until Stop or the end of
// the test, and waits for a line of its stderr matching ready. It returns
// the command and ready's first submatch. An error says that the command
// exited first (Stderr says why) or did not print the line within two
// minutes; the command is stopped then, and reporting that is the
// caller's.
func Start(t testing.TB, name string, ready *regexp.Regexp, run func(ctx context.Context, stderr io.Writer) int) (*Command, string, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &Command{Name: name, Stderr: &SyncBuffer{}, cancel: cancel, exited: make(chan struct{})}
	go func() {
		defer close(c.exited)
		c.code = run(ctx, c.Stderr)
	}()
	t.Cleanup(func() { c.Stop(t) })
	failed := func(err error) (*Command, string, error) {
		c.once.Do(func() {
			cancel()
			select {
			case <-c.exited:
			case <-time.After(stopWait):
			}
		})
		return c, "", err
	}
	deadline := time.After(readyWait)
	for {
		if m := ready.FindStringSubmatch(c.Stderr.String()); m != nil {
			return c, m[1], nil
		}
		select {
		case <-c.exited:
			if m := ready.FindStringSubmatch(c.Stderr.String()); m != nil {
				return c, m[1], nil
			}
			return failed(fmt.Errorf("%s exited %d before it was ready:\n%s", name, c.code, c.Stderr))
		case <-deadline:
			return failed(fmt.Errorf("%s not ready after %v:\n%s", name, readyWait, c.Stderr))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Stop ends the command's context, as SIGTERM would, and fails the test
// unless the command then returns 0 within a minute. Calling it again is
// harmless.
func (c *Command) Stop(t testing.TB) {
	t.Helper()
	c.once.Do(func() {
		c.cancel()
		select {
		case <-c.exited:
			if c.code != 0 {
				t.Errorf("%s exited %d when stopped:\n%s", c.Name, c.code, c.Stderr)
			}
		case <-time.After(stopWait):
			t.Errorf("%s did not return within %v of being stopped:\n%s", c.Name, stopWait, c.Stderr)
		}
	})
}
