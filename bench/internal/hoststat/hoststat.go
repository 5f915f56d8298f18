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
	// Waiting is the time at least one runnable task waited for a CPU
	// (/proc/pressure/cpu "some" total; -1 when the kernel has no PSI).
	Waiting time.Duration
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
	if s.Waiting, err = cpuPressure(); err != nil {
		return s, err
	}
	return s, nil
}

// cpuPressure reads the "some" total of /proc/pressure/cpu, -1 when the file
// does not exist (a kernel without PSI).
func cpuPressure() (time.Duration, error) {
	b, err := os.ReadFile("/proc/pressure/cpu")
	if os.IsNotExist(err) {
		return -1, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read /proc/pressure/cpu: %w", err)
	}
	return parsePressure(string(b))
}

// parsePressure returns the total of the "some" line of a PSI file
// ("some avg10=… avg60=… avg300=… total=<µs>").
func parsePressure(s string) (time.Duration, error) {
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "some" {
			continue
		}
		for _, kv := range f[1:] {
			if v, ok := strings.CutPrefix(kv, "total="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return 0, fmt.Errorf("parse /proc/pressure/cpu: %w", err)
				}
				return time.Duration(n) * time.Microsecond, nil
			}
		}
	}
	return 0, fmt.Errorf("parse /proc/pressure/cpu: no \"some … total=\" in %q", s)
}

// Delta is what the machine spent between two snapshots.
type Delta struct {
	Wall    time.Duration
	Busy    time.Duration // every process
	Self    time.Duration // the benchmark process
	Waiting time.Duration // some task waited for a CPU; -1 unknown
}

// Sub returns the usage between before and s.
func (s Snapshot) Sub(before Snapshot) Delta {
	d := Delta{Wall: s.At.Sub(before.At), Busy: s.Busy - before.Busy, Self: s.Self - before.Self, Waiting: -1}
	if s.Waiting >= 0 && before.Waiting >= 0 {
		d.Waiting = s.Waiting - before.Waiting
	}
	return d
}

// WaitShare is the share of the window in which some runnable task waited
// for a CPU: near 0 every task ran when it could, near 1 the machine was
// oversubscribed throughout. -1 when the kernel does not say.
func (d Delta) WaitShare() float64 {
	if d.Waiting < 0 || d.Wall <= 0 {
		return -1
	}
	return min(1, d.Waiting.Seconds()/d.Wall.Seconds())
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
