package node

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/lni/vfs"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/mesh"
)

// knownPeersFile keeps the gossip addresses of the peers this one last saw
// alive in its cluster. A restarted peer joins through them as well as
// through Config.Join, so it finds its cluster again when every address in
// Join is gone (the peers there left or were replaced), as Serf's snapshot
// lets a restarted Consul agent rejoin.
const knownPeersFile = "known-peers.lockmesh"

// knownPeersVersion is the format version of knownPeersFile.
const knownPeersVersion = 1

type knownPeers struct {
	Version int      `msgpack:"v"`
	Addrs   []string `msgpack:"a"`
}

// knownPeersEvery is how often the file is brought up to date; it is
// written only when the set of addresses changed.
const knownPeersEvery = time.Second

// knownPeersLoop keeps knownPeersFile current.
func (n *Node) knownPeersLoop() {
	var saved []string
	n.every(knownPeersEvery, func() {
		n.noteKnownIPs(n.mesh.Members())
		p := n.placement.Load()
		if p == nil {
			return
		}
		addrs := clusterAddrs(n.cfg.Name, p, n.mesh.Members())
		if len(addrs) == 0 || slices.Equal(addrs, saved) {
			return
		}
		if err := n.saveKnownPeers(addrs); err != nil {
			n.log.Warn("save known peers", "err", err)
			return
		}
		saved = addrs
	})
}

// clusterAddrs lists, sorted, the gossip addresses of the alive members of
// p's cluster other than self.
func clusterAddrs(self string, p *layout.Placement, members []mesh.Member) []string {
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

func (n *Node) saveKnownPeers(addrs []string) error {
	raw, err := msgpack.Marshal(knownPeers{Version: knownPeersVersion, Addrs: addrs})
	if err != nil {
		return err
	}
	return n.writeDurably(knownPeersFile, raw)
}

// loadKnownPeers reads knownPeersFile; none when it does not exist. The
// file is only a cache of gossip addresses, rewritten within a second of
// the peer seeing its cluster, so one this release cannot read (torn by a
// crash, or from a newer release) is ignored with a warning that says
// so, not a reason to refuse to start.
func (n *Node) loadKnownPeers() []string {
	path := n.cfg.fs.PathJoin(n.cfg.DataDir, knownPeersFile)
	ignore := func(why string, err error) []string {
		n.log.Warn("ignoring the known peers file: it only caches gossip addresses and is rewritten once this peer finds its cluster; Join must name a live peer meanwhile",
			"file", path, "problem", why, "err", err)
		return nil
	}
	raw, err := n.readSmall(knownPeersFile)
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

// joinAddrs is Config.Join followed by the known peers not already in it.
func joinAddrs(join, known []string) []string {
	out := slices.Clone(join)
	for _, a := range known {
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// writeDurably writes name in the data dir atomically and durably: the
// file is synced, renamed into place, and the directory synced so the
// rename survives a power cut.
func (n *Node) writeDurably(name string, raw []byte) error {
	fs := n.cfg.fs
	path := fs.PathJoin(n.cfg.DataDir, name)
	tmp := path + ".tmp"
	f, err := fs.Create(tmp)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(raw); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	if fs == vfs.Default {
		if err := os.Chmod(tmp, dataFileMode); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	if err := fs.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	d, err := fs.OpenDir(n.cfg.DataDir)
	if err != nil {
		return fmt.Errorf("sync data dir %s: %w", n.cfg.DataDir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync data dir %s: %w", n.cfg.DataDir, err)
	}
	return nil
}

// readSmall reads name from the data dir, at most maxBodySize bytes; nil
// and no error when it does not exist.
func (n *Node) readSmall(name string) ([]byte, error) {
	path := n.cfg.fs.PathJoin(n.cfg.DataDir, name)
	f, err := n.cfg.fs.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || os.IsNotExist(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, maxBodySize+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(raw) > maxBodySize {
		return nil, fmt.Errorf("read %s: larger than %d bytes", path, maxBodySize)
	}
	return raw, nil
}
