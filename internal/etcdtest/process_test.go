package etcdtest

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/lease"
	"github.com/fcd-authz/fcd/record"
)

// TestProcessMember: the external member serves a store over the network
// and stops cleanly when its standard input closes — as it does when the
// test process that started it dies — so no member outlives its test. A
// port taken before the member binds it is reported as such, which is
// what StartProcess retries on.
func TestProcessMember(t *testing.T) {
	dir := t.TempDir()
	bin := BuildMember(t, dir)
	p, err := startProcess(t, bin, filepath.Join(dir, "member"), FreeAddr(t), FreeAddr(t), processOpts{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := lease.Open(ctx, lease.Config{Endpoints: p.Endpoints(), Prefix: "/process/",
		OpTimeout: time.Second, DialTimeout: time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("ping the external member: %v", err)
	}
	p.lifeline.Close()
	select {
	case <-p.exited:
	case <-time.After(time.Minute):
		t.Fatal("the external member did not stop when its stdin closed")
	}
	if !p.cmd.ProcessState.Success() {
		t.Fatalf("the external member stopped with %v", p.cmd.ProcessState)
	}
	if err := s.Ping(ctx); !errors.Is(err, record.ErrUnavailable) {
		t.Fatalf("ping after the member stopped: %v, want ErrUnavailable", err)
	}
	p.Kill() // harmless on a stopped member

	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	_, err = startProcess(t, bin, filepath.Join(dir, "busy"), busy.Addr().String(), FreeAddr(t), processOpts{})
	if err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("start on a busy port: %v, want address already in use", err)
	}
}
