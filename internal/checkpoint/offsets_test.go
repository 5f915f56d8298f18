package checkpoint

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestOffsetsClone(t *testing.T) {
	tests := []struct {
		name string
		in   Offsets
	}{
		{"nil stays nil", nil},
		{"empty stays empty", Offsets{}},
		{"topic without records", Offsets{"orders": {Partitions: 3}}},
		{"topics", Offsets{
			"orders":   {Partitions: 8, Next: map[int32]int64{0: 1, 7: 70}},
			"payments": {Partitions: 1, Next: map[int32]int64{0: 5}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.in.Clone()
			if !reflect.DeepEqual(c, tt.in) || (c == nil) != (tt.in == nil) {
				t.Fatalf("Clone() = %#v, want %#v", c, tt.in)
			}
			// Changing the copy, at every depth, leaves the original as it was.
			want := tt.in.Clone()
			for topic, to := range c {
				for p := range to.Next {
					to.Next[p]++
				}
				if to.Next != nil {
					to.Next[99] = 1
				}
				c[topic] = TopicOffsets{Partitions: to.Partitions + 1, Next: to.Next}
			}
			if c != nil {
				c["added"] = TopicOffsets{}
			}
			if !reflect.DeepEqual(tt.in, want) {
				t.Errorf("changing the clone changed the original: %#v, want %#v", tt.in, want)
			}
		})
	}
}

// TestOffsetsJSON: the stored form, which operators read in checkpoint files
// and in status --json, lists partitions in numeric order and round-trips.
func TestOffsetsJSON(t *testing.T) {
	tests := []struct {
		name string
		in   Offsets
		want string
	}{
		{"nil", nil, `null`},
		{"empty", Offsets{}, `{}`},
		{"nil next", Offsets{"t": {Partitions: 2}}, `{"t":{"partitions":2,"next":{}}}`},
		{"numeric order", Offsets{"orders": {Partitions: 12, Next: map[int32]int64{10: 5, 2: 9223372036854775807, 0: 0}}},
			`{"orders":{"partitions":12,"next":{"0":0,"2":9223372036854775807,"10":5}}}`},
		{"topics sorted", Offsets{"b": {Partitions: 1, Next: map[int32]int64{0: 1}}, "a": {Partitions: 1, Next: map[int32]int64{0: 2}}},
			`{"a":{"partitions":1,"next":{"0":2}},"b":{"partitions":1,"next":{"0":1}}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := json.Marshal(tt.in)
			if err != nil {
				t.Fatalf("Marshal: %v", err)
			}
			if string(b) != tt.want {
				t.Fatalf("Marshal = %s, want %s", b, tt.want)
			}
			got, err := decodeOffsets(b)
			if err != nil {
				t.Fatalf("decode %s: %v", b, err)
			}
			want := tt.in
			for topic, to := range want { // a nil Next is written as {}
				if to.Next == nil {
					want = want.Clone()
					want[topic] = TopicOffsets{Partitions: to.Partitions, Next: map[int32]int64{}}
				}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("decode %s = %#v, want %#v", b, got, want)
			}
		})
	}
}
