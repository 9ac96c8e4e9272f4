package main

import (
	"bytes"
	"context"
	"errors"
	"github.com/fcd-authz/fcd/bench/internal/loadgen"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestSmoke runs every design for a few operations at concurrency 2
// against a real embedded etcd and the full HTTP stack: the program works
// end to end (any non-200 admission or failed transaction is an error).
func TestSmoke(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	opts := options{Plan: loadgen.Plan{N: 20, N1: 20, Levels: []int{2}, Warmup: 4, Rounds: 2}, Designs: "abcde", Dir: t.TempDir()}
	if err := run(ctx, opts, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	for _, want := range []string{
		"# reproduce: go run ./bench/admission -n 20 -n1 20 -c 2 -rounds 2 -warmup 4 -dir ",
		"| 2 | a floor: bare etcd txn | 20 |",
		"| 2 | b authzd admit over HTTP | 20 |",
		"| 2 | c shared per-epoch record (CAS) | 20 |",
		"| 2 | d floor + 2 linearizable Gets first | 20 |",
		"| 2 | e floor + 2 serializable Gets first | 20 |",
		"| c | b/a throughput | b/c throughput |",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	// Admission makes two reads and one transaction, as counted by etcd.
	if !strings.Contains(out.String(), "| 2.00 Range + 1.00 Txn |") {
		t.Errorf("etcd RPC counts missing:\n%s", out.String())
	}
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"-n", "10", "-c", "1, 4"})
	if err != nil {
		t.Fatal(err)
	}
	if o.N != 10 || o.Ops(1) != 10 || !slices.Equal(o.Levels, []int{1, 4}) || o.WarmupOps(64) != 256 {
		t.Fatalf("options %+v", o)
	}
	for _, bad := range [][]string{{"-c", "0"}, {"-c", "x"}, {"-designs", "az"}, {"-n", "0"}, {"extra"}} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
}

// TestRunPhaseCountsFailures: a failed operation is counted, never timed.
func TestRunPhaseCountsFailures(t *testing.T) {
	p := runPhase(context.Background(), 4, 0, 100, func(_ context.Context, i int) (int, error) {
		if i%10 == 0 {
			return 1, errors.New("HTTP 503: boom")
		}
		return 0, nil
	})
	if p.failures != 10 || len(p.lat) != 90 || p.retries != 10 {
		t.Fatalf("failures %d, timed %d, retries %d", p.failures, len(p.lat), p.retries)
	}
	if s := p.samples(); len(s) != 1 || s[0] != "10x HTTP 503: boom" {
		t.Fatalf("samples %q", s)
	}
}
