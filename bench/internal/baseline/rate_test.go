package baseline

import (
	"strings"
	"testing"
	"time"

	"github.com/cdc-relay/cdc-relay/bench/internal/results"
)

// tableCell builds a table cell of rate rows/s, others taking busy of the
// machine, every row in Kafka once unless lost.
func tableCell(name string, rate, busy float64, lost int) results.TableCell {
	return results.TableCell{Name: name, Kind: results.KindReplay, Rows: 100000,
		Run:   results.Drain{Rate: rate, ForeignShare: busy},
		Kafka: results.Verify{Missing: lost, OK: lost == 0}}
}

func TestCompareRate(t *testing.T) {
	base := Cell{RowsPerSecond: 60000}
	tests := []struct {
		name      string
		base      Cell
		now       results.TableCell
		mark      string
		change    float64
		threshold float64
	}{
		{"25% fewer rows/s, quiet machine", base, tableCell("c", 45000, 0.05, 0), Drop, -0.25, 0.20},
		{"25% fewer rows/s, busy machine", base, tableCell("c", 45000, 0.30, 0), DownBusy, -0.25, 0.20},
		{"busy exactly at the bound counts", base, tableCell("c", 45000, BusyShare, 0), Drop, -0.25, 0.20},
		{"within the threshold", base, tableCell("c", 51000, 0, 0), OK, -0.15, 0.20},
		{"25% more rows/s", base, tableCell("c", 75000, 0, 0), Higher, 0.25, 0.20},
		{"a spread recorded: the threshold", Cell{RowsPerSecond: 60000, Spread: 0.08}, tableCell("c", 54000, 0, 0), Drop, -0.10, 0.08},
		{"a small spread: at least 5%", Cell{RowsPerSecond: 60000, Spread: 0.01}, tableCell("c", 57600, 0, 0), OK, -0.04, 0.05},
		{"no baseline figure", Cell{EOUS: 4}, tableCell("c", 45000, 0, 0), NoFigures, 0, 0.20},
		{"the cell measured nothing", base, tableCell("c", 0, 0, 0), NoFigures, 0, 0.20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := CompareRate(tt.base, tt.now)
			if v.Mark != tt.mark || !near(v.Change, tt.change) || !near(v.Threshold, tt.threshold) {
				t.Errorf("CompareRate = %+v, want mark %q, change %v, threshold %v", v, tt.mark, tt.change, tt.threshold)
			}
		})
	}
}

func TestRateVerdictString(t *testing.T) {
	v := CompareRate(Cell{RowsPerSecond: 60000}, tableCell("c", 45000, 0.05, 0))
	want := "45000 rows/s (baseline 60000, -25.0%), other processes 5% of the machine, threshold 20%: DROP"
	if got := v.String(); got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

func TestRecordTableCells(t *testing.T) {
	started := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	tests := []struct {
		name    string
		cells   []results.TableCell
		want    map[string]Cell
		wantErr string
	}{
		{
			name:  "rows/s of each cell",
			cells: []results.TableCell{tableCell("replay/rows=100000", 61000, 0, 0), tableCell("join/rows=100000", 52000, 0.2, 0)},
			want: map[string]Cell{
				"replay/rows=100000": {Recorded: "2026-12-07T01:00:00Z", Load: 0.4, RowsPerSecond: 61000},
				"join/rows=100000":   {Recorded: "2026-12-07T01:00:00Z", Load: 0.4, RowsPerSecond: 52000},
			},
		},
		{name: "rows lost", cells: []results.TableCell{tableCell("replay/rows=100000", 61000, 0, 3)}, wantErr: "3 rows lost"},
		{name: "no rate", cells: []results.TableCell{tableCell("join/rows=100000", 0, 0, 0)}, wantErr: "not a baseline"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Record(&results.Results{Started: started, Host: results.Host{LoadAvgStart: 0.4}, TableCells: tt.cells})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Record error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("Record = %+v, want %+v", got, tt.want)
			}
			for name, w := range tt.want {
				if got[name] != w {
					t.Errorf("%s: %+v, want %+v", name, got[name], w)
				}
			}
		})
	}
}
