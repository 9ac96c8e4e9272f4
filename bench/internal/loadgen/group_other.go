//go:build unix && !linux

package loadgen

import "time"

// GroupCPU is not measured on this platform (no /proc).
func GroupCPU(pgid int) time.Duration { return 0 }
