package node

import (
	"testing"

	"github.com/lockmesh/lockmesh/internal/client"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// Unexpected results reach users in error texts ("lock %q: status ..."),
// so they name the status rather than print its number.
func TestDescribeNamesStatus(t *testing.T) {
	for _, c := range []struct {
		res  lockfsm.Result
		want string
	}{
		{lockfsm.Result{Status: lockfsm.StatusInvalid, Err: "key too long"}, "status Invalid: key too long"},
		{lockfsm.Result{Status: lockfsm.StatusStaleTerm}, "status StaleTerm"},
		{lockfsm.Result{Status: lockfsm.StatusCancelled}, "status Cancelled"},
	} {
		if got := client.Describe(c.res); got != c.want {
			t.Errorf("client.Describe(%+v) = %q, want %q", c.res, got, c.want)
		}
	}
}
