package runner

import (
	"context"
	"testing"
	"time"
)

func TestLogWatch(t *testing.T) {
	w := newLogWatch(reconcileMessage)
	want := `{"level":"info","partitions":8,"duration_ms":3,"already_in_kafka":41,"message":"reconciled 8 partitions in 3 ms, 41 events already in Kafka"}`
	// A line about reconciling that is not the start-up line, then the line
	// split across writes, then a second one that must not replace it.
	for _, chunk := range []string{
		`{"level":"info","message":"reconciled a topic on its first replayed event","partitions":1}` + "\n",
		`{"level":"info","message":"starting"}` + "\n" + want[:30],
		want[30:] + "\n",
		`{"level":"info","message":"reconciled 0 partitions in 0 ms, 0 events already in Kafka"}` + "\n",
	} {
		if _, err := w.Write([]byte(chunk)); err != nil {
			t.Fatal(err)
		}
	}
	got, err := w.wait(context.Background(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("line %q, want %q", got, want)
	}
}
