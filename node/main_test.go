package node

import (
	"bytes"
	"log"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind: Close
// must release everything a Node started.
func TestMain(m *testing.M) {
	log.SetOutput(quietPebble{})
	goleak.VerifyTestMain(m,
		// memberlist's Shutdown does not wait for a probe in flight; the
		// probe returns by itself within the probe timeout.
		goleak.IgnoreTopFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"),
	)
}

// quietPebble drops pebble's "background error: vfs: not supported" lines:
// pebble logs through the standard log package, and dragonboat's in-memory
// file system the tests use does not implement an operation pebble tries in
// the background. Every other line goes to stderr.
type quietPebble struct{}

func (quietPebble) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("vfs: not supported")) {
		return len(p), nil
	}
	return os.Stderr.Write(p)
}
