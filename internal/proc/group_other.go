//go:build !linux

package proc

import "syscall"

// OwnGroup puts a child in a process group of its own.
func OwnGroup() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
