//go:build linux

package loadgen

import (
	"bytes"
	"os"
	"strconv"
	"time"
)

// clockTicks is the kernel's USER_HZ, the unit of /proc/<pid>/stat's CPU
// times: 100 on every Linux architecture Go supports.
const clockTicks = 100

// GroupCPU returns the CPU time (user + system) used so far by the live
// processes of process group pgid (an nginx master and its workers, run
// in a group of their own), read from /proc.
func GroupCPU(pgid int) time.Duration {
	dir, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	var ticks int64
	for _, e := range dir {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		// The fields after the command (which may hold spaces and
		// parentheses, so split after its last ')'): state ppid pgrp
		// session tty tpgid flags minflt cminflt majflt cmajflt utime
		// stime …
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(stat[i+1:])
		if len(f) < 13 {
			continue
		}
		if g, _ := strconv.Atoi(string(f[2])); g != pgid {
			continue
		}
		u, _ := strconv.ParseInt(string(f[11]), 10, 64)
		s, _ := strconv.ParseInt(string(f[12]), 10, 64)
		ticks += u + s
	}
	return time.Duration(ticks) * time.Second / clockTicks
}
