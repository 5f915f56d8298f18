package waitlog

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/cdc-relay/cdc-relay/internal/sandbox"
	"github.com/cdc-relay/cdc-relay/internal/testenv"
)

// records parses the JSON lines in buf.
func records(t *testing.T, buf *sandbox.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", l)
		}
		out = append(out, m)
	}
	return out
}

// TestWaitLogsFirstProgressAndAnswer checks the lines of a long wait: the
// first names what and where, the next counts the failed attempts with the
// last error, and the answer ends them.
func TestWaitLogsFirstProgressAndAnswer(t *testing.T) {
	var buf sandbox.Buffer
	w := start(zerolog.New(&buf), "Kafka brokers", "127.0.0.1:1", "check --kafka-brokers", 50*time.Millisecond, 100*time.Millisecond)
	w.Failed(errors.New("dial tcp 127.0.0.1:1: connect: connection refused"))
	testenv.Eventually(t, 10*time.Second, func() error {
		if n := len(records(t, &buf)); n < 2 {
			return fmt.Errorf("%d lines", n)
		}
		return nil
	})
	w.Failed(errors.New("second"))
	w.Done(true)
	w.Done(true) // a second Done does nothing
	recs := records(t, &buf)
	first, second, last := recs[0], recs[1], recs[len(recs)-1]
	if first["message"] != "waiting for Kafka brokers at 127.0.0.1:1 (check --kafka-brokers)" || first["level"] != "warn" ||
		first["last_error"] != "dial tcp 127.0.0.1:1: connect: connection refused" || first["failed_attempts"] != 1.0 {
		t.Errorf("first line: %v", first)
	}
	if msg, _ := second["message"].(string); !strings.HasPrefix(msg, "still waiting for Kafka brokers at 127.0.0.1:1 after ") || !strings.HasSuffix(msg, "1 failed attempt") {
		t.Errorf("progress line: %v", second)
	}
	if msg, _ := last["message"].(string); !strings.HasPrefix(msg, "Kafka brokers at 127.0.0.1:1 answered after ") || last["failed_attempts"] != 2.0 {
		t.Errorf("last line: %v", last)
	}
	if n := strings.Count(buf.String(), "answered"); n != 1 {
		t.Errorf("%d answer lines, want 1", n)
	}
	if !w.Logged() || !strings.Contains(w.Summary(), "for Kafka brokers at 127.0.0.1:1, 2 failed attempts") {
		t.Errorf("Logged %v, Summary %q", w.Logged(), w.Summary())
	}
}

// TestShortWaitIsSilent checks that a wait ending before the first line
// logs nothing, answered or not.
func TestShortWaitIsSilent(t *testing.T) {
	var buf sandbox.Buffer
	for _, ok := range []bool{true, false} {
		w := start(zerolog.New(&buf), "Postgres", "db:5432", "", time.Hour, time.Hour)
		w.Failed(errors.New("refused"))
		w.Done(ok)
		if w.Logged() {
			t.Error("Logged after a short wait")
		}
	}
	if buf.String() != "" {
		t.Errorf("a short wait logged:\n%s", buf.String())
	}
}

// TestGivenUpWaitLogsNoAnswer checks that a wait given up (Done(false)) after
// it was logged does not claim an answer: the caller reports the failure.
func TestGivenUpWaitLogsNoAnswer(t *testing.T) {
	var buf sandbox.Buffer
	w := start(zerolog.New(&buf), "Postgres", "db:5432", "", 10*time.Millisecond, time.Hour)
	testenv.Eventually(t, 10*time.Second, func() error {
		if !w.Logged() {
			return errors.New("not logged yet")
		}
		return nil
	})
	w.Done(false)
	if strings.Contains(buf.String(), "answered") {
		t.Errorf("a wait given up logged an answer:\n%s", buf.String())
	}
	if s := w.Summary(); !strings.Contains(s, "the first attempt still unanswered") {
		t.Errorf("Summary %q", s)
	}
}
