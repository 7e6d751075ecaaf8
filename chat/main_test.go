package chat_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every Reply starts a goroutine, and the fake engine one more; none may
// outlive its test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
