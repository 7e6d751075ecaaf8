package web_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/parley-chat/parley/llm"
)

func TestMain(m *testing.M) {
	llm.SetNativeLog(os.Stderr, false) // keep test output readable
	goleak.VerifyTestMain(m)
}
