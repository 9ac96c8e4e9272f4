//go:build unix

package loadgen

import (
	"syscall"
	"time"
)

// ProcessCPU returns the CPU time (user + system) this process has used:
// the load generator, the HTTP server, authzd and etcd together.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
