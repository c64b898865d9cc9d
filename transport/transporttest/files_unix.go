//go:build unix

package transporttest

import (
	"syscall"
	"testing"
)

// NeedFiles makes sure this process may hold n open files, raising its
// soft limit (RLIMIT_NOFILE) within the hard one, and skips tb when the
// hard limit is lower.
func NeedFiles(tb testing.TB, n uint64) {
	tb.Helper()
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		tb.Skipf("transporttest: needs %d open files; cannot read the limit: %v", n, err)
	}
	if l.Cur >= n {
		return
	}
	if l.Max < n {
		tb.Skipf("transporttest: needs %d open files; the hard limit (ulimit -Hn) is %d", n, l.Max)
	}
	l.Cur = n
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		tb.Skipf("transporttest: needs %d open files; cannot raise the limit of %d: %v", n, l.Cur, err)
	}
}
