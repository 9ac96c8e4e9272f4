package loadgen

import (
	"flag"
	"io"
	"slices"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	var hundred []time.Duration
	for i := 1; i <= 100; i++ {
		hundred = append(hundred, time.Duration(i))
	}
	for _, tc := range []struct {
		name   string
		sorted []time.Duration
		q      float64
		want   time.Duration
	}{
		{"empty", nil, .5, 0},
		{"one", []time.Duration{7}, .99, 7},
		{"p50", hundred, .50, 50},
		{"p95", hundred, .95, 95},
		{"p99", hundred, .99, 99},
		{"max", hundred, 1, 100},
		{"min", hundred, 0, 1},
		{"p50 of 3", []time.Duration{1, 2, 3}, .50, 2},
	} {
		if got := Percentile(tc.sorted, tc.q); got != tc.want {
			t.Errorf("%s: Percentile(q=%v) = %v, want %v", tc.name, tc.q, got, tc.want)
		}
	}
}

func TestRateAndMS(t *testing.T) {
	for _, tc := range []struct {
		n    int
		wall time.Duration
		want float64
	}{
		{0, time.Second, 0},
		{10, 0, 0},
		{10, -time.Second, 0},
		{100, 2 * time.Second, 50},
	} {
		if got := Rate(tc.n, tc.wall); got != tc.want {
			t.Errorf("Rate(%d, %v) = %v, want %v", tc.n, tc.wall, got, tc.want)
		}
	}
	if got := MS(1500 * time.Microsecond); got != 1.5 {
		t.Errorf("MS = %v", got)
	}
}

func TestPlan(t *testing.T) {
	p := Plan{N1: 10, N: 100, Rounds: 2, MinWarmup: 50}
	if err := p.SetLevels("1, 16,64"); err != nil {
		t.Fatal(err)
	}
	if p.LevelList() != "1,16,64" || p.Ops(1) != 10 || p.Ops(16) != 100 || p.WarmupOps(1) != 50 || p.WarmupOps(64) != 256 {
		t.Fatalf("plan %+v: list %q ops %d/%d warm-up %d/%d", p, p.LevelList(), p.Ops(1), p.Ops(16), p.WarmupOps(1), p.WarmupOps(64))
	}
	if err := p.Check("-n1, -n"); err != nil {
		t.Fatal(err)
	}
	p.Warmup = 7
	if p.WarmupOps(64) != 7 {
		t.Fatalf("explicit warm-up: %d", p.WarmupOps(64))
	}
	for _, bad := range []string{"", "0", "1,x", "-4"} {
		if err := (&Plan{}).SetLevels(bad); err == nil {
			t.Errorf("SetLevels(%q) accepted", bad)
		}
	}
	for _, bad := range []Plan{{N1: 1, N: 1, Rounds: 1}, {Levels: []int{1}, N: 1, Rounds: 1}, {Levels: []int{1}, N1: 1, N: 1}, {Levels: []int{1}, N1: 1, N: 1, Rounds: 1, Warmup: -1}} {
		if err := bad.Check("-n1, -n"); err == nil {
			t.Errorf("Check(%+v) accepted", bad)
		}
	}
}

func TestPlanFlags(t *testing.T) {
	p := Plan{MinWarmup: 50}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.IntVar(&p.N, "n", 10, "")
	if err := p.ParseFlags(fs, []string{"-c", "1, 8", "-warmup", "3"}, "1,32", "calls"); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.Levels, []int{1, 8}) || p.Rounds != 4 || p.Warmup != 3 || p.N != 10 {
		t.Fatalf("plan %+v", p)
	}
	if got := p.Flags(); got != "-c 1,8 -rounds 4 -warmup 3" {
		t.Fatalf("Flags() = %q", got)
	}
	for _, bad := range [][]string{{"-c", "0"}, {"-rounds", "x"}, {"extra"}} {
		q := Plan{}
		fs := flag.NewFlagSet("bench", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		if err := q.ParseFlags(fs, bad, "1", "calls"); err == nil {
			t.Errorf("ParseFlags(%q) accepted", bad)
		}
	}
}
