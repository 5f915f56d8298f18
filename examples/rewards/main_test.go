package main

import (
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/cdc-relay/cdc-relay/consumer"
)

func TestParseReward(t *testing.T) {
	tests := []struct {
		name      string
		payload   string
		player    string
		points    int64
		permanent bool
	}{
		{"reward", `{"player_id": "p-1", "points": 30}`, "p-1", 30, false},
		{"negative points (a correction)", `{"player_id": "p-1", "points": -5}`, "p-1", -5, false},
		{"zero points", `{"player_id": "p-1", "points": 0}`, "p-1", 0, false},
		{"extra fields", `{"player_id": "p-2", "points": 1, "reason": "boss"}`, "p-2", 1, false},
		{"not json", `points: 3`, "", 0, true},
		{"points not a number", `{"player_id": "p-1", "points": "3"}`, "", 0, true},
		{"points not an integer", `{"player_id": "p-1", "points": 1.5}`, "", 0, true},
		{"no player", `{"points": 3}`, "", 0, true},
		{"no points", `{"player_id": "p-1"}`, "", 0, true},
		{"null payload", ``, "", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := parseReward(consumer.Message{ID: "e-1", Value: []byte(tc.payload)})
			if tc.permanent {
				if err == nil || !consumer.IsPermanent(err) {
					t.Fatalf("parseReward(%s) = %+v, %v; want a permanent error", tc.payload, r, err)
				}
				return
			}
			if err != nil || r.PlayerID != tc.player || r.Points == nil || *r.Points != tc.points {
				t.Fatalf("parseReward(%s) = %+v, %v; want %s %d", tc.payload, r, err, tc.player, tc.points)
			}
		})
	}
}

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name      string
		args      []string
		wantErr   string
		reprocess []int64
	}{
		{"run", []string{"-brokers", "k:9092", "-pg-url", "postgres://x"}, "", nil},
		{"no brokers", []string{"-pg-url", "postgres://x"}, "-brokers is required", nil},
		{"no database", []string{"-brokers", "k:9092"}, "-pg-url is required", nil},
		{"reprocess needs no brokers", []string{"-pg-url", "postgres://x", "-reprocess", "3, 4"}, "", []int64{3, 4}},
		{"bad dead-letter id", []string{"-pg-url", "postgres://x", "-reprocess", "3,x"}, `"x" is not a dead-letter id`, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parse(tc.args, io.Discard)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatal(err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("parse = %v, want an error containing %q", err, tc.wantErr)
			case tc.wantErr == "" && !slices.Equal(o.reprocess, tc.reprocess):
				t.Fatalf("reprocess = %v, want %v", o.reprocess, tc.reprocess)
			}
		})
	}
}
