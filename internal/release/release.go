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
// this record: fc10b2a, which had none, is 0.1.0, and this tree is the
// release after it, not yet cut.
const Version = "0.2.0-dev"

// Previous is the full hash of the commit of the previous release, the one
// a rolling upgrade to this tree starts from: fc10b2a, the first release
// with feature levels.
const Previous = "fc10b2ad9a46070909262a717f5bcfe0022f044a"

// PreviousVersion names the previous release in logs and messages.
const PreviousVersion = "0.1.0"

// PreviousMinLevel and PreviousMaxLevel are the feature levels the
// previous release speaks. Its peer program has no -version flag to ask,
// so they are recorded here.
const (
	PreviousMinLevel = level.Positional
	PreviousMaxLevel = level.Tagged
)
