package datadir

import (
	"fmt"

	"github.com/lockmesh/lockmesh/internal/layout"
)

// RecordFile is the cluster record: the layout this peer adopted. A peer
// that lost it would come back with Raft data and no cluster, and could
// form a new one.
const RecordFile = "cluster.lockmesh"

// SaveRecord writes layout p as the cluster record, atomically and
// durably (WriteDurably).
func (d Dir) SaveRecord(p *layout.Placement) error {
	raw, err := layout.Encode(p)
	if err != nil {
		return err
	}
	if err := d.WriteDurably(RecordFile, raw); err != nil {
		return fmt.Errorf("cluster record: %w", err)
	}
	return nil
}

// LoadRecord reads the cluster record of the peer name whose Raft data
// has nodeHostID; nil when there is none. It refuses a record that does
// not list name (unless the peer is joining, through Join) and one that
// lists name under another NodeHostID: then part of the dir was deleted,
// replaced or copied, and the error says what to do.
func (d Dir) LoadRecord(name, nodeHostID string, joining bool) (*layout.Placement, error) {
	path := d.path(RecordFile)
	raw, err := d.ReadSmall(RecordFile)
	if raw == nil || err != nil {
		return nil, err
	}
	p, err := layout.Decode(raw)
	if err != nil {
		return nil, fmt.Errorf("cluster record %s is corrupt: %w", path, err)
	}
	if _, ok := p.Peer(name); !ok && !joining {
		return nil, fmt.Errorf("cluster record %s does not list peer %q", path, name)
	}
	if ie := p.CheckIdentity(name, nodeHostID); ie != nil {
		return nil, fmt.Errorf("cluster record %s lists peer %q with NodeHostID %s but the Raft data beside it has %s: "+
			"part of the data dir was deleted or replaced, or it was copied; delete the whole data dir to rejoin as a new peer, or start under a new Name",
			path, name, ie.Listed, ie.Local)
	}
	return p, nil
}
