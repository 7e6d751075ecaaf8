package media_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/parley-chat/parley/media"
)

// The test binary is also the image decoder's child (media.NewDecoder starts this executable).
func TestMain(m *testing.M) {
	if media.DecoderChild(os.Getenv) {
		os.Exit(media.ServeDecoder(os.Getenv, os.Stdin, os.Stdout))
	}
	goleak.VerifyTestMain(m)
}
