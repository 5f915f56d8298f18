package deadletter

import (
	"testing"

	"github.com/cdc-relay/cdc-relay/internal/letterstate"
)

// TestStatusListIsTheStateModel: the CHECK constraint's list is the shared
// state model's, plus the legacy 'replayed'.
func TestStatusListIsTheStateModel(t *testing.T) {
	if want := letterstate.SQLList(StatusReplayed); statusList != want {
		t.Errorf("statusList = %s, want %s", statusList, want)
	}
}
