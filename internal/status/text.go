package status

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cdc-relay/cdc-relay/internal/checkpoint"
)

// WriteJSON writes r as indented JSON.
func WriteJSON(w io.Writer, r Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("write status: %w", err)
	}
	return nil
}

// WriteText writes r as a table, one fact a line. A topic's Kafka offsets
// line lists its first partitions only, then "… N more (showAll)": showAll
// says, in the caller's words, what shows them all (the JSON report).
func WriteText(w io.Writer, r Report, showAll string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "slot\t%s\n", r.Slot)
	if r.Server == "standby" {
		fmt.Fprintf(tw, "server\tstandby (the slot and the decoding are here; the relay writes its checkpoint and dead letters to the primary)\n")
	} else {
		fmt.Fprintf(tw, "server\t%s\n", r.Server)
	}
	if r.SlotExists {
		who := "no (relay not connected)"
		if r.Active {
			who = fmt.Sprintf("yes (pid %d)", r.ActivePID)
		}
		fmt.Fprintf(tw, "active\t%s\n", who)
		fmt.Fprintf(tw, "wal_status\t%s\n", r.WALStatus)
		fmt.Fprintf(tw, "confirmed lsn\t%s\n", r.ConfirmedLSN)
		fmt.Fprintf(tw, "server wal end\t%s\n", r.ServerWALEnd)
		fmt.Fprintf(tw, "lag\t%s\n", bytesHuman(r.LagBytes))
		fmt.Fprintf(tw, "retained wal\t%s\n", bytesHuman(r.RetainedWALBytes))
		writeSlotHealth(tw, r)
	} else {
		fmt.Fprintf(tw, "exists\tno\n")
	}
	switch {
	case r.OldestUnrelayedAge != nil:
		from := "the " + r.OldestUnrelayedSource
		if r.OldestUnrelayedSource == "checkpoint" && r.Checkpoint != nil {
			from = fmt.Sprintf("the checkpoint the running relay wrote %s ago", time.Duration(r.Checkpoint.AgeSeconds*float64(time.Second)).Round(100*time.Millisecond))
		}
		fmt.Fprintf(tw, "oldest unrelayed\t%s (from %s)\n", time.Duration(*r.OldestUnrelayedAge*float64(time.Second)).Round(time.Millisecond), from)
	case r.OldestUnrelayedError != "":
		fmt.Fprintf(tw, "oldest unrelayed\tunknown: %s\n", r.OldestUnrelayedError)
	}
	if r.Checkpoint != nil {
		fmt.Fprintf(tw, "stored checkpoint\t%s (%s ago, by %s)\n", r.Checkpoint.LSN,
			time.Duration(r.Checkpoint.AgeSeconds*float64(time.Second)).Round(time.Second), r.Checkpoint.RelayName)
	} else {
		fmt.Fprintf(tw, "stored checkpoint\tnone\n")
	}
	var offsets checkpoint.Offsets
	if r.Checkpoint != nil {
		offsets = r.Checkpoint.KafkaOffsets
	}
	for _, l := range offsetLines(offsets, showAll) {
		fmt.Fprintf(tw, "kafka offsets\t%s\n", l)
	}
	if d := r.DeadLetters; d != nil {
		fmt.Fprintf(tw, "dead letters not completed\t%d%s %s\n", d.Pending, deadText(d.Dead), strings.Join(counts(d.ByCode), " "))
		if len(d.BySourceTable) > 0 {
			fmt.Fprintf(tw, "dead letters by table\t%s\n", strings.Join(counts(d.BySourceTable), " "))
		}
	}
	if f := r.Failover; f != nil {
		fmt.Fprintf(tw, "failover\t%s\n", failoverLine(*f, r.SlotExists))
	}
	for _, p := range r.Problems {
		fmt.Fprintf(tw, "PROBLEM\t%s\n", p)
	}
	for _, w := range r.Warnings {
		fmt.Fprintf(tw, "WARNING\t%s\n", w)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write status: %w", err)
	}
	return nil
}

// counts renders name=n pairs, sorted.
func counts(by map[string]int64) []string {
	parts := []string{}
	for name, n := range by {
		parts = append(parts, fmt.Sprintf("%s=%d", name, n))
	}
	slices.Sort(parts)
	return parts
}

// deadText says how many letters are dead, "" when none are.
func deadText(n int64) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" (%d dead)", n)
}

// writeSlotHealth writes the health columns the server reports.
func writeSlotHealth(w io.Writer, r Report) {
	switch {
	case r.WALKeepSizeBytes != nil && *r.WALKeepSizeBytes < 0:
		fmt.Fprintf(w, "safe wal size\tno limit (max_slot_wal_keep_size = -1)\n")
	case r.SafeWALSizeBytes != nil && r.WALKeepSizeBytes != nil:
		safe := bytesHuman(*r.SafeWALSizeBytes)
		if *r.SafeWALSizeBytes < 0 {
			safe = "-" + bytesHuman(-*r.SafeWALSizeBytes) + " (past the limit)"
		}
		fmt.Fprintf(w, "safe wal size\t%s of max_slot_wal_keep_size %s\n", safe, bytesHuman(*r.WALKeepSizeBytes))
	}
	if r.Conflicting != nil {
		fmt.Fprintf(w, "conflicting\t%t\n", *r.Conflicting)
	}
	if r.InvalidatedReason != "" {
		fmt.Fprintf(w, "invalidated\t%s\n", r.InvalidatedReason)
	}
	if r.InactiveSince != nil {
		fmt.Fprintf(w, "inactive since\t%s (%s ago)\n", r.InactiveSince.UTC().Format(time.RFC3339), time.Since(*r.InactiveSince).Round(time.Second))
	}
}

// failoverLine says in one line whether the slot survives a failover.
func failoverLine(f Failover, slotExists bool) string {
	yes := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}
	if !f.Supported {
		return fmt.Sprintf("no failover slots on PostgreSQL %s (17+): a promotion loses the slot", f.ServerVersion)
	}
	standbys := f.SynchronizedStandbySlots
	if standbys == "" {
		standbys = "unset"
	}
	slot := "no slot"
	if slotExists {
		slot = "failover slot " + yes(f.SlotFailover) + ", synced " + yes(f.SlotSynced)
	}
	return fmt.Sprintf("%s, synchronized_standby_slots %s (PostgreSQL %s)", slot, standbys, f.ServerVersion)
}

// maxOffsetsShown bounds the partitions a text line lists per topic, so that a
// topic of hundreds of partitions stays one readable line; the JSON report
// shows all.
const maxOffsetsShown = 16

// offsetLines renders stored Kafka offsets as one line per topic, by name:
// "orders (8 partitions): 0=123 1=456 …", partitions in numeric order; a
// line cut short says "… N more (showAll)".
func offsetLines(o checkpoint.Offsets, showAll string) []string {
	if o == nil {
		return []string{"none stored (at-least-once delivery, or no checkpoint with offsets yet)"}
	}
	if len(o) == 0 {
		return []string{"stored, no records written yet"}
	}
	var lines []string
	for _, topic := range slices.Sorted(maps.Keys(o)) {
		t := o[topic]
		head := fmt.Sprintf("%s (%d partitions", topic, t.Partitions)
		if t.Partitions == 1 {
			head = strings.TrimSuffix(head, "s")
		}
		if len(t.Next) < t.Partitions {
			head += fmt.Sprintf(", %d written", len(t.Next))
		}
		parts := slices.Sorted(maps.Keys(t.Next))
		var b strings.Builder
		b.WriteString(head + "):")
		if len(parts) == 0 {
			b.WriteString(" no records written")
		}
		for i, p := range parts {
			if i == maxOffsetsShown {
				fmt.Fprintf(&b, " … %d more (%s)", len(parts)-i, showAll)
				break
			}
			fmt.Fprintf(&b, " %d=%d", p, t.Next[p])
		}
		lines = append(lines, b.String())
	}
	return lines
}

// bytesHuman formats n bytes in binary units: 512 B, 1.5 KiB, 3.0 GiB.
func bytesHuman(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
