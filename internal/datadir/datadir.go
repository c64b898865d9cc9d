// Package datadir reads and writes the files a peer keeps in its data dir
// beside dragonboat's Raft data: the cluster record (the layout this peer
// adopted, which a restart starts its replicas from) and the known peers
// (gossip addresses to rejoin through). Every write is atomic and durable;
// every read is bounded. The directory and the files are its owner's only:
// the Raft logs under it hold every lock, owner and token.
package datadir

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/lni/vfs"

	"github.com/lockmesh/lockmesh/internal/msgcheck"
)

// Modes of the data dir and of the files written in it: only the peer's
// own user may read them.
const (
	DirMode  = 0o700
	FileMode = 0o600
)

// MaxFile is the most bytes ReadSmall reads: a file larger than that is
// refused, not read whole.
const MaxFile = msgcheck.MaxBody

// Dir is a peer's data dir.
type Dir struct {
	// FS is the file system the dir lives on: vfs.Default, or in tests an
	// in-memory one (modes are then not set: it has none).
	FS   vfs.FS
	Path string
	// Log receives what the dir logs (a mode it restricted, a known peers
	// file it ignores); nil discards.
	Log *slog.Logger
}

func (d Dir) log() *slog.Logger {
	if d.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return d.Log
}

func (d Dir) path(name string) string { return d.FS.PathJoin(d.Path, name) }

// Create creates the dir if it does not exist and makes it readable by its
// owner only, also when it existed before with a wider mode (the files
// dragonboat writes inside are then out of others' reach whatever their
// own mode).
func (d Dir) Create() error {
	if err := d.FS.MkdirAll(d.Path, DirMode); err != nil {
		return fmt.Errorf("create data dir %s: %w", d.Path, err)
	}
	if d.FS != vfs.Default {
		return nil
	}
	st, err := os.Stat(d.Path)
	if err != nil {
		return fmt.Errorf("data dir %s: %w", d.Path, err)
	}
	if st.Mode().Perm()&^DirMode == 0 {
		return nil
	}
	if err := os.Chmod(d.Path, DirMode); err != nil {
		return fmt.Errorf("data dir %s is mode %v, readable by others, and cannot be restricted to %v: %w", d.Path, st.Mode().Perm(), os.FileMode(DirMode), err)
	}
	d.log().Info("data dir restricted to its owner", "dir", d.Path, "was", st.Mode().Perm().String())
	return nil
}

// WriteDurably writes name in the dir atomically and durably: the file is
// synced, renamed into place, and the directory synced so the rename
// survives a power cut.
func (d Dir) WriteDurably(name string, raw []byte) error {
	fs := d.FS
	path := d.path(name)
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
		if err := os.Chmod(tmp, FileMode); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	if err := fs.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	dir, err := fs.OpenDir(d.Path)
	if err != nil {
		return fmt.Errorf("sync data dir %s: %w", d.Path, err)
	}
	defer dir.Close()
	if err := dir.Sync(); err != nil {
		return fmt.Errorf("sync data dir %s: %w", d.Path, err)
	}
	return nil
}

// ReadSmall reads name from the dir, at most MaxFile bytes; nil and no
// error when it does not exist.
func (d Dir) ReadSmall(name string) ([]byte, error) {
	path := d.path(name)
	f, err := d.FS.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || os.IsNotExist(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, MaxFile+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(raw) > MaxFile {
		return nil, fmt.Errorf("read %s: larger than %d bytes", path, MaxFile)
	}
	return raw, nil
}
