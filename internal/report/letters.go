package report

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/cdc-relay/cdc-relay/internal/deadletter"
)

// List is what dlq list shows.
type List struct {
	Letters []deadletter.Letter    // the first letters the filter selects, up to the limit
	Summary []deadletter.CodeCount // every letter the filter selects, per error code
	Total   int64                  // letters the filter selects, beyond the limit too
}

// PrintList prints the letters and the summary as two tables. more is what
// the operator does to see the letters not shown (the command line's words
// for raising its limit), said in parentheses when Letters holds fewer than
// Total; "" says nothing.
func PrintList(w io.Writer, list List, more string) {
	letters, summary, total := list.Letters, list.Summary, list.Total
	if len(letters) == 0 {
		fmt.Fprintln(w, "no dead letters match")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tEVENT ID\tCODE\tAGGREGATE\tTYPE\tTOPIC\tRETRIES\tLAST FAILURE\tSTATUS\tATTEMPTS")
	for _, l := range letters {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%d\n", l.ID, oneLine(l.EventID), oneLine(l.ErrorCode),
			oneLine(l.AggregateType+"/"+l.AggregateID), oneLine(l.EventType), oneLine(l.Topic), l.RetryCount,
			timeText(l.LastFailedAt), statusText(l), l.Attempts)
	}
	tw.Flush()
	fmt.Fprintf(w, "\n%d of %d matching letters shown", len(letters), total)
	if int64(len(letters)) < total && more != "" {
		fmt.Fprintf(w, " (%s)", more)
	}
	fmt.Fprintln(w, "; by error code:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CODE\tLETTERS\tNOT COMPLETED\tDEAD\tFIRST FAILURE\tLAST FAILURE")
	for _, cc := range summary {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\n", oneLine(cc.ErrorCode), cc.Count, cc.Pending, cc.Dead, timeText(cc.Oldest), timeText(cc.Newest))
	}
	tw.Flush()
}

// ListJSON prints list as JSON: its letters (as LettersJSON does), the
// summary per error code and the total.
func ListJSON(w io.Writer, list List) error {
	out := listJSON{Letters: make([]letterJSON, len(list.Letters)), Summary: make([]codeJSON, len(list.Summary)), Total: list.Total}
	for i, l := range list.Letters {
		out.Letters[i] = toJSON(l)
	}
	for i, cc := range list.Summary {
		out.Summary[i] = codeJSON{cc.ErrorCode, cc.Count, cc.Pending, cc.Dead, cc.Oldest.UTC(), cc.Newest.UTC()}
	}
	return WriteJSON(w, "JSON", out)
}

// listJSON is a List in JSON.
type listJSON struct {
	Letters []letterJSON `json:"letters"`
	Summary []codeJSON   `json:"summary"`
	Total   int64        `json:"total"` // letters matching the filters, beyond the limit too
}

type codeJSON struct {
	ErrorCode string    `json:"error_code"`
	Count     int64     `json:"count"`
	Pending   int64     `json:"pending"` // not completed: pending, processing, retry_wait or dead
	Dead      int64     `json:"dead"`
	Oldest    time.Time `json:"first_failed_at"`
	Newest    time.Time `json:"last_failed_at"`
}

// statusText is l's status, with the lease's owner while a replay holds it
// and the time of the next automatic attempt while it waits for one.
func statusText(l deadletter.Letter) string {
	switch {
	case l.Status == deadletter.StatusProcessing && l.ClaimedUntil != nil:
		return fmt.Sprintf("processing (%s until %s)", oneLine(l.ClaimedBy), timeText(*l.ClaimedUntil))
	case l.Status == deadletter.StatusRetryWait && l.NextAttemptAt != nil:
		return fmt.Sprintf("retry_wait (until %s)", timeText(*l.NextAttemptAt))
	}
	return l.Status
}

// PrintLetters prints each letter with every field, its headers and its
// payload, a blank line between letters.
func PrintLetters(w io.Writer, letters []deadletter.Letter) {
	for i, l := range letters {
		if i > 0 {
			fmt.Fprintln(w)
		}
		printLetter(w, l)
	}
}

// LettersJSON prints the letters as JSON: an object for one letter, an
// array for several.
func LettersJSON(w io.Writer, letters []deadletter.Letter) error {
	if len(letters) == 1 {
		return WriteJSON(w, "JSON", toJSON(letters[0]))
	}
	out := make([]letterJSON, len(letters))
	for i, l := range letters {
		out[i] = toJSON(l)
	}
	return WriteJSON(w, "JSON", out)
}

// printLetter prints l as a list of fields, then its headers and payload.
func printLetter(w io.Writer, l deadletter.Letter) {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	row := func(k, v string) {
		if v == "" {
			v = "-"
		}
		fmt.Fprintf(tw, "%s:\t%s\n", k, v)
	}
	row("id", fmt.Sprint(l.ID))
	row("event id", l.EventID)
	status := statusText(l)
	if l.ReplayedAt != nil {
		status += fmt.Sprintf(" (replayed %d times, last at %s)", l.ReplayCount, timeText(*l.ReplayedAt))
	}
	row("status", status)
	attempts := fmt.Sprint(l.Attempts)
	if l.LastAttemptAt != nil {
		attempts += " (last at " + timeText(*l.LastAttemptAt) + ")"
	}
	row("attempts", attempts)
	row("last attempt error", l.LastAttemptError)
	row("error code", l.ErrorCode)
	row("error message", l.ErrorMessage)
	row("retries", fmt.Sprint(l.RetryCount))
	row("first failure", timeText(l.FirstFailedAt))
	row("last failure", timeText(l.LastFailedAt))
	row("topic", l.Topic)
	if l.SourceTable != "" {
		row("source table", l.SourceTable)
	}
	row("aggregate type", l.AggregateType)
	row("aggregate id", l.AggregateID)
	row("event type", l.EventType)
	row("payload type", l.PayloadType.String())
	switch {
	case l.Key == nil:
		row("key", "(none)")
	case utf8.Valid(l.Key):
		row("key", fmt.Sprintf("%q", l.Key))
	default:
		row("key", "0x"+hex.EncodeToString(l.Key))
	}
	lsn := "(unknown)"
	if l.CommitLSN != 0 {
		lsn = l.CommitLSN.String()
	}
	row("commit lsn", lsn)
	row("relay", l.RelayName)
	row("correlation id", l.CorrelationID)
	row("schema version", l.SchemaVersion)
	tw.Flush()
	fmt.Fprintln(w, "headers:")
	for _, k := range slices.Sorted(maps.Keys(l.Headers)) {
		fmt.Fprintf(w, "  %s: %s\n", k, l.Headers[k])
	}
	var pretty bytes.Buffer
	switch {
	case json.Valid(l.Payload) && json.Indent(&pretty, l.Payload, "", "  ") == nil:
		fmt.Fprintf(w, "payload (JSON, %d bytes):\n%s\n", len(l.Payload), pretty.Bytes())
	case utf8.Valid(l.Payload):
		fmt.Fprintf(w, "payload (text, %d bytes):\n%s\n", len(l.Payload), l.Payload)
	default:
		fmt.Fprintf(w, "payload (binary, %d bytes):\n%s", len(l.Payload), hex.Dump(l.Payload))
	}
}

// letterJSON is a dead letter in JSON output. Key and payload are strings or
// JSON when they can be, base64 otherwise.
type letterJSON struct {
	ID            int64             `json:"id"`
	EventID       string            `json:"event_id"`
	AggregateType string            `json:"aggregate_type"`
	AggregateID   string            `json:"aggregate_id"`
	EventType     string            `json:"event_type"`
	Key           *string           `json:"key"` // null: no key
	KeyBase64     string            `json:"key_base64,omitempty"`
	Payload       json.RawMessage   `json:"payload,omitempty"` // when it is JSON
	PayloadBase64 string            `json:"payload_base64,omitempty"`
	Headers       map[string]string `json:"headers"`
	Topic         string            `json:"topic"`
	ErrorCode     string            `json:"error_code"`
	ErrorMessage  string            `json:"error_message"`
	RetryCount    int               `json:"retry_count"`
	FirstFailedAt time.Time         `json:"first_failed_at"`
	LastFailedAt  time.Time         `json:"last_failed_at"`
	RelayName     string            `json:"relay_name"`
	CorrelationID string            `json:"correlation_id,omitempty"`
	SchemaVersion string            `json:"schema_version,omitempty"`
	CommitLSN     string            `json:"commit_lsn,omitempty"`
	SourceTable   string            `json:"source_table,omitempty"`
	Status        string            `json:"status"`
	ReplayedAt    *time.Time        `json:"replayed_at"`
	ReplayCount   int               `json:"replay_count"`
	Attempts      int               `json:"attempts"`
	NextAttemptAt *time.Time        `json:"next_attempt_at"`
	LastAttemptAt *time.Time        `json:"last_attempt_at"`
	LastError     string            `json:"last_attempt_error,omitempty"`
	ClaimedBy     string            `json:"claimed_by,omitempty"`
	ClaimedUntil  *time.Time        `json:"claimed_until"`
}

// toJSON is l as dlq list and dlq show print it in JSON.
func toJSON(l deadletter.Letter) letterJSON {
	j := letterJSON{
		ID: l.ID, EventID: l.EventID, AggregateType: l.AggregateType, AggregateID: l.AggregateID,
		EventType: l.EventType, Headers: l.Headers, Topic: l.Topic, ErrorCode: l.ErrorCode,
		ErrorMessage: l.ErrorMessage, RetryCount: l.RetryCount, FirstFailedAt: l.FirstFailedAt.UTC(),
		LastFailedAt: l.LastFailedAt.UTC(), RelayName: l.RelayName, CorrelationID: l.CorrelationID,
		SchemaVersion: l.SchemaVersion, SourceTable: l.SourceTable, Status: l.Status, ReplayCount: l.ReplayCount,
		Attempts: l.Attempts, NextAttemptAt: utc(l.NextAttemptAt), LastAttemptAt: utc(l.LastAttemptAt),
		LastError: l.LastAttemptError, ClaimedBy: l.ClaimedBy, ClaimedUntil: utc(l.ClaimedUntil),
	}
	if l.Key != nil {
		if utf8.Valid(l.Key) {
			k := string(l.Key)
			j.Key = &k
		} else {
			j.KeyBase64 = base64.StdEncoding.EncodeToString(l.Key)
		}
	}
	if json.Valid(l.Payload) {
		j.Payload = json.RawMessage(l.Payload)
	} else {
		j.PayloadBase64 = base64.StdEncoding.EncodeToString(l.Payload)
	}
	if l.CommitLSN != 0 {
		j.CommitLSN = l.CommitLSN.String()
	}
	j.ReplayedAt = utc(l.ReplayedAt)
	if j.Headers == nil {
		j.Headers = map[string]string{}
	}
	return j
}
