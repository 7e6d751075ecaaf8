package chat_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/parley-chat/parley/chat"
)

// Every Reply starts a goroutine, and the fake engine one more; none may
// outlive its test. The test binary is also the template sandbox's child
// (chat.NewSandbox starts this executable).
func TestMain(m *testing.M) {
	if chat.SandboxChild(os.Getenv) {
		os.Exit(chat.ServeSandbox(os.Getenv, os.Stdin, os.Stdout))
	}
	goleak.VerifyTestMain(m)
}
