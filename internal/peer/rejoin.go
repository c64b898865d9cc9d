package peer

import (
	"slices"
	"time"

	"github.com/lockmesh/lockmesh/internal/datadir"
)

// knownPeersEvery is how often the known peers file (internal/datadir) is
// brought up to date; it is written only when the set of addresses
// changed.
const knownPeersEvery = time.Second

// knownPeersLoop keeps the known peers file current.
func (n *Peer) knownPeersLoop() {
	var saved []string
	n.every(knownPeersEvery, func() {
		p := n.placement.Load()
		if p == nil {
			return
		}
		addrs := datadir.ClusterAddrs(n.cfg.Name, p, n.mesh.Members())
		if len(addrs) == 0 || slices.Equal(addrs, saved) {
			return
		}
		if err := n.dir.SaveKnownPeers(addrs); err != nil {
			n.log.Warn("save known peers", "err", err)
			return
		}
		saved = addrs
	})
}
