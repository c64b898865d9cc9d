//go:build !linux

package bench

import "syscall"

func procAttr() *syscall.SysProcAttr { return nil }

// diskFlushes is not counted here: see proc_linux.go.
func diskFlushes(string) (uint64, bool) { return 0, false }
