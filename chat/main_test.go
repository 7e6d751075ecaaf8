package chat_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/parley-chat/parley/chat"
	"github.com/parley-chat/parley/media"
)

// Every Reply starts a goroutine, and the fake engine one more; none may
// outlive its test. The test binary is also the template sandbox's child
// (chat.NewSandbox starts this executable) and the image decoder's
// (media.NewDecoder does).
func TestMain(m *testing.M) {
	if chat.SandboxChild(os.Getenv) {
		os.Exit(chat.ServeSandbox(os.Getenv, os.Stdin, os.Stdout))
	}
	if media.DecoderChild(os.Getenv) {
		os.Exit(media.ServeDecoder(os.Getenv, os.Stdin, os.Stdout))
	}
	goleak.VerifyTestMain(m)
}
