package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestSmoke runs the program small against a real embedded etcd and the
// full HTTP stack: it works end to end (a failed admission or listing is
// an error) and prints every table.
func TestSmoke(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	opts := options{N: 200, Listers: 2, Limit: 30, Status: "pending_approval", Admit: 20, Dir: t.TempDir()}
	if err := run(ctx, opts, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	for _, want := range []string{
		"## etcd size per formation (compacted)", "| 200 | ",
		"## 2 parallel listings of 200 formations (limit=30, status=\"pending_approval\")",
		"| 200 | ", // each lister lists the 100 pending ones
		"| alone | 20 | 0 |",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestParseFlags(t *testing.T) {
	for _, args := range [][]string{{"-n", "1"}, {"-limit", "1001"}, {"-c", "0"}, {"-admit", "0"}} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("parseFlags(%v) accepted", args)
		}
	}
	if o, err := parseFlags(nil); err != nil || o.N != 100000 || o.Listers != 16 || o.Limit != 1000 {
		t.Fatalf("defaults: %+v, %v", o, err)
	}
}
