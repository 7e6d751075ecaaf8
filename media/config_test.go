package media_test

import (
	"errors"
	"flag"
	"io"
	"reflect"
	"testing"
	"time"

	"github.com/parley-chat/parley/media"
)

func TestConfigFlags(t *testing.T) {
	c := media.DefaultConfig()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.RegisterFlags(fs)
	if c.NewFetcher().Enabled() {
		t.Error("remote URLs are on by default")
	}
	err := fs.Parse([]string{"--image-max-pixels=1000", "--image-formats=PNG, jpg", "--image-url-allow=a.example, *.b.example:8443,",
		"--image-url-timeout=3s", "--image-max-per-request=2"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Limits.MaxPixels != 1000 || !reflect.DeepEqual(c.Limits.Formats, []media.Format{media.PNG, media.JPEG}) ||
		!reflect.DeepEqual(c.Fetch.Allow, []string{"a.example", "*.b.example:8443"}) || c.Fetch.Timeout != 3*time.Second ||
		c.Limits.MaxImages != 2 {
		t.Errorf("parsed %+v", c)
	}
	if !c.NewFetcher().Enabled() {
		t.Error("an allowlist does not turn remote URLs on")
	}
	if err := fs.Parse([]string{"--image-formats=bmp"}); err == nil {
		t.Error("--image-formats=bmp parsed")
	}
	d := c.NewDecoder()
	defer d.Close()
	// The decoder checks the configured limits itself: 1000 pixels.
	im := &media.Image{Data: encodePNG(t, pattern(40, 30))}
	if _, err := d.Decode(t.Context(), im); !errors.Is(err, media.ErrTooLarge) {
		t.Errorf("a 1200-pixel image under --image-max-pixels=1000: %v", err)
	}
}

// The image budget of a conversation defaults to its images of the largest size, capped at 64 MiB but never below
// one image of the largest size; the flag sets it outright.
func TestConversationBytesDefault(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want int64
	}{
		{nil, 64 << 20},
		{[]string{"--image-max-bytes=1000"}, 64 * 1000},
		{[]string{"--image-max-bytes=1000", "--image-max-per-conversation=3"}, 3000},
		{[]string{"--image-max-bytes=104857600"}, 100 << 20},
		{[]string{"--image-max-bytes-per-conversation=5000"}, 5000},
	} {
		c := media.DefaultConfig()
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c.RegisterFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if got := c.Limits.WithDefaults().MaxConversationBytes; got != tc.want {
			t.Errorf("%v: %d bytes, want %d", tc.args, got, tc.want)
		}
	}
}
