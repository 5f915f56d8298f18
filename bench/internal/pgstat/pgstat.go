// Package pgstat measures what Postgres spends during a benchmark window: CPU
// time of the whole server (postmaster and every child process) from /proc, and
// WAL bytes written, from the WAL insert position.
package pgstat

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// clockTick is the unit of the CPU times in /proc/<pid>/stat (USER_HZ, 100 on
// every Linux architecture Go supports).
const clockTick = 10 * time.Millisecond

// CPUSampler samples the CPU time of a local Postgres server.
type CPUSampler struct {
	postmaster int
	kinds      map[procKey]string // process kind, read once per process
}

// NewCPUSampler finds the postmaster of the cluster in dataDir.
func NewCPUSampler(dataDir string) (*CPUSampler, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return nil, fmt.Errorf("read postmaster.pid: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		return nil, fmt.Errorf("parse postmaster.pid: %w", err)
	}
	return &CPUSampler{postmaster: pid, kinds: make(map[procKey]string)}, nil
}

// CPUSnapshot is the server's accumulated CPU time at one moment.
type CPUSnapshot struct {
	// Total is the postmaster's own time and that of its exited, reaped
	// children (cutime+cstime) plus the time of every live child.
	Total     time.Duration
	Processes int // live children
	procs     map[procKey]proc
}

// procKey names a process for its whole life: pids are reused, quickly on a
// busy machine with a small pid_max.
type procKey struct {
	pid   int
	start int64 // start time in clock ticks since boot
}

// proc is one live server process.
type proc struct {
	cpu  time.Duration
	kind string
}

// The kinds of server process Breakdown reports.
const (
	KindWalsender  = "walsender"  // replication connections: logical decoding
	KindBackend    = "backend"    // client sessions
	KindAutovacuum = "autovacuum" // launcher and workers
	KindBackground = "background" // checkpointer, writers, postmaster, ...
	KindExited     = "exited"     // processes that ended in between
)

// Breakdown splits the CPU time between before and s by kind of process;
// time of processes that exited in between is KindExited.
func (s CPUSnapshot) Breakdown(before CPUSnapshot) map[string]time.Duration {
	out := make(map[string]time.Duration)
	var live time.Duration
	for key, p := range s.procs {
		d := p.cpu - before.procs[key].cpu
		out[p.kind] += d
		live += d
	}
	if exited := s.Sub(before) - live; exited > 0 {
		out[KindExited] = exited
	}
	return out
}

// kindOf classifies a server process by its title ("postgres: walsender …").
// final is false while a just-started process still shows the postmaster's
// command line, so the caller asks again later.
func kindOf(pid int) (kind string, final bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return KindBackground, false
	}
	title, ok := strings.CutPrefix(string(bytes.TrimRight(b, "\x00")), "postgres: ")
	if !ok {
		return KindBackend, false
	}
	return classify(title), true
}

func classify(title string) string {
	switch {
	case strings.HasPrefix(title, "walsender"):
		return KindWalsender
	case strings.HasPrefix(title, "autovacuum"):
		return KindAutovacuum
	case strings.HasPrefix(title, "checkpointer"), strings.HasPrefix(title, "background writer"),
		strings.HasPrefix(title, "walwriter"), strings.HasPrefix(title, "logical replication"),
		strings.HasPrefix(title, "archiver"), strings.HasPrefix(title, "stats"):
		return KindBackground
	}
	return KindBackend
}

// Sub returns the CPU time spent between before and s. Children that exit in
// between count fully: their time moves from the per-process sum into the
// postmaster's reaped-children counters.
func (s CPUSnapshot) Sub(before CPUSnapshot) time.Duration { return s.Total - before.Total }

// Snapshot reads the counters now.
func (c *CPUSampler) Snapshot() (CPUSnapshot, error) {
	snap := CPUSnapshot{procs: make(map[procKey]proc)}
	pm, err := readStat(c.postmaster)
	if err != nil {
		return snap, fmt.Errorf("read postmaster stat: %w", err)
	}
	snap.Total = pm.utime + pm.stime + pm.cutime + pm.cstime
	snap.procs[procKey{c.postmaster, pm.start}] = proc{cpu: pm.utime + pm.stime, kind: KindBackground}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return snap, fmt.Errorf("list processes: %w", err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == c.postmaster {
			continue
		}
		st, err := readStat(pid)
		if err != nil || st.ppid != c.postmaster {
			continue // gone meanwhile, or not a server process
		}
		// A child's own reaped children (rare: archive commands) are in
		// its cutime/cstime.
		cpu := st.utime + st.stime + st.cutime + st.cstime
		snap.Total += cpu
		snap.Processes++
		key := procKey{pid, st.start}
		kind, ok := c.kinds[key]
		if !ok {
			var final bool
			if kind, final = kindOf(pid); final {
				c.kinds[key] = kind
			}
		}
		snap.procs[key] = proc{cpu: cpu, kind: kind}
	}
	return snap, nil
}

// ProcessCPU returns the user plus system time of a live process.
func ProcessCPU(pid int) (time.Duration, error) {
	st, err := readStat(pid)
	if err != nil {
		return 0, fmt.Errorf("read CPU time of process %d: %w", pid, err)
	}
	return st.utime + st.stime, nil
}

// Syscalls are a process's read and write system calls so far (syscr and
// syscw of /proc/<pid>/io): read(2), write(2) and their kin, which is how Go
// reads a socket; send(2) and recv(2), which Postgres uses, are not counted.
type Syscalls struct {
	Reads, Writes int64
}

// ProcessSyscalls returns the read and write system calls of a live process.
func ProcessSyscalls(pid int) (Syscalls, error) {
	var sc Syscalls
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/io")
	if err != nil {
		return sc, fmt.Errorf("read system calls of process %d: %w", pid, err)
	}
	return parseIO(pid, string(b))
}

// parseIO reads syscr and syscw from the text of /proc/<pid>/io.
func parseIO(pid int, text string) (Syscalls, error) {
	var sc Syscalls
	found := 0
	for _, line := range strings.Split(text, "\n") {
		key, v, ok := strings.Cut(line, ":")
		if !ok || (key != "syscr" && key != "syscw") {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return sc, fmt.Errorf("parse /proc/%d/io %s: %w", pid, key, err)
		}
		if key == "syscr" {
			sc.Reads = n
		} else {
			sc.Writes = n
		}
		found++
	}
	if found != 2 {
		return sc, fmt.Errorf("parse /proc/%d/io: no syscr and syscw", pid)
	}
	return sc, nil
}

type procStat struct {
	ppid                         int
	utime, stime, cutime, cstime time.Duration
	start                        int64 // clock ticks after boot
}

// readStat parses /proc/<pid>/stat; the command name may hold spaces and
// parentheses, so fields are counted after its last ')'.
func readStat(pid int) (procStat, error) {
	var st procStat
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return st, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return st, fmt.Errorf("parse /proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): ppid is field 4, utime..cstime fields 14..17,
	// starttime field 22.
	if len(f) < 20 {
		return st, fmt.Errorf("parse /proc/%d/stat: %d fields", pid, len(f))
	}
	nums := make([]int64, 6)
	for j, k := range []int{1, 11, 12, 13, 14, 19} {
		if nums[j], err = strconv.ParseInt(f[k], 10, 64); err != nil {
			return st, fmt.Errorf("parse /proc/%d/stat: %w", pid, err)
		}
	}
	st.ppid = int(nums[0])
	st.utime = time.Duration(nums[1]) * clockTick
	st.stime = time.Duration(nums[2]) * clockTick
	st.cutime = time.Duration(nums[3]) * clockTick
	st.cstime = time.Duration(nums[4]) * clockTick
	st.start = nums[5]
	return st, nil
}

// WALInsertLSN returns the current WAL insert position. Asking writes no WAL.
func WALInsertLSN(ctx context.Context, conn *pgx.Conn) (pglogrepl.LSN, error) {
	var s string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&s); err != nil {
		return 0, fmt.Errorf("read WAL position: %w", err)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		return 0, fmt.Errorf("parse WAL position %q: %w", s, err)
	}
	return lsn, nil
}

// ApplicationName is the application_name of the session a Window keeps open.
const ApplicationName = "bench-window"

// Window is one measured stretch: Postgres CPU time and WAL written.
type Window struct {
	cpu      *CPUSampler
	conn     *pgx.Conn // reads the WAL position; opened before the window
	startCPU CPUSnapshot
	startWAL pglogrepl.LSN
}

// Usage is what Postgres spent in a window.
type Usage struct {
	CPU      time.Duration
	WALBytes int64
}

// Begin starts a window on the server of url (a database on the sampled
// cluster). The connection used to read WAL positions is opened before the
// first CPU sample and kept, so its start-up is not counted.
func Begin(ctx context.Context, cpu *CPUSampler, url string) (*Window, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse URL: %w", err)
	}
	cfg.RuntimeParams["application_name"] = ApplicationName
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to read WAL position: %w", err)
	}
	w := &Window{cpu: cpu, conn: conn}
	if w.startWAL, err = WALInsertLSN(ctx, conn); err == nil {
		w.startCPU, err = cpu.Snapshot()
	}
	if err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	return w, nil
}

// End closes the window and returns what was spent in it.
func (w *Window) End(ctx context.Context) (Usage, error) {
	defer w.conn.Close(context.Background())
	snap, err := w.cpu.Snapshot()
	if err != nil {
		return Usage{}, err
	}
	lsn, err := WALInsertLSN(ctx, w.conn)
	if err != nil {
		return Usage{}, err
	}
	return Usage{CPU: snap.Sub(w.startCPU), WALBytes: int64(lsn) - int64(w.startWAL)}, nil
}

// Breakdown returns the server's CPU time since the window began, by kind of
// process (see CPUSnapshot.Breakdown). Call it while the measured client is
// still connected: once its sessions end, their time only shows as exited.
func (w *Window) Breakdown() (map[string]time.Duration, error) {
	snap, err := w.cpu.Snapshot()
	if err != nil {
		return nil, err
	}
	return snap.Breakdown(w.startCPU), nil
}

// Close releases the window without measuring (after an error).
func (w *Window) Close() { w.conn.Close(context.Background()) }
