package etcdtest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/lease"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// memberCommand is the package of the external member's command.
const memberCommand = "github.com/fcd-authz/fcd/internal/etcdtest/etcdmember"

// Process is one etcd member running in a separate OS process, owned by a
// test: an etcd that fcd reaches only over the network, as it reaches a
// production cluster.
type Process struct {
	endpoint string
	// bin and args start it again (Restart).
	bin  string
	args []string
	dir  string
	cmd  *exec.Cmd
	// lifeline is the write end of the member's stdin: closing it (or this
	// process dying) stops the member.
	lifeline *os.File
	exited   chan struct{}
	log      string
}

// BuildMember builds the etcdmember command (go build, so the build cache
// makes a rebuild cheap) into dir and returns the binary's path. It needs
// the go tool, which go test puts on the PATH of the tests it runs.
func BuildMember(t testing.TB, dir string) string {
	t.Helper()
	gotool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("etcdtest: the external member is built with the go tool, which is not on PATH: %v", err)
	}
	bin := filepath.Join(dir, "etcdmember")
	cmd := exec.Command(gotool, "build", "-o", bin, memberCommand)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("etcdtest: go build %s: %v\n%s", memberCommand, err, out)
	}
	return bin
}

// StartProcess builds the etcdmember command and starts it as a separate
// process: a single-node member on free loopback ports with its data in a
// temporary directory. It returns once the member answers a linearizable
// read; the process is killed when the test ends.
func StartProcess(t testing.TB) *Process {
	t.Helper()
	dir := t.TempDir()
	bin := BuildMember(t, dir)
	var err error
	for attempt := 0; attempt < 8; attempt++ {
		var p *Process
		addrs := FreeAddrs(t, 2)
		p, err = startProcess(t, bin, filepath.Join(dir, fmt.Sprint("try", attempt)), addrs[0], addrs[1], processOpts{})
		if err == nil {
			return p
		}
		// A port found free can be taken before the member binds it:
		// try again on fresh ports.
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	t.Fatalf("etcdtest: start external member: %v", err)
	return nil
}

// startProcess starts the member bin with its data in dir, serving
// clients and peers on the given loopback addresses.
func startProcess(t testing.TB, bin, dir, clientAddr, peerAddr string, o processOpts) (*Process, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	client, peer := "http://"+clientAddr, "http://"+peerAddr
	logPath := filepath.Join(dir, "member.log")
	args := []string{
		"-name", cmp.Or(o.name, "external"),
		"-data-dir", filepath.Join(dir, "data"),
		"-listen-client-urls", client,
		"-listen-peer-urls", peer,
		"-log-outputs", "stderr",
		"-exit-with-stdin",
	}
	if o.initialCluster != "" {
		args = append(args, "-initial-cluster", o.initialCluster)
	}
	p := &Process{endpoint: client, bin: bin, args: args, dir: dir, log: logPath}
	if err := p.exec(); err != nil {
		return nil, err
	}
	if o.noWait {
		t.Cleanup(p.Kill)
		return p, nil
	}
	if err := p.waitReady(time.Minute); err != nil {
		p.Kill()
		return nil, fmt.Errorf("%w\nmember log:\n%s", err, p.logTail())
	}
	t.Cleanup(p.Kill)
	return p, nil
}

// waitReady polls the member with linearizable reads until one succeeds,
// the process exits or d passes.
func (p *Process) waitReady(d time.Duration) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: p.Endpoints(), DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err = cli.Get(ctx, "etcdtest-ready")
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("external member not answering after %s: %w", d, err)
		}
		select {
		case <-p.exited:
			return errors.New("external member exited before answering")
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (p *Process) logTail() string {
	b, _ := os.ReadFile(p.log)
	const max = 4000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

// Endpoints returns the member's client URLs.
func (p *Process) Endpoints() []string { return []string{p.endpoint} }

// Pid is the member's process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Kill kills the member process and waits until it is gone. Killing twice
// is harmless.
func (p *Process) Kill() {
	p.lifeline.Close()
	p.cmd.Process.Signal(syscall.SIGCONT) // a frozen member dies all the same
	p.cmd.Process.Kill()
	<-p.exited
}

// exec starts the member's process with its arguments, its output
// appended to its log.
func (p *Process) exec() error {
	logFile, err := os.OpenFile(p.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logFile.Close() // the child has its own descriptor
	stdin, lifeline, err := os.Pipe()
	if err != nil {
		return err
	}
	defer stdin.Close()
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, logFile, logFile
	if err := cmd.Start(); err != nil {
		lifeline.Close()
		return fmt.Errorf("start %s: %w", p.bin, err)
	}
	p.cmd, p.lifeline, p.exited = cmd, lifeline, make(chan struct{})
	exited := p.exited
	go func() {
		cmd.Wait()
		close(exited)
	}()
	return nil
}

// Restart kills the member and starts it again on its data and ports,
// returning once it answers (a member of a cluster: once the cluster
// has a quorum).
func (p *Process) Restart() error {
	p.Kill()
	if err := p.exec(); err != nil {
		return err
	}
	return p.waitReady(time.Minute)
}

// Freeze stops the member process (SIGSTOP): its connections stay open
// and nothing answers on them — a member stalled on its disk, or a VM
// paused — until Thaw.
func (p *Process) Freeze() {
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		panic(fmt.Sprintf("etcdtest: freeze: %v", err))
	}
}

// Thaw resumes a frozen member (SIGCONT).
func (p *Process) Thaw() {
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		panic(fmt.Sprintf("etcdtest: thaw: %v", err))
	}
}

// processOpts are a member's place in a cluster.
type processOpts struct {
	name, initialCluster string
	// noWait returns at once: a member of a new cluster answers only once
	// a quorum of its members runs.
	noWait bool
}

// StartProcessCluster starts an n-member cluster, each member in a process
// of its own on free loopback ports, and returns once it answers
// linearizable reads through every member.
func StartProcessCluster(t testing.TB, n int) []*Process {
	t.Helper()
	dir := t.TempDir()
	bin := BuildMember(t, dir)
	for attempt := 0; attempt < 8; attempt++ {
		addrs := FreeAddrs(t, 2*n)
		var initial []string
		for i := range n {
			initial = append(initial, fmt.Sprintf("m%d=http://%s", i, addrs[2*i+1]))
		}
		var ps []*Process
		var err error
		for i := range n {
			var p *Process
			p, err = startProcess(t, bin, filepath.Join(dir, fmt.Sprintf("try%d-m%d", attempt, i)), addrs[2*i], addrs[2*i+1],
				processOpts{name: fmt.Sprint("m", i), initialCluster: strings.Join(initial, ","), noWait: true})
			if err != nil {
				break
			}
			ps = append(ps, p)
		}
		for _, p := range ps {
			if err == nil {
				err = p.waitReady(time.Minute)
			}
		}
		if err == nil {
			return ps
		}
		for _, p := range ps {
			p.Kill()
		}
		busy := strings.Contains(err.Error(), "address already in use")
		for _, p := range ps {
			busy = busy || strings.Contains(p.logTail(), "address already in use")
		}
		if !busy {
			t.Fatalf("etcdtest: start a %d-member cluster: %v", n, err)
		}
	}
	t.Fatalf("etcdtest: start a %d-member cluster: ports kept being taken", n)
	return nil
}

// ClusterEndpoints returns the client URLs of members.
func ClusterEndpoints(ps []*Process) []string {
	var eps []string
	for _, p := range ps {
		eps = append(eps, p.endpoint)
	}
	return eps
}

// Store opens a store on the member (as Member.Store does); closed at
// test end.
func (p *Process) Store(t testing.TB, prefix string) *lease.Store {
	t.Helper()
	return OpenStore(t, p.Endpoints(), prefix)
}

// OpenStore opens a store on endpoints (of a member, a process or a
// cluster) with a 5s operation timeout; it is closed when the test ends.
func OpenStore(t testing.TB, endpoints []string, prefix string) *lease.Store {
	t.Helper()
	s, err := lease.Open(context.Background(), lease.Config{
		Endpoints: endpoints, Prefix: prefix, OpTimeout: 5 * time.Second, WriteTimeout: 2 * time.Second, DialTimeout: 2 * time.Second,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatalf("etcdtest: open store: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
