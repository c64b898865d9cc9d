// Package release records which release this tree is and which release
// came before it, so that the cross-version test (examples/peer,
// TestUpgradeFromPrevious) knows what to build from git history and run
// against this tree.
//
// Every release that changes a format on disk or on the wire (a new
// feature level, see internal/level and docs/UPGRADING.md) bumps these:
// Version to the new release, Previous to the commit of the release
// before it, and PreviousMinLevel and PreviousMaxLevel to the feature
// levels that commit speaks (`git show <Previous>:node/version.go`; from
// 0.2.0 on, internal/level/level.go).
// Releases are recorded as commits, not tags, because tags are not pushed
// with the repository's history everywhere it is cloned; the test fails,
// rather than skips, when the recorded commit is missing (a shallow clone).
package release

import "github.com/lockmesh/lockmesh/internal/level"

// Version names the release this tree builds. Release numbers start with
// fc10b2a, which had none and is 0.1.0; f846c0d is 0.2.0 (levels 1 to 3,
// the lock family), and this tree is the release after it, not yet cut.
const Version = "0.3.0-dev"

// Previous is the full hash of the commit of the previous release, the one
// a rolling upgrade to this tree starts from: f846c0d, release 0.2.0.
const Previous = "f846c0de941b05ca5fc44ea11ef1c73017e0c49e"

// PreviousVersion names the previous release in logs and messages.
const PreviousVersion = "0.2.0"

// PreviousMinLevel and PreviousMaxLevel are the feature levels the
// previous release speaks. From 0.2.0 on its peer program prints them
// (-version), and the upgrade test reads them there; they are recorded
// here for releases before that, and to check the record.
const (
	PreviousMinLevel = level.Positional
	PreviousMaxLevel = level.Family
)
