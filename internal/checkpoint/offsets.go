package checkpoint

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strconv"
)

// Offsets are, per Kafka topic, what the relay had written there when the
// checkpoint was saved.
type Offsets map[string]TopicOffsets

// TopicOffsets is one topic's entry: its partition count when written, and per
// partition the offset right after the relay's last record of an event at or
// before the checkpoint's LSN (where records of later events can start).
type TopicOffsets struct {
	Partitions int             `json:"partitions"`
	Next       map[int32]int64 `json:"next"`
}

// Clone returns a deep copy of o: nil stays nil (none stored) and an empty
// map stays empty (stored, but nothing written), so the copy means the same.
func (o Offsets) Clone() Offsets {
	if o == nil {
		return nil
	}
	c := make(Offsets, len(o))
	for topic, t := range o {
		c[topic] = TopicOffsets{Partitions: t.Partitions, Next: maps.Clone(t.Next)}
	}
	return c
}

// MarshalJSON writes {"partitions":N,"next":{"0":123,"1":456,…}} with the
// partitions in numeric order: encoding/json would sort the keys as text
// ("10" before "2"), which is stable but hard to read in a checkpoint file.
// A nil Next is written as {}.
func (t TopicOffsets) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(`{"partitions":`)
	b.WriteString(strconv.Itoa(t.Partitions))
	b.WriteString(`,"next":{`)
	for i, p := range slices.Sorted(maps.Keys(t.Next)) {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		b.WriteString(strconv.FormatInt(int64(p), 10))
		b.WriteString(`":`)
		b.WriteString(strconv.FormatInt(t.Next[p], 10))
	}
	b.WriteString("}}")
	return b.Bytes(), nil
}

// encodeOffsets returns o as JSON, or nil for nil Offsets (none stored).
func encodeOffsets(o Offsets) ([]byte, error) {
	if o == nil {
		return nil, nil
	}
	return json.Marshal(o)
}

// decodeOffsets parses what encodeOffsets wrote; nil or empty data is nil
// Offsets (none stored).
func decodeOffsets(data []byte) (Offsets, error) {
	if len(data) == 0 {
		return nil, nil
	}
	var o Offsets
	if err := json.Unmarshal(data, &o); err != nil {
		return nil, err
	}
	return o, nil
}
