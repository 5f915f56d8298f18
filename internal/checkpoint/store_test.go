package checkpoint

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

// store is what the relay needs from a checkpoint store; both stores must satisfy it.
type store interface {
	Load(ctx context.Context, slot string) (Checkpoint, bool, error)
	Save(ctx context.Context, c Checkpoint) error
	Close() error
}

var (
	_ store = (*TableStore)(nil)
	_ store = (*FileStore)(nil)
)

// testStoreContract runs the behaviour every store must have. newStore returns a
// fresh, empty store for each case.
func testStoreContract(t *testing.T, newStore func(t *testing.T) store) {
	// Microsecond precision and a non-UTC zone: what Postgres keeps is the instant.
	at := time.Date(2024, 5, 17, 10, 30, 0, 123456000, time.FixedZone("CEST", 2*3600))
	cp := func(slot string, lsn pglogrepl.LSN) Checkpoint {
		return Checkpoint{Slot: slot, SystemID: "7351234567890123456", LSN: lsn, UpdatedAt: at, RelayName: "relay-a"}
	}
	tests := []struct {
		name string
		run  func(t *testing.T, ctx context.Context, s store)
	}{
		{"load missing", func(t *testing.T, ctx context.Context, s store) {
			mustLoad(t, ctx, s, "orders", Checkpoint{}, false)
		}},
		{"save and load", func(t *testing.T, ctx context.Context, s store) {
			c := cp("orders", 0x16B3748)
			mustSave(t, ctx, s, c)
			mustLoad(t, ctx, s, "orders", c, true)
		}},
		{"overwrite, also backwards", func(t *testing.T, ctx context.Context, s store) {
			mustSave(t, ctx, s, cp("orders", 0x2000000))
			c := Checkpoint{Slot: "orders", SystemID: "42", LSN: 0x1000000, UpdatedAt: at.Add(time.Hour), RelayName: "relay-b"}
			mustSave(t, ctx, s, c)
			mustLoad(t, ctx, s, "orders", c, true)
		}},
		{"commit time round-trips, and zero stays unknown", func(t *testing.T, ctx context.Context, s store) {
			c := cp("orders", 0x300)
			c.CommitTime = at.Add(-time.Minute)
			mustSave(t, ctx, s, c)
			mustLoad(t, ctx, s, "orders", c, true)
			c.LSN, c.CommitTime = 0x400, time.Time{}
			mustSave(t, ctx, s, c)
			mustLoad(t, ctx, s, "orders", c, true)
		}},
		{"oldest unrelayed round-trips, and zero stays none", func(t *testing.T, ctx context.Context, s store) {
			c := cp("orders", 0x300)
			c.OldestUnrelayed = at.Add(-2 * time.Minute)
			mustSave(t, ctx, s, c)
			mustLoad(t, ctx, s, "orders", c, true)
			c.OldestUnrelayed = time.Time{}
			mustSave(t, ctx, s, c)
			mustLoad(t, ctx, s, "orders", c, true)
		}},
		{"kafka offsets round-trip", func(t *testing.T, ctx context.Context, s store) {
			c := cp("orders", 0x500)
			c.Offsets = Offsets{
				"orders":       {Partitions: 12, Next: map[int32]int64{0: 123, 2: 0, 10: 1 << 62, 11: 456}},
				"payments.v1":  {Partitions: 1, Next: map[int32]int64{0: 9223372036854775807}},
				`q'uote"d-ü`:   {Partitions: 3, Next: map[int32]int64{1: 7}},
				"not-yet-used": {Partitions: 4, Next: map[int32]int64{}},
			}
			mustSave(t, ctx, s, c)
			mustLoad(t, ctx, s, "orders", c, true)
		}},
		{"nil offsets are none stored, empty ones stay empty", func(t *testing.T, ctx context.Context, s store) {
			c := cp("orders", 0x600)
			mustSave(t, ctx, s, c)
			mustLoad(t, ctx, s, "orders", c, true)
			c.Offsets = Offsets{}
			mustSave(t, ctx, s, c)
			mustLoad(t, ctx, s, "orders", c, true)
		}},
		{"offsets are overwritten, also by none", func(t *testing.T, ctx context.Context, s store) {
			c := cp("orders", 0x700)
			c.Offsets = Offsets{"orders": {Partitions: 8, Next: map[int32]int64{0: 10, 7: 70}}, "audit": {Partitions: 1, Next: map[int32]int64{0: 1}}}
			mustSave(t, ctx, s, c)
			c.LSN, c.Offsets = 0x800, Offsets{"orders": {Partitions: 16, Next: map[int32]int64{3: 30}}}
			mustSave(t, ctx, s, c)
			mustLoad(t, ctx, s, "orders", c, true)
			c.LSN, c.Offsets = 0x900, nil
			mustSave(t, ctx, s, c)
			mustLoad(t, ctx, s, "orders", c, true)
		}},
		{"outbox tables round-trip; nil stays unknown, empty stays empty", func(t *testing.T, ctx context.Context, s store) {
			c := cp("orders", 0xA00)
			c.Tables = []string{"public.outbox_events", `bill'ing.outbox "events"`}
			mustSave(t, ctx, s, c)
			mustLoad(t, ctx, s, "orders", c, true)
			c.Tables = []string{}
			mustSave(t, ctx, s, c)
			mustLoad(t, ctx, s, "orders", c, true)
			c.Tables = nil
			mustSave(t, ctx, s, c)
			mustLoad(t, ctx, s, "orders", c, true)
		}},
		{"two slots are independent", func(t *testing.T, ctx context.Context, s store) {
			a, b := cp("orders", 0x100), cp("payments", 0x200)
			b.SystemID, b.RelayName = "99", "relay-b"
			b.Offsets = Offsets{"payments": {Partitions: 2, Next: map[int32]int64{1: 5}}}
			mustSave(t, ctx, s, a)
			mustSave(t, ctx, s, b)
			a.LSN = 0x300
			mustSave(t, ctx, s, a)
			mustLoad(t, ctx, s, "orders", a, true)
			mustLoad(t, ctx, s, "payments", b, true)
			mustLoad(t, ctx, s, "shipments", Checkpoint{}, false)
		}},
		{"extreme LSNs and odd names", func(t *testing.T, ctx context.Context, s store) {
			for _, c := range []Checkpoint{
				{Slot: "zero", SystemID: "1", LSN: 0, UpdatedAt: at},
				{Slot: "max", SystemID: "1", LSN: pglogrepl.LSN(^uint64(0)), UpdatedAt: at},
				{Slot: `q'uote"d`, SystemID: "1", LSN: 0xFFFFFFFF00000001, UpdatedAt: at, RelayName: "ré'lay"},
			} {
				mustSave(t, ctx, s, c)
				mustLoad(t, ctx, s, c.Slot, c, true)
			}
		}},
		{"zero UpdatedAt is set to now", func(t *testing.T, ctx context.Context, s store) {
			before := time.Now().Add(-time.Minute) // the database clock may differ a little
			mustSave(t, ctx, s, Checkpoint{Slot: "orders", SystemID: "1", LSN: 5})
			got, ok, err := s.Load(ctx, "orders")
			if err != nil || !ok {
				t.Fatalf("Load = %v, %v", ok, err)
			}
			if got.UpdatedAt.Before(before) || got.UpdatedAt.After(time.Now().Add(time.Minute)) {
				t.Errorf("UpdatedAt = %v, want about now", got.UpdatedAt)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStore(t)
			t.Cleanup(func() {
				if err := s.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
			tt.run(t, t.Context(), s)
		})
	}
}

func mustSave(t *testing.T, ctx context.Context, s store, c Checkpoint) {
	t.Helper()
	if err := s.Save(ctx, c); err != nil {
		t.Fatalf("Save(%+v): %v", c, err)
	}
}

func mustLoad(t *testing.T, ctx context.Context, s store, slot string, want Checkpoint, wantOK bool) {
	t.Helper()
	got, ok, err := s.Load(ctx, slot)
	if err != nil {
		t.Fatalf("Load(%q): %v", slot, err)
	}
	if ok != wantOK {
		t.Fatalf("Load(%q) found = %v, want %v", slot, ok, wantOK)
	}
	if got.Slot != want.Slot || got.SystemID != want.SystemID || got.LSN != want.LSN ||
		got.RelayName != want.RelayName || !got.UpdatedAt.Equal(want.UpdatedAt) || !got.CommitTime.Equal(want.CommitTime) ||
		!got.OldestUnrelayed.Equal(want.OldestUnrelayed) || !reflect.DeepEqual(got.Offsets, want.Offsets) ||
		!reflect.DeepEqual(got.Tables, want.Tables) {
		t.Fatalf("Load(%q) = %+v, want %+v", slot, got, want)
	}
}

func TestFileStoreContract(t *testing.T) {
	testStoreContract(t, func(t *testing.T) store {
		return NewFileStore(filepath.Join(t.TempDir(), "checkpoints.json"))
	})
}

func TestFileStoreLeavesOnlyTheFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "checkpoints.json")
	s := NewFileStore(path)
	ctx := t.Context()
	for i := range 3 {
		mustSave(t, ctx, s, Checkpoint{Slot: "orders", SystemID: "1", LSN: pglogrepl.LSN(i)})
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != "checkpoints.json" {
		t.Fatalf("directory holds %v, want only checkpoints.json", entries)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"lsn": "0/2"`) {
		t.Errorf("file does not show the LSN in text form:\n%s", data)
	}
	// A second store on the same file sees the data: nothing is cached.
	mustLoad(t, ctx, NewFileStore(path), "orders", Checkpoint{Slot: "orders", SystemID: "1", LSN: 2,
		UpdatedAt: mustLoadTime(t, s)}, true)
}

func mustLoadTime(t *testing.T, s store) time.Time {
	t.Helper()
	c, _, err := s.Load(t.Context(), "orders")
	if err != nil {
		t.Fatal(err)
	}
	return c.UpdatedAt
}

func TestFileStoreErrors(t *testing.T) {
	ctx := t.Context()
	good := Checkpoint{Slot: "orders", SystemID: "1", LSN: 7}
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string) string // returns the store path
		load  bool                                  // Load fails too (else only Save)
		want  []string                              // substrings of the error, besides the path
	}{
		{
			name:  "directory missing",
			setup: func(_ *testing.T, dir string) string { return filepath.Join(dir, "missing", "ckpt.json") },
			want:  []string{"no such file or directory"},
		},
		{
			name: "parent is a file",
			setup: func(t *testing.T, dir string) string {
				writeFile(t, filepath.Join(dir, "plain"), "x")
				return filepath.Join(dir, "plain", "ckpt.json")
			},
			load: true,
			want: []string{"not a directory"},
		},
		{
			name: "directory not writable",
			setup: func(t *testing.T, dir string) string {
				if os.Geteuid() == 0 {
					t.Skip("skip: root writes to read-only directories")
				}
				ro := filepath.Join(dir, "ro")
				if err := os.Mkdir(ro, 0o500); err != nil {
					t.Fatal(err)
				}
				return filepath.Join(ro, "ckpt.json")
			},
			want: []string{"permission denied"},
		},
		{
			// Root ignores permission bits, but not sysfs, which refuses new files to all.
			name: "directory not writable even by root",
			setup: func(t *testing.T, _ string) string {
				if fi, err := os.Stat("/sys/kernel"); err != nil || !fi.IsDir() {
					t.Skip("skip: no sysfs at /sys")
				}
				return "/sys/cdc-relay-checkpoints.json"
			},
			want: []string{"create temporary file in /sys"},
		},
		{
			name: "corrupted file",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "ckpt.json")
				writeFile(t, p, `{"version":1,"checkpoints":{"orders":{"lsn":"0/1"`)
				return p
			},
			load: true,
			want: []string{"decode checkpoint file", "unexpected EOF"},
		},
		{
			name: "not a checkpoint file",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "ckpt.json")
				writeFile(t, p, `{"slots":[]}`)
				return p
			},
			load: true,
			want: []string{"unknown field"},
		},
		{
			name: "unknown version",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "ckpt.json")
				writeFile(t, p, `{"version":2,"checkpoints":{}}`)
				return p
			},
			load: true,
			want: []string{"format version 2"},
		},
		{
			name: "bad LSN",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "ckpt.json")
				writeFile(t, p, `{"version":1,"checkpoints":{"orders":{"lsn":"zz","system_id":"1"}}}`)
				return p
			},
			load: true,
			want: []string{`LSN "zz"`, `slot "orders"`},
		},
		{
			name: "path is a directory",
			setup: func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "ckpt.json")
				if err := os.Mkdir(p, 0o700); err != nil {
					t.Fatal(err)
				}
				return p
			},
			load: true,
			want: []string{"read checkpoint file"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := tt.setup(t, t.TempDir())
			before, _ := os.ReadFile(path)
			s := NewFileStore(path)

			_, _, err := s.Load(ctx, "orders")
			if tt.load {
				checkErr(t, "Load", err, append(tt.want, path))
			} else if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if tt.name == "bad LSN" {
				return // the file itself parses, so Save rewrites it; only Load must refuse
			}
			checkErr(t, "Save", s.Save(ctx, good), append(tt.want, path))
			if after, _ := os.ReadFile(path); string(after) != string(before) {
				t.Errorf("failed Save changed the file:\nbefore %q\nafter  %q", before, after)
			}
		})
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func checkErr(t *testing.T, op string, err error, want []string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s succeeded, want an error containing %q", op, want)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s error %q does not contain %q", op, err, w)
		}
	}
}

func TestTableDDL(t *testing.T) {
	tests := []struct{ table, want string }{
		{"", `CREATE TABLE IF NOT EXISTS "public"."cdc_relay_checkpoints" (`},
		{"ckpt", `CREATE TABLE IF NOT EXISTS "ckpt" (`},
		{"My Schema.Ckpt", `CREATE TABLE IF NOT EXISTS "My Schema"."Ckpt" (`},
		{`we"ird.t`, `CREATE TABLE IF NOT EXISTS "we""ird"."t" (`},
	}
	for _, tt := range tests {
		got := TableDDL(tt.table)
		if !strings.HasPrefix(got, tt.want) {
			t.Errorf("TableDDL(%q) = %q, want prefix %q", tt.table, got, tt.want)
		}
		for _, col := range []string{
			"slot_name  text        PRIMARY KEY",
			"system_id  text        NOT NULL",
			"lsn        pg_lsn      NOT NULL",
			"relay_name text        NOT NULL DEFAULT ''",
			"updated_at timestamptz NOT NULL DEFAULT now()",
		} {
			if !strings.Contains(got, col) {
				t.Errorf("TableDDL(%q) lacks column %q", tt.table, col)
			}
		}
		for _, c := range addedColumns { // Ensure adds them to older tables
			if col := c.name + " " + c.typ; !strings.Contains(got, col) {
				t.Errorf("TableDDL(%q) lacks added column %q", tt.table, col)
			}
		}
	}
}

// TestFileStoreKafkaOffsets: files written before kafka_offsets existed load
// with none stored and keep their entries, and the field is readable JSON.
func TestFileStoreKafkaOffsets(t *testing.T) {
	ctx := t.Context()
	tests := []struct {
		name string
		old  string // file content written by an older relay
	}{
		{"file from before commit_time", `{
  "version": 1,
  "checkpoints": {
    "old": {"system_id": "1", "lsn": "0/10", "updated_at": "2024-05-17T08:30:00Z", "relay_name": "r"}
  }
}`},
		{"file from before kafka_offsets", `{
  "version": 1,
  "checkpoints": {
    "old": {"system_id": "1", "lsn": "0/10", "updated_at": "2024-05-17T08:30:00Z", "relay_name": "r",
            "commit_time": "2024-05-17T08:29:00Z"}
  }
}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "ckpt.json")
			writeFile(t, path, tt.old)
			s := NewFileStore(path)
			old, ok, err := s.Load(ctx, "old")
			if err != nil || !ok || old.LSN != 0x10 || old.Offsets != nil {
				t.Fatalf("Load of the old entry = %+v, %v, %v; want LSN 0/10 with no offsets", old, ok, err)
			}
			c := Checkpoint{Slot: "new", SystemID: "1", LSN: 0x20, UpdatedAt: time.Unix(1700000000, 0),
				Offsets: Offsets{"orders": {Partitions: 11, Next: map[int32]int64{10: 1000, 2: 200, 0: 0}}}}
			mustSave(t, ctx, s, c)
			mustLoad(t, ctx, s, "new", c, true)
			mustLoad(t, ctx, s, "old", old, true)

			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			text := string(data)
			if n := strings.Count(text, `"kafka_offsets"`); n != 1 {
				t.Errorf("file has %d kafka_offsets fields, want 1 (only the new entry's):\n%s", n, text)
			}
			// Partitions in numeric order, one per line: readable and diffable.
			want := `"next": {
            "0": 0,
            "2": 200,
            "10": 1000
          }`
			if !strings.Contains(text, `"partitions": 11`) || !strings.Contains(text, want) {
				t.Errorf("file does not show the offsets as\n%s\nin:\n%s", want, text)
			}
		})
	}
}
