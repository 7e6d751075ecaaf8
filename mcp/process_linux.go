package mcp

import "syscall"

// sysProcAttr puts a server in a process group of its own and has the
// kernel kill it with SIGKILL when the thread that started it exits. Go
// keeps its threads until the process ends (only a goroutine that exits
// while locked to its thread takes the thread with it, and servers are not
// started from one), so the server dies with Parley, even when Parley is
// killed and runs no cleanup.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killGroup kills the process group pgid.
func killGroup(pgid int) { _ = syscall.Kill(-pgid, syscall.SIGKILL) }
