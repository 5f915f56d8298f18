package status

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
)

// TestWriteText: the text report of a report, as status --json writes it,
// line by line (what operators' scripts grep).
func TestWriteText(t *testing.T) {
	tests := []struct {
		name   string
		report string // JSON
		want   string
	}{
		{
			name:   "primary, active, checkpoint with offsets cut short, dead letters, failover slot, problems and warnings",
			report: `{"slot":"orders","server":"primary","slot_exists":true,"active":true,"active_pid":4242,"wal_status":"reserved","server_wal_end":"0/3000060","confirmed_lsn":"0/3000028","lag_bytes":56,"retained_wal_bytes":3145728,"safe_wal_size_bytes":10485760,"max_slot_wal_keep_size_bytes":33554432,"conflicting":false,"oldest_unrelayed_age_seconds":1.2345,"oldest_unrelayed_source":"checkpoint","checkpoint":{"lsn":"0/3000028","updated_at":"2026-01-02T03:04:05Z","age_seconds":0.26,"relay_name":"relay-a","kafka_offsets":{"orders":{"partitions":20,"next":{"0":1,"1":2,"2":3,"3":4,"4":5,"5":6,"6":7,"7":8,"8":9,"9":10,"10":11,"11":12,"12":13,"13":14,"14":15,"15":16,"16":17,"17":18,"18":19,"19":20}},"quiet":{"partitions":3,"next":{}}}},"dead_letters":{"pending":5,"dead":2,"by_code":{"too_large":3,"auth":2},"by_source_table":{"public.outbox_b":1,"public.outbox_a":4}},"failover":{"server_version":"17.2","supported":true,"slot_failover":true,"slot_synced":false,"synchronized_standby_slots":"sb1"},"problems":["first problem","second problem"],"warnings":["a warning"]}`,
			want: `slot                        orders
server                      primary
active                      yes (pid 4242)
wal_status                  reserved
confirmed lsn               0/3000028
server wal end              0/3000060
lag                         56 B
retained wal                3.0 MiB
safe wal size               10.0 MiB of max_slot_wal_keep_size 32.0 MiB
conflicting                 false
oldest unrelayed            1.235s (from the checkpoint the running relay wrote 300ms ago)
stored checkpoint           0/3000028 (0s ago, by relay-a)
kafka offsets               orders (20 partitions): 0=1 1=2 2=3 3=4 4=5 5=6 6=7 7=8 8=9 9=10 10=11 11=12 12=13 13=14 14=15 15=16 … 4 more (--json shows all)
kafka offsets               quiet (3 partitions, 0 written): no records written
dead letters not completed  5 (2 dead) auth=2 too_large=3
dead letters by table       public.outbox_a=4 public.outbox_b=1
failover                    failover slot yes, synced no, synchronized_standby_slots sb1 (PostgreSQL 17.2)
PROBLEM                     first problem
PROBLEM                     second problem
WARNING                     a warning
`,
		},
		{
			name:   "standby, slot missing, no checkpoint, no failover slots",
			report: `{"slot":"gone","server":"standby","slot_exists":false,"active":false,"server_wal_end":"0/5000000","lag_bytes":0,"retained_wal_bytes":0,"oldest_unrelayed_age_seconds":null,"failover":{"server_version":"15.8","supported":false,"slot_failover":false,"slot_synced":false,"synchronized_standby_slots":""},"problems":["replication slot \"gone\" does not exist"]}`,
			want: `slot               gone
server             standby (the slot and the decoding are here; the relay writes its checkpoint and dead letters to the primary)
exists             no
stored checkpoint  none
kafka offsets      none stored (at-least-once delivery, or no checkpoint with offsets yet)
failover           no failover slots on PostgreSQL 15.8 (17+): a promotion loses the slot
PROBLEM            replication slot "gone" does not exist
`,
		},
		{
			name:   "slot lost past its WAL limit, age from the slot, no dead letters",
			report: `{"slot":"lost","server":"primary","slot_exists":true,"active":false,"wal_status":"lost","server_wal_end":"1/0","confirmed_lsn":"0/10","lag_bytes":4294967280,"retained_wal_bytes":1536,"safe_wal_size_bytes":-2048,"max_slot_wal_keep_size_bytes":1048576,"invalidation_reason":"wal_removed","invalidated":"wal_removed","oldest_unrelayed_age_seconds":0,"oldest_unrelayed_source":"slot","checkpoint":{"lsn":"0/10","updated_at":"2026-01-02T03:04:05Z","age_seconds":3725.4,"relay_name":"r","kafka_offsets":null},"dead_letters":{"pending":0,"dead":0},"failover":{"server_version":"17.2","supported":true,"slot_failover":false,"slot_synced":false,"synchronized_standby_slots":""}}`,
			want: `slot                        lost
server                      primary
active                      no (relay not connected)
wal_status                  lost
confirmed lsn               0/10
server wal end              1/0
lag                         4.0 GiB
retained wal                1.5 KiB
safe wal size               -2.0 KiB (past the limit) of max_slot_wal_keep_size 1.0 MiB
invalidated                 wal_removed
oldest unrelayed            0s (from the slot)
stored checkpoint           0/10 (1h2m5s ago, by r)
kafka offsets               none stored (at-least-once delivery, or no checkpoint with offsets yet)
dead letters not completed  0 
failover                    failover slot no, synced no, synchronized_standby_slots unset (PostgreSQL 17.2)
`,
		},
		{
			name:   "no WAL limit, age unknown, offsets stored empty",
			report: `{"slot":"nolimit","server":"primary","slot_exists":true,"active":false,"wal_status":"extended","server_wal_end":"0/100","confirmed_lsn":"0/100","lag_bytes":0,"retained_wal_bytes":512,"max_slot_wal_keep_size_bytes":-1,"oldest_unrelayed_age_seconds":null,"oldest_unrelayed_error":"peek slot: timeout","checkpoint":{"lsn":"0/100","updated_at":"2026-01-02T03:04:05Z","age_seconds":1,"relay_name":"r","kafka_offsets":{}}}`,
			want: `slot               nolimit
server             primary
active             no (relay not connected)
wal_status         extended
confirmed lsn      0/100
server wal end     0/100
lag                0 B
retained wal       512 B
safe wal size      no limit (max_slot_wal_keep_size = -1)
oldest unrelayed   unknown: peek slot: timeout
stored checkpoint  0/100 (1s ago, by r)
kafka offsets      stored, no records written yet
`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r Report
			if err := json.Unmarshal([]byte(tt.report), &r); err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			if err := WriteText(&b, r, "--json shows all"); err != nil {
				t.Fatal(err)
			}
			if got := b.String(); got != tt.want {
				t.Errorf("text\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}

// TestOffsetLines: how the text report prints stored Kafka offsets, one line
// per topic.
func TestOffsetLines(t *testing.T) {
	many := map[int32]int64{}
	for p := range int32(256) {
		many[p] = int64(p) * 1000
	}
	tests := []struct {
		name string
		in   checkpoint.Offsets
		want []string
	}{
		{"none stored", nil, []string{"none stored (at-least-once delivery, or no checkpoint with offsets yet)"}},
		{"stored empty", checkpoint.Offsets{}, []string{"stored, no records written yet"}},
		{"topics by name, partitions in numeric order", checkpoint.Offsets{
			"payments": {Partitions: 1, Next: map[int32]int64{0: 42}},
			"orders":   {Partitions: 12, Next: map[int32]int64{10: 1, 2: 20, 0: 0, 11: 3, 1: 5, 3: 4, 4: 4, 5: 5, 6: 6, 7: 7, 8: 8, 9: 9}},
		}, []string{
			"orders (12 partitions): 0=0 1=5 2=20 3=4 4=4 5=5 6=6 7=7 8=8 9=9 10=1 11=3",
			"payments (1 partition): 0=42",
		}},
		{"partitions not written", checkpoint.Offsets{
			"orders": {Partitions: 8, Next: map[int32]int64{5: 50}},
			"quiet":  {Partitions: 3},
		}, []string{
			"orders (8 partitions, 1 written): 5=50",
			"quiet (3 partitions, 0 written): no records written",
		}},
		{"many partitions stay one short line", checkpoint.Offsets{"orders": {Partitions: 256, Next: many}}, []string{
			"orders (256 partitions): 0=0 1=1000 2=2000 3=3000 4=4000 5=5000 6=6000 7=7000 8=8000 9=9000 " +
				"10=10000 11=11000 12=12000 13=13000 14=14000 15=15000 … 240 more (--json shows all)",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := offsetLines(tt.in, "--json shows all"); !slices.Equal(got, tt.want) {
				t.Errorf("offsetLines =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}
