package datadir

import (
	"fmt"
	"slices"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/mesh"
)

// KnownPeersFile keeps the gossip addresses of the peers this one last saw
// alive in its cluster. A restarted peer joins through them as well as
// through Config.Join, so it finds its cluster again when every address in
// Join is gone (the peers there left or were replaced), as Serf's snapshot
// lets a restarted Consul agent rejoin.
const KnownPeersFile = "known-peers.lockmesh"

// knownPeersVersion is the format version of KnownPeersFile.
const knownPeersVersion = 1

type knownPeers struct {
	Version int      `msgpack:"v"`
	Addrs   []string `msgpack:"a"`
}

// SaveKnownPeers writes addrs as the known peers, atomically and durably.
func (d Dir) SaveKnownPeers(addrs []string) error {
	raw, err := msgpack.Marshal(knownPeers{Version: knownPeersVersion, Addrs: addrs})
	if err != nil {
		return err
	}
	return d.WriteDurably(KnownPeersFile, raw)
}

// LoadKnownPeers reads KnownPeersFile; none when it does not exist. The
// file is only a cache of gossip addresses, rewritten within a second of
// the peer seeing its cluster, so one this release cannot read (torn by a
// crash, or from a newer release) is ignored with a warning that says
// so, not a reason to refuse to start.
func (d Dir) LoadKnownPeers() []string {
	ignore := func(why string, err error) []string {
		d.log().Warn("ignoring the known peers file: it only caches gossip addresses and is rewritten once this peer finds its cluster; Join must name a live peer meanwhile",
			"file", d.path(KnownPeersFile), "problem", why, "err", err)
		return nil
	}
	raw, err := d.ReadSmall(KnownPeersFile)
	if err != nil {
		return ignore("unreadable", err)
	}
	if raw == nil {
		return nil
	}
	var kp knownPeers
	if err := msgpack.Unmarshal(raw, &kp); err != nil {
		return ignore("corrupt", err)
	}
	if kp.Version < 1 || kp.Version > knownPeersVersion {
		return ignore(fmt.Sprintf("format version %d; this lockmesh reads 1 to %d", kp.Version, knownPeersVersion), nil)
	}
	return kp.Addrs
}

// ClusterAddrs lists, sorted, the gossip addresses of the alive members
// of p's cluster other than self: what KnownPeersFile keeps. A member
// counts when it gossips p's cluster id or p lists it.
func ClusterAddrs(self string, p *layout.Placement, members []mesh.Member) []string {
	var addrs []string
	for _, m := range members {
		if m.Name == self || m.State != mesh.StateAlive || m.Addr == "" {
			continue
		}
		if m.Meta.Cluster != p.ClusterID {
			if _, listed := p.Peer(m.Name); !listed {
				continue
			}
		}
		addrs = append(addrs, m.Addr)
	}
	slices.Sort(addrs)
	return addrs
}

// JoinAddrs is join (Config.Join) followed by the known peers not
// already in it.
func JoinAddrs(join, known []string) []string {
	out := slices.Clone(join)
	for _, a := range known {
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}
