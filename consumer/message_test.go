package consumer

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
	"github.com/cdc-relay/cdc-relay/internal/sink"
)

func TestFromKafka(t *testing.T) {
	ts := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		in   kafka.Message
		want Message
		// helpers: event type, aggregate type, correlation id, schema version
		helpers [4]string
		claimID string
	}{
		{
			name: "every relay header",
			in: kafka.Message{Topic: "outbox.player", Partition: 2, Offset: 41, Key: []byte("p-1"), Value: []byte(`{"points":5}`), Time: ts,
				Headers: []kafka.Header{
					{Key: "id", Value: []byte("e-1")}, {Key: "event_type", Value: []byte("RewardGranted")},
					{Key: "aggregate_type", Value: []byte("player")}, {Key: "correlation_id", Value: []byte("req-7")},
					{Key: "schema_version", Value: []byte("3")}, {Key: "commit_lsn", Value: []byte("0/16B3748")},
				}},
			want: Message{ID: "e-1", Topic: "outbox.player", Partition: 2, Offset: 41, Key: []byte("p-1"), Value: []byte(`{"points":5}`), Timestamp: ts,
				Headers: map[string]string{"id": "e-1", "event_type": "RewardGranted", "aggregate_type": "player",
					"correlation_id": "req-7", "schema_version": "3", "commit_lsn": "0/16B3748"}},
			helpers: [4]string{"RewardGranted", "player", "req-7", "3"},
			claimID: "e-1",
		},
		{
			name: "a repeated header: the last wins",
			in: kafka.Message{Topic: "t", Headers: []kafka.Header{
				{Key: "id", Value: []byte("first")}, {Key: "id", Value: []byte("second")}}},
			want:    Message{ID: "second", Topic: "t", Headers: map[string]string{"id": "second"}},
			claimID: "second",
		},
		{
			name:    "no headers: no id",
			in:      kafka.Message{Topic: "t", Partition: 1, Offset: 9},
			want:    Message{Topic: "t", Partition: 1, Offset: 9},
			claimID: "no-id:t:1:9",
		},
		{
			name:    "an empty id is no id",
			in:      kafka.Message{Topic: "t", Offset: 3, Headers: []kafka.Header{{Key: "id", Value: nil}}},
			want:    Message{Topic: "t", Offset: 3, Headers: map[string]string{"id": ""}},
			claimID: "no-id:t:0:3",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := fromKafka(tc.in)
			if got.ID != tc.want.ID || got.Topic != tc.want.Topic || got.Partition != tc.want.Partition || got.Offset != tc.want.Offset ||
				string(got.Key) != string(tc.want.Key) || string(got.Value) != string(tc.want.Value) || !got.Timestamp.Equal(tc.want.Timestamp) {
				t.Errorf("fromKafka = %+v, want %+v", got, tc.want)
			}
			if len(got.Headers) != len(tc.want.Headers) {
				t.Errorf("headers = %v, want %v", got.Headers, tc.want.Headers)
			}
			for k, v := range tc.want.Headers {
				if got.Header(k) != v {
					t.Errorf("Header(%q) = %q, want %q", k, got.Header(k), v)
				}
			}
			h := [4]string{got.EventType(), got.AggregateType(), got.CorrelationID(), got.SchemaVersion()}
			if h != tc.helpers {
				t.Errorf("EventType, AggregateType, CorrelationID, SchemaVersion = %q, want %q", h, tc.helpers)
			}
			if got.claimID() != tc.claimID {
				t.Errorf("claimID = %q, want %q", got.claimID(), tc.claimID)
			}
		})
	}
}

// TestHeaderNamesMatchTheRelay keeps the header names of this package equal
// to the ones the relay writes.
func TestHeaderNamesMatchTheRelay(t *testing.T) {
	for _, c := range []struct{ ours, relay string }{
		{HeaderID, sink.HeaderID},
		{HeaderEventType, sink.HeaderEventType},
		{HeaderAggregateType, sink.HeaderAggregateType},
		{HeaderCorrelationID, deadletter.HeaderCorrelationID},
		{HeaderSchemaVersion, deadletter.HeaderSchemaVersion},
	} {
		if c.ours != c.relay {
			t.Errorf("header %q here, %q in the relay", c.ours, c.relay)
		}
	}
}

func TestClaimKey(t *testing.T) {
	long := strings.Repeat("x", maxClaimIDLen+1)
	tests := []struct {
		name, id, want string
	}{
		{"uuid", "0b6f0a4e-3d7c-4d43-9a39-7b3f0e1c2a11", "0b6f0a4e-3d7c-4d43-9a39-7b3f0e1c2a11"},
		{"at the limit", strings.Repeat("y", maxClaimIDLen), strings.Repeat("y", maxClaimIDLen)},
		{"over the limit: hashed", long, "sha256:"}, // prefix checked below
		{"NUL byte", "a\x00b", "a\uFFFDb"},
		{"invalid UTF-8", "a\xffb", "a\uFFFDb"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := claimKey(tc.id)
			if tc.want == "sha256:" {
				if !strings.HasPrefix(got, "sha256:") || len(got) != len("sha256:")+64 || got != claimKey(tc.id) {
					t.Errorf("claimKey(long) = %q, want a stable sha256:<64 hex>", got)
				}
				return
			}
			if got != tc.want {
				t.Errorf("claimKey(%q) = %q, want %q", tc.id, got, tc.want)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	pool := &pgxpool.Pool{} // never used: Validate does not connect
	valid := func() Config {
		return Config{Brokers: []string{"127.0.0.1:9092"}, GroupID: "rewards", Topics: []string{"outbox.player"}, Name: "reward-consumer", Pool: pool}
	}
	tests := []struct {
		name    string
		change  func(*Config)
		wantErr string
	}{
		{"valid", func(*Config) {}, ""},
		{"no brokers", func(c *Config) { c.Brokers = nil }, "Brokers is empty"},
		{"empty broker", func(c *Config) { c.Brokers = []string{""} }, "Brokers has an empty address"},
		{"no group", func(c *Config) { c.GroupID = "" }, "GroupID is empty"},
		{"no topics", func(c *Config) { c.Topics = nil }, "Topics is empty"},
		{"empty topic", func(c *Config) { c.Topics = []string{"a", ""} }, "Topics has an empty name"},
		{"no name", func(c *Config) { c.Name = "" }, "Name is empty"},
		{"no pool", func(c *Config) { c.Pool = nil }, "Pool is nil"},
		{"bad dead-letter table", func(c *Config) { c.DeadLetterTable = "a.b.c" }, "field DeadLetterTable"},
		{"dead-letter table with schema", func(c *Config) { c.DeadLetterTable = "ops.dead" }, ""},
		{"bad retry", func(c *Config) { c.Retry.Cap = time.Nanosecond }, "Cap must not be below Base"},
		{"negative timeout", func(c *Config) { c.SessionTimeout = -1 }, "must not be negative"},
		{"heartbeat not below session", func(c *Config) { c.SessionTimeout, c.HeartbeatInterval = time.Second, time.Second }, "HeartbeatInterval must be shorter"},
		{"two problems at once", func(c *Config) { c.GroupID, c.Name = "", "" }, "GroupID is empty; Name is empty"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.change(&c)
			err := c.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Validate = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}
