package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// procAttr kills the child when the bench process dies, so that even a
// kill -9 of the bench leaves no server behind.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// diskFlushes is the flush requests completed by the block device that
// holds path (the disk, for a path on one of its partitions), from
// /proc/diskstats: each fsync or fdatasync that reaches the disk is one.
// ok is false where the kernel does not count them (before Linux 5.5) or
// path is not on a block device.
func diskFlushes(path string) (n uint64, ok bool) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, false
	}
	sys := fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	link, err := os.Readlink(sys)
	if err != nil {
		return 0, false
	}
	name := filepath.Base(link)
	if _, err := os.Stat(filepath.Join(sys, "partition")); err == nil {
		name = filepath.Base(filepath.Dir(link)) // flushes count on the disk
	}
	b, err := os.ReadFile("/proc/diskstats")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		// major minor name, then 17 counters of which the 16th is flush
		// requests completed.
		if len(f) >= 19 && f[2] == name {
			n, err := strconv.ParseUint(f[18], 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}
