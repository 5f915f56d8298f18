// Package hoststat measures the machine around a benchmark window: the CPU time
// every process used (from /proc/stat) and the benchmark process's own (the
// in-process Kafka broker, the consumer, the load generator), so that what
// processes outside the benchmark took can be reported. On a shared machine
// that share explains most of the run-to-run variance.
package hoststat

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTick is the unit of /proc/stat (USER_HZ).
const clockTick = 10 * time.Millisecond

// Snapshot is the machine's and this process's accumulated CPU time.
type Snapshot struct {
	At   time.Time
	Busy time.Duration // all CPUs, every process, non-idle
	Self time.Duration // this process, user+system
}

// Take reads the counters now.
func Take() (Snapshot, error) {
	s := Snapshot{At: time.Now()}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s, fmt.Errorf("read /proc/stat: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return s, fmt.Errorf("parse /proc/stat: unexpected first line %q", line)
	}
	// user nice system idle iowait irq softirq steal ...
	for i, v := range f[1:9] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return s, fmt.Errorf("parse /proc/stat: %w", err)
		}
		s.Busy += time.Duration(n) * clockTick
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return s, fmt.Errorf("getrusage: %w", err)
	}
	s.Self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return s, nil
}

// Delta is what the machine spent between two snapshots.
type Delta struct {
	Wall time.Duration
	Busy time.Duration // every process
	Self time.Duration // the benchmark process
}

// Sub returns the usage between before and s.
func (s Snapshot) Sub(before Snapshot) Delta {
	return Delta{Wall: s.At.Sub(before.At), Busy: s.Busy - before.Busy, Self: s.Self - before.Self}
}

// Foreign returns the CPU time of processes other than the benchmark, given
// the CPU time of the benchmark's children and of Postgres in the window.
func (d Delta) Foreign(children, postgres time.Duration) time.Duration {
	return max(0, d.Busy-d.Self-children-postgres)
}

// Capacity returns the CPU time the machine could have spent in the window.
func (d Delta) Capacity() time.Duration { return d.Wall * time.Duration(runtime.NumCPU()) }

// LoadAvg returns the 1-minute load average.
func LoadAvg() (float64, error) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, fmt.Errorf("read /proc/loadavg: %w", err)
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("parse /proc/loadavg: empty")
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0, fmt.Errorf("parse /proc/loadavg: %w", err)
	}
	return v, nil
}
