// Package loadgen holds the few helpers that the benchmark programs under
// bench/ (admission and gateway) share word for word: nearest-rank
// percentiles, throughput, millisecond conversion, the CPU model for the
// machine line, a free loopback address, and the plan of levels and
// operation counts their flags describe, with the flags they share. It
// exists so that both programs compute and print these the same way;
// each program keeps its own phase runner, since how they drive and
// account for operations differs.
package loadgen

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Percentile returns the nearest-rank q-quantile of sorted durations; 0 if
// there are none.
func Percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*q+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// Rate is n operations over wall time, per second; 0 if wall is not positive.
func Rate(n int, wall time.Duration) float64 {
	if wall <= 0 {
		return 0
	}
	return float64(n) / wall.Seconds()
}

// MS converts d to (fractional) milliseconds.
func MS(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// CPUModel is the first "model name" of /proc/cpuinfo, or "cpu unknown".
func CPUModel() string {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "cpu unknown"
	}
	for line := range strings.Lines(string(data)) {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "cpu unknown"
}

// FreeAddr returns a loopback TCP address that was free a moment ago.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// Plan is what a benchmark program times, from the flags both programs
// share: at each concurrency level, how many operations per design (N1 at
// concurrency 1, where a disk-bound run is slow, N elsewhere), split into
// rounds of alternating design order, after how many untimed ones.
type Plan struct {
	Levels []int
	N1, N  int
	Rounds int
	// Warmup is the number of untimed operations per design before each
	// level; 0 means max(MinWarmup, 4c).
	Warmup    int
	MinWarmup int
}

// Ops is the number of timed operations per design at concurrency c.
func (p *Plan) Ops(c int) int {
	if c == 1 {
		return p.N1
	}
	return p.N
}

// WarmupOps is the number of untimed operations per design before the
// level of concurrency c.
func (p *Plan) WarmupOps(c int) int {
	if p.Warmup > 0 {
		return p.Warmup
	}
	return max(p.MinWarmup, 4*c)
}

// LevelList is the levels as the -c flag takes them ("1,16,64").
func (p *Plan) LevelList() string {
	cs := make([]string, len(p.Levels))
	for i, c := range p.Levels {
		cs[i] = strconv.Itoa(c)
	}
	return strings.Join(cs, ",")
}

// SetLevels parses a -c value: positive integers, comma-separated.
func (p *Plan) SetLevels(s string) error {
	p.Levels = nil
	for f := range strings.SplitSeq(s, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || c < 1 {
			return fmt.Errorf("-c: %q is not a positive integer", f)
		}
		p.Levels = append(p.Levels, c)
	}
	return nil
}

// ParseFlags binds the flags both programs share to p — -c, the
// concurrency levels (default levels); -rounds (default 4); -warmup, in
// units of the program's operation ("operations", "calls") — then parses
// args with fs, where the program bound its own flags and those of p.N1
// and p.N. It refuses positional arguments and sets p.Levels from -c.
func (p *Plan) ParseFlags(fs *flag.FlagSet, args []string, levels, unit string) error {
	c := fs.String("c", levels, "concurrency levels, comma-separated")
	fs.IntVar(&p.Rounds, "rounds", 4, "rounds per level, alternating the order of the designs")
	fs.IntVar(&p.Warmup, "warmup", 0, fmt.Sprintf("untimed %s per design before each level (0: max(%d, 4c))", unit, p.MinWarmup))
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return p.SetLevels(*c)
}

// Flags is the shared flags of the plan as a command line reproducing it
// takes them: "-c 1,16,64 -rounds 4", then -warmup if it was set.
func (p *Plan) Flags() string {
	s := fmt.Sprintf("-c %s -rounds %d", p.LevelList(), p.Rounds)
	if p.Warmup > 0 {
		s += fmt.Sprintf(" -warmup %d", p.Warmup)
	}
	return s
}

// Check reports a plan that cannot run; nFlags names the flags of N1 and
// N for the message (e.g. "-n1 and -n").
func (p *Plan) Check(nFlags string) error {
	switch {
	case len(p.Levels) == 0:
		return errors.New("no concurrency level")
	case p.N < 1 || p.N1 < 1 || p.Rounds < 1 || p.Warmup < 0:
		return fmt.Errorf("%s and -rounds must be positive, -warmup not negative", nFlags)
	}
	return nil
}

// KVRPCs returns etcd's count of handled KV gRPC calls by method (Range,
// Txn, Put, ...), from the member's Prometheus counters in this process.
func KVRPCs() map[string]float64 {
	out := map[string]float64{}
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		return out
	}
	for _, mf := range mfs {
		if mf.GetName() != "grpc_server_handled_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var service, method string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "grpc_service":
					service = l.GetValue()
				case "grpc_method":
					method = l.GetValue()
				}
			}
			if service == "etcdserverpb.KV" {
				out[method] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}
