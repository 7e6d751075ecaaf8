package proc

import "syscall"

// OwnGroup puts a child in a process group of its own and has the kernel
// kill it with SIGKILL when the thread that started it exits. Go keeps its
// threads until the process ends (only a goroutine that exits while locked
// to its thread takes the thread with it, and children are not started
// from one), so the child dies with its parent, even when the parent is
// killed and runs no cleanup.
func OwnGroup() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
