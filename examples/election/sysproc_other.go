//go:build !linux

package main

import "syscall"

// procAttr is nil where there is no Pdeathsig: the demo stops its children
// when it exits or is interrupted, but a kill -9 of it leaves them running.
func procAttr() *syscall.SysProcAttr { return nil }
