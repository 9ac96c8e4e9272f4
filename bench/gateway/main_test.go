package main

import (
	"bytes"
	"context"
	"github.com/fcd-authz/fcd/bench/internal/loadgen"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fcd-authz/fcd/internal/gatewayconf"
)

// TestSmoke runs both designs for a few calls at concurrency 1 and 4
// through real nginx, a real authzd on embedded etcd, fencecheck and the
// github v1.4 fixture: the program works end to end (run fails on any
// failed call, any missing effect or outcome report).
func TestSmoke(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	opts := options{Plan: loadgen.Plan{N1: 6, N: 12, Levels: []int{1, 4}, Rounds: 2, Warmup: 2}, Dir: t.TempDir()}
	if err := run(ctx, opts, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	for _, want := range []string{
		"# reproduce: go run ./bench/gateway -n1 6 -n32 12 -c 1,4 -rounds 2 -warmup 2 -dir ",
		"# machine: ",
		"| 1 | A nginx + fcd (forward-auth admission + fencecheck claiming the lease) | 6 |",
		"| 1 | A0 nginx + fcd, fence offline (no claim, no report) | 6 |",
		"| 1 | B nginx, no fcd (auth_basic kept) | 6 |",
		"| 1 | B0 nginx, no fcd, no client authentication | 6 |",
		"| 4 | A nginx + fcd (forward-auth admission + fencecheck claiming the lease) | 12 |",
		"| 4 | A0 nginx + fcd, fence offline (no claim, no report) | 12 |",
		"| 4 | B nginx, no fcd (auth_basic kept) | 12 |",
		"| 4 | B0 nginx, no fcd, no client authentication | 12 |",
		"| 1 | AF A, each call formed over REST inside the timed call | 6 |",
		"| 4 | AF A, each call formed over REST inside the timed call | 12 |",
		"| 4 | AF/B: fcd with the host's formation, against the same gateway without fcd | ",
		"| 4 | AF/A: the formation's cost (policy decision + etcd write) on top of A | ",
		"| c | design | ops | ops/s | p50 ms | p95 ms | p99 ms | CPU ms/op | etcd KV RPCs/op |",
		"| c | comparison | throughput ratio | ratio, report drain excluded | added p50 ms | added p95 ms |",
		"| 1 | A/B: what fcd adds to a gateway that authenticates its clients | ",
		"| 4 | A/B0: what fcd and the examples' client authentication add | ",
		"| 4 | A/A0: the lease claim's cost (claim round trip + etcd txn, and the outcome report) | ",
		"# c=4: report drain after the last call, counted in the design's time: A ",
		"| 4 | AT A, authzd keeping the audit trail | 12 |",
		"| 4 | AT/A: the audit trail's cost (admission, claim and outcome recorded) | ",
		"# audit trail of AT's authzd: ", "events (want 88 calls' and at most 8 of setup)",
		"# fixture effects: 88 under a lease (A, AT, AF and A0, want 88), 44 without (B and B0, want 44); leases claimed in authzd: 66 (A, AT and AF, want 66); outcome reports sent to authzd: 66",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.Ops(1) != 300 || o.Ops(32) != 2000 || !slices.Equal(o.Levels, []int{1, 32}) || o.WarmupOps(32) != 128 || o.WarmupOps(1) != 50 {
		t.Fatalf("defaults %+v", o)
	}
	if got := o.command(); got != "go run ./bench/gateway -n1 300 -n32 2000 -c 1,32 -rounds 4" {
		t.Fatalf("command %q", got)
	}
	for _, bad := range [][]string{{"-c", "0"}, {"-c", "x"}, {"-n1", "0"}, {"-rounds", "0"}, {"extra"}} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
}

// TestPlainConfig: design B's nginx.conf has no trace of fcd and
// authenticates the client; design B0's (no users) does not.
func TestPlainConfig(t *testing.T) {
	d, err := gatewaysData()
	if err != nil {
		t.Fatal(err)
	}
	b0 := d
	b0.Users = nil
	bare, err := renderPlain(b0)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(bare, []byte("auth_basic")) {
		t.Errorf("B0's nginx.conf authenticates:\n%s", bare)
	}
	text, err := renderPlain(d)
	if err != nil {
		t.Fatal(err)
	}
	for _, absent := range []string{"auth_request", "forward_auth", "Fcd-", "fcd_authzd", "Bearer"} {
		if bytes.Contains(text, []byte(absent)) {
			t.Errorf("plain nginx.conf contains %q:\n%s", absent, text)
		}
	}
	for _, present := range []string{"auth_basic_user_file fcd-users;", "listen 127.0.0.1:8080;", "server 127.0.0.1:9001;", "proxy_pass http://fcd_pool_github-v1-4;", "keepalive 16;"} {
		if !bytes.Contains(text, []byte(present)) {
			t.Errorf("plain nginx.conf lacks %q:\n%s", present, text)
		}
	}
}

func gatewaysData() (gatewayconf.Data, error) {
	d, err := gatewayconf.NewData("127.0.0.1:8080", "http://127.0.0.1:7070", "cred", map[string]string{poolV14: "http://127.0.0.1:9001"}, poolV14)
	d.Users = []gatewayconf.User{{Name: "alice", Hash: "$2y$04$abcdefghijklmnopqrstuu5qrpJ0CSlPGVsdMqGJSUaqxL6vsbN7u"}}
	return d, err
}
