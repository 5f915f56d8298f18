package pgtext

import (
	"strings"
	"testing"
	"time"
)

// TestParseISOAgreesWithTimeParse: the fast path reads what
// time.Parse reads, and declines (for the slow path) what it cannot.
func TestParseISOAgreesWithTimeParse(t *testing.T) {
	tests := []struct {
		text   string
		noZone bool
		ok     bool
	}{
		{"2021-03-04 03:06:07.891+00", false, true},
		{"2021-03-04 08:36:07.891234+05:30", false, true},
		{"1969-12-31 23:59:59.999999-03:30:15", false, true},
		{"2024-02-29 00:00:00+14", false, true},
		{"2021-03-04 03:06:07", true, true},
		{"2021-03-04 03:06:07.1", true, true},
		{"2021-03-04 03:06:07.123456789", true, true},
		{"2023-02-29 00:00:00+00", false, false}, // no such day
		{"2021-03-04 03:06:07.+00", false, false},
		{"2021-03-04 03:06:07", false, false}, // timestamptz needs its zone
		{"2021-03-04 24:00:00+00", false, false},
		{"12021-03-04 03:06:07+00", false, false},
		{"2021-03-04 03:06:07+00 BC", false, false},
		{"2021-03-04 03:06:07+0", false, false},
	}
	for _, tc := range tests {
		got, ok := parseISO([]byte(tc.text), tc.noZone)
		if ok != tc.ok {
			t.Errorf("parseISO(%q) ok = %v, want %v", tc.text, ok, tc.ok)
			continue
		}
		if !ok {
			continue
		}
		layouts := zonedLayouts
		if tc.noZone {
			layouts = []string{localLayout}
		}
		var want time.Time
		var err error
		for _, l := range layouts {
			if want, err = time.Parse(l, tc.text); err == nil {
				break
			}
		}
		if err != nil || !got.Equal(want) {
			t.Errorf("parseISO(%q) = %s, time.Parse = %s, %v", tc.text, got, want, err)
		}
	}
}

// TestTimestamps covers what the callers see: values in UTC, and errors that
// name the value for what neither path reads.
func TestTimestamps(t *testing.T) {
	utc := func(s string) time.Time {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			panic(err)
		}
		return t.UTC()
	}
	tests := []struct {
		text    string
		zoned   bool
		want    time.Time
		wantErr bool
	}{
		{"2021-03-04 08:36:07.891234+05:30", true, utc("2021-03-04T03:06:07.891234Z"), false},
		{"2021-03-04 03:06:07+00", true, utc("2021-03-04T03:06:07Z"), false},
		{"12021-03-04 03:06:07+00", true, time.Time{}, true}, // time.Parse reads 4-digit years only
		{"2021-03-04 03:06:07.5", false, utc("2021-03-04T03:06:07.5Z"), false},
		{"2021-03-04 03:06:07 BC", false, time.Time{}, true},
		{"2021-03-04 03:06:07", true, time.Time{}, true}, // a timestamptz has its zone
		{"infinity", true, time.Time{}, true},
		{"-infinity", false, time.Time{}, true},
		{"04/03/2021 03:06:07", false, time.Time{}, true}, // DateStyle SQL
	}
	for _, tt := range tests {
		read, kind := Timestamp, "Timestamp"
		if tt.zoned {
			read, kind = TimestampTZ, "TimestampTZ"
		}
		got, err := read([]byte(tt.text))
		if (err != nil) != tt.wantErr {
			t.Errorf("%s(%q) error = %v, want error %v", kind, tt.text, err, tt.wantErr)
			continue
		}
		if err != nil {
			if want := `"` + tt.text + `"`; !strings.Contains(err.Error(), want) {
				t.Errorf("%s(%q) error %q does not name the value", kind, tt.text, err)
			}
			continue
		}
		if !got.Equal(tt.want) || got.Location() != time.UTC {
			t.Errorf("%s(%q) = %s, want %s in UTC", kind, tt.text, got, tt.want)
		}
	}
}
