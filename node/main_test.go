package node

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind: Close
// must release everything a Node started.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// memberlist's Shutdown does not wait for a probe in flight; the
		// probe returns by itself within the probe timeout.
		goleak.IgnoreTopFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"),
	)
}
