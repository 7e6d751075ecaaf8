package media

import (
	"flag"
	"fmt"
	"strings"
	"time"
)

// Config is the server's image settings: the limits, the remote-URL policy and the decoder's. RegisterFlags binds
// them to a command line; the zero value is the defaults with remote URLs off.
type Config struct {
	Limits        Limits
	Fetch         FetchPolicy
	DecodeTimeout time.Duration
	DecoderMemory int64
	DecodeWorkers int
	// DecodedCacheBytes bounds the decoded images kept for later turns (their pixels' bytes).
	DecodedCacheBytes int64
}

// DefaultConfig is the defaults, spelled out (what the flags show).
func DefaultConfig() Config {
	return Config{
		Limits:        Limits{}.WithDefaults(),
		Fetch:         FetchPolicy{MaxBytes: DefaultMaxBytes, Timeout: DefaultFetchTimeout, MaxRedirects: DefaultMaxRedirects},
		DecodeTimeout: DefaultDecodeTimeout,
		DecoderMemory: DefaultDecoderMemory,
		DecodeWorkers: DefaultDecodeWorkers,

		DecodedCacheBytes: DefaultDecodedCacheBytes,
	}
}

// DefaultDecodedCacheBytes is the default bound on decoded images kept: 256 MiB, 85 images of 1024x1024 pixels,
// or 5 of the largest the default limits take (4096x4096, 48 MiB each).
const DefaultDecodedCacheBytes = 256 << 20

// RegisterFlags adds the --image-* flags to fs, with c's values (DefaultConfig's, usually) as their defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.Int64Var(&c.Limits.MaxBytes, "image-max-bytes", c.Limits.MaxBytes, "the most bytes one image may have, encoded")
	fs.Int64Var(&c.Limits.MaxPixels, "image-max-pixels", c.Limits.MaxPixels, "the most pixels one image may have (width times height, read from its header before decoding: larger images, decompression bombs among them, are refused undecoded)")
	fs.IntVar(&c.Limits.MaxSide, "image-max-side", c.Limits.MaxSide, "the most pixels one side of an image may have")
	fs.IntVar(&c.Limits.MaxImages, "image-max-per-request", c.Limits.MaxImages, "the most images one request may carry")
	fs.IntVar(&c.Limits.MaxConversationImages, "image-max-per-conversation", c.Limits.MaxConversationImages, "the most images one stored conversation may keep")
	fs.Int64Var(&c.Limits.MaxConversationBytes, "image-max-bytes-per-conversation", 0, "the most bytes of images one stored conversation may keep, each image's once; a prompt whose images would pass it is refused (413 too_large) before it runs, the conversation unchanged. 0 = --image-max-per-conversation images of --image-max-bytes, at most 64 MiB but at least --image-max-bytes (64 MiB with the defaults); the session store's budget (--max-store-bytes) counts them too")
	fs.Func("image-formats", "image formats accepted, a comma-separated list of png, jpeg, webp, gif (default all four; BMP, TIFF, HEIC, AVIF, SVG and others are refused by name)", func(s string) error {
		fs, err := ParseFormats(s)
		if err == nil {
			c.Limits.Formats = fs
		}
		return err
	})
	fs.Func("image-url-allow", "hosts that http(s) image URLs may name, comma-separated: example.com, *.example.com (names under it), host:port; empty (the default) accepts data: URLs only. Loopback, private, link-local and metadata addresses are refused after DNS resolution, on every redirect, whatever this says", func(s string) error {
		c.Fetch.Allow = nil
		for _, h := range strings.Split(s, ",") {
			if h = strings.TrimSpace(h); h != "" {
				c.Fetch.Allow = append(c.Fetch.Allow, h)
			}
		}
		return nil
	})
	fs.DurationVar(&c.Fetch.Timeout, "image-url-timeout", c.Fetch.Timeout, "the most one image URL's fetch may take, redirects included")
	fs.IntVar(&c.Fetch.MaxRedirects, "image-url-max-redirects", c.Fetch.MaxRedirects, "the most redirects one image URL may follow")
	fs.DurationVar(&c.DecodeTimeout, "image-decode-timeout", c.DecodeTimeout, "the most one image's decode may take in its sandboxed child process")
	fs.Int64Var(&c.DecoderMemory, "image-decode-memory", c.DecoderMemory, "the memory limit of each image-decoding child process, in bytes")
	fs.IntVar(&c.DecodeWorkers, "image-decode-workers", c.DecodeWorkers, "image-decoding child processes that decode at once")
	fs.Int64Var(&c.DecodedCacheBytes, "image-cache-bytes", c.DecodedCacheBytes, "the most bytes of decoded images kept, so that later turns of a conversation do not decode its images again (an image takes width x height x 3 bytes; least recently used dropped first; 0 keeps none)")
}

// ParseFormats reads a comma-separated list of format names (png, jpeg or jpg, webp, gif).
func ParseFormats(s string) ([]Format, error) {
	var out []Format
	for _, name := range strings.Split(s, ",") {
		switch f := Format(strings.ToLower(strings.TrimSpace(name))); f {
		case PNG, JPEG, WebP, GIF:
			out = append(out, f)
		case "jpg":
			out = append(out, JPEG)
		case "":
		default:
			return nil, fmt.Errorf("image format %q: png, jpeg, webp and gif decode", name)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no image formats")
	}
	return out, nil
}

// NewDecoder returns a Decoder with c's settings.
func (c Config) NewDecoder() *Decoder {
	return NewDecoder(WithDecodeTimeout(c.DecodeTimeout), WithDecoderMemory(c.DecoderMemory),
		WithDecodeWorkers(c.DecodeWorkers), WithDecodeLimits(c.Limits))
}

// NewFetcher returns a Fetcher for c's policy (one that fetches nothing when no host is allowed).
func (c Config) NewFetcher() *Fetcher {
	f := c.Fetch
	f.MaxBytes = c.Limits.WithDefaults().MaxBytes
	return NewFetcher(f)
}
