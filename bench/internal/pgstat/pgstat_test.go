package pgstat

import (
	"os"
	"testing"
	"time"
)

func TestClassify(t *testing.T) {
	for title, want := range map[string]string{
		"walsender postgres 127.0.0.1(47806) START_REPLICATION": KindWalsender,
		"postgres relay 127.0.0.1(47784) idle":                  KindBackend,
		"autovacuum worker relay":                               KindAutovacuum,
		"autovacuum launcher":                                   KindAutovacuum,
		"checkpointer":                                          KindBackground,
		"background writer":                                     KindBackground,
		"walwriter":                                             KindBackground,
		"logical replication launcher":                          KindBackground,
	} {
		if got := classify(title); got != want {
			t.Errorf("classify(%q) = %q, want %q", title, got, want)
		}
	}
}

func TestReadStatOwnProcess(t *testing.T) {
	st, err := readStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if st.ppid != os.Getppid() {
		t.Fatalf("ppid = %d, want %d", st.ppid, os.Getppid())
	}
	if st.start <= 0 {
		t.Fatalf("start = %d, want the start time in ticks", st.start)
	}
	if st.utime < 0 || st.stime < 0 || st.utime%clockTick != 0 {
		t.Fatalf("utime %v, stime %v: want non-negative multiples of %v", st.utime, st.stime, clockTick)
	}
}

func TestBreakdownCountsExitedProcesses(t *testing.T) {
	ms := time.Millisecond
	before := CPUSnapshot{Total: 100 * ms, procs: map[procKey]proc{
		{1, 1}: {cpu: 10 * ms, kind: KindBackground},
		{2, 5}: {cpu: 50 * ms, kind: KindWalsender},
		{3, 7}: {cpu: 40 * ms, kind: KindBackend}, // exits in between, having used 70ms in all
	}}
	after := CPUSnapshot{Total: 100*ms + 5*ms + 20*ms + 30*ms + 15*ms, procs: map[procKey]proc{
		{1, 1}: {cpu: 15 * ms, kind: KindBackground},
		{2, 5}: {cpu: 70 * ms, kind: KindWalsender},
		{3, 9}: {cpu: 15 * ms, kind: KindBackend}, // new, with a reused pid
	}}
	got := after.Breakdown(before)
	want := map[string]time.Duration{KindBackground: 5 * ms, KindWalsender: 20 * ms, KindBackend: 15 * ms, KindExited: 30 * ms}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
}

func TestParseIO(t *testing.T) {
	tests := []struct {
		name    string
		text    string
		want    Syscalls
		wantErr bool
	}{
		{"proc io", "rchar: 6976\nwchar: 12\nsyscr: 10\nsyscw: 3\nread_bytes: 0\nwrite_bytes: 0\ncancelled_write_bytes: 0\n", Syscalls{Reads: 10, Writes: 3}, false},
		{"missing syscw", "syscr: 10\n", Syscalls{}, true},
		{"garbage", "syscr: x\nsyscw: 1\n", Syscalls{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseIO(1, tt.text)
			if (err != nil) != tt.wantErr || (!tt.wantErr && got != tt.want) {
				t.Errorf("parseIO = %+v, %v; want %+v (error %v)", got, err, tt.want, tt.wantErr)
			}
		})
	}
}
