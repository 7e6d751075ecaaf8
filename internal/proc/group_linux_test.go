package proc_test

import (
	"bufio"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/parley-chat/parley/internal/proc"
)

// TestOwnGroupDiesWithParent: a child started with OwnGroup ends when its
// parent is killed (SIGKILL, no cleanup run), though it is in a group of
// its own.
func TestOwnGroupDiesWithParent(t *testing.T) {
	if os.Getenv("PROC_TEST_PARENT") == "1" {
		// The parent: start the child, say its pid, wait to be killed.
		cmd := exec.Command("sleep", "600")
		cmd.SysProcAttr = proc.OwnGroup()
		if err := cmd.Start(); err != nil {
			os.Exit(3)
		}
		os.Stdout.WriteString(strconv.Itoa(cmd.Process.Pid) + "\n")
		select {}
	}
	parent := exec.Command(os.Args[0], "-test.run=^TestOwnGroupDiesWithParent$")
	parent.Env = append(os.Environ(), "PROC_TEST_PARENT=1")
	out, err := parent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		parent.Process.Kill()
		parent.Wait()
		t.Fatalf("the parent said no pid: %v", err)
	}
	child, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	if !alive(child) {
		t.Fatalf("the child %d is not running before its parent is killed", child)
	}
	parent.Process.Kill()
	parent.Wait()
	// The kernel sends the signal as the parent's thread exits; wait for
	// the child to go (a hang-catcher, not a time window).
	for deadline := time.Now().Add(2 * time.Minute); alive(child); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			syscall.Kill(child, syscall.SIGKILL)
			t.Fatalf("the child %d outlived its killed parent", child)
		}
	}
}

// alive reports whether pid runs (a zombie that no one reaps has ended).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) state ...: the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}
