package hoststat

import (
	"testing"
	"time"
)

func TestParsePressure(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    time.Duration
		wantErr bool
	}{
		{"some and full", "some avg10=1.84 avg60=22.75 avg300=28.10 total=12985474207\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", 12985474207 * time.Microsecond, false},
		{"some only (older kernels)", "some avg10=0.00 avg60=0.00 avg300=0.00 total=42\n", 42 * time.Microsecond, false},
		{"no some line", "full avg10=0.00 avg60=0.00 avg300=0.00 total=7\n", 0, true},
		{"bad total", "some avg10=0.00 total=x\n", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parsePressure(tt.in)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("parsePressure = %v, %v; want %v, error %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestWaitShare(t *testing.T) {
	t0 := time.Unix(0, 0)
	tests := []struct {
		name          string
		before, after Snapshot
		want          float64
	}{
		{"quarter", Snapshot{At: t0, Waiting: time.Second}, Snapshot{At: t0.Add(4 * time.Second), Waiting: 2 * time.Second}, 0.25},
		{"capped at 1", Snapshot{At: t0}, Snapshot{At: t0.Add(time.Second), Waiting: 2 * time.Second}, 1},
		{"no PSI", Snapshot{At: t0, Waiting: -1}, Snapshot{At: t0.Add(time.Second), Waiting: -1}, -1},
		{"no window", Snapshot{At: t0}, Snapshot{At: t0}, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.after.Sub(tt.before).WaitShare(); got != tt.want {
				t.Fatalf("WaitShare = %v, want %v", got, tt.want)
			}
		})
	}
}
