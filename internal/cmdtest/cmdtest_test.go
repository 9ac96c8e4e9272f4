package cmdtest

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"strings"
	"testing"
)

var ready = regexp.MustCompile(`ready at (\S+)`)

func TestStartWaitsForTheReadyLine(t *testing.T) {
	stopped := make(chan struct{})
	c, addr, err := Start(t, "cmd", ready, func(ctx context.Context, stderr io.Writer) int {
		fmt.Fprintln(stderr, "starting")
		fmt.Fprintln(stderr, "ready at 127.0.0.1:1")
		<-ctx.Done()
		close(stopped)
		return 0
	})
	if err != nil || addr != "127.0.0.1:1" {
		t.Fatalf("Start: %q, %v", addr, err)
	}
	c.Stop(t)
	<-stopped
	c.Stop(t) // again: nothing happens
}

func TestStartReportsAnEarlyExit(t *testing.T) {
	c, _, err := Start(t, "cmd", ready, func(ctx context.Context, stderr io.Writer) int {
		fmt.Fprintln(stderr, "bad flag")
		return 2
	})
	if err == nil || !strings.Contains(err.Error(), "cmd exited 2 before it was ready:\nbad flag") {
		t.Fatalf("Start: %v", err)
	}
	if c.Stderr.String() != "bad flag\n" {
		t.Fatalf("stderr %q", c.Stderr)
	}
}
