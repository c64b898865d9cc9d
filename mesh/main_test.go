package mesh

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind, which
// checks that Close releases memberlist and the event dispatcher.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
