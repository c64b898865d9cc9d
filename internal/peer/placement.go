package peer

import (
	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/mesh"
)

// metaShardID is the shard holding the layout (layout.MetaShard), named
// once here for the many NodeHost calls on it.
const metaShardID = layout.MetaShard

// sameIdentity reports whether gossip member m is the NodeHost p lists
// under m's name, or a name p does not list. A member that gossips a
// listed name with another NodeHostID is not the peer the layout placed
// replicas on (its data dir was wiped): nothing meant for that peer may
// reach it by name.
func sameIdentity(p *layout.Placement, m mesh.Member) bool {
	return p.CheckIdentity(m.Name, m.Meta.NodeHostID) == nil
}
