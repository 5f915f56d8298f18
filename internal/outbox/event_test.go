package outbox

import (
	"testing"
	"unsafe"
)

// TestFootprint: an event in flight costs its values twice (decoded, and
// encoded for Kafka) plus its struct and header slots, however many headers
// are set.
func TestFootprint(t *testing.T) {
	base := int(unsafe.Sizeof(Event{}))
	slot := int(unsafe.Sizeof(Header{}))
	tests := []struct {
		name string
		ev   Event
		want int
	}{
		{"empty", Event{}, 2*64 + base},
		{"values", Event{ID: []byte("id"), AggregateID: []byte("a-1"), Payload: []byte(`{"x":1}`)}, 2*(2+3+7+64) + base},
		{"headers", Event{Payload: []byte("p"), Headers: make([]Header, 1, 4)}, 2*(1+64) + base + 4*slot},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.ev.Footprint(); got != tt.want {
				t.Errorf("Footprint() = %d, want %d (Size %d)", got, tt.want, tt.ev.Size())
			}
		})
	}
}
