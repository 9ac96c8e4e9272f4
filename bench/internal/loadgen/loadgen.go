// Package loadgen holds the few helpers that the benchmark programs under
// bench/ (admission and gateway) share word for word: nearest-rank
// percentiles, throughput, millisecond conversion, the CPU model for the
// machine line, and a free loopback address. It exists so that both
// programs compute and print these the same way; each program keeps its
// own phase runner, since how they drive and account for operations differs.
package loadgen

import (
	"net"
	"os"
	"strings"
	"time"
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
