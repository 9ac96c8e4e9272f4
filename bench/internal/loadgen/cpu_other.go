//go:build !unix

package loadgen

import "time"

// ProcessCPU is not measured on this platform.
func ProcessCPU() time.Duration { return 0 }

// GroupCPU is not measured on this platform.
func GroupCPU(pgid int) time.Duration { return 0 }
