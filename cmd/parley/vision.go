package main

// Images: the model's vision projector (--mmproj, or the one mmproj*.gguf beside the model) and the --image-*
// limits, decoder and remote-URL policy (package media), wired into the chat layer and the APIs.

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/parley-chat/parley/chat"
	"github.com/parley-chat/parley/llm/source"
	"github.com/parley-chat/parley/media"
)

// visionFlags are --mmproj and the --image-* flags.
type visionFlags struct {
	mmproj string
	media  media.Config
	// stats counts the images refused and decoded, by the chat layer and the APIs alike, for /metrics (set by run).
	stats *media.Stats
}

func (v *visionFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&v.mmproj, "mmproj", "", "the model's vision projector (an mmproj GGUF: a path, hf://OWNER/REPO/FILE.gguf, or ollama://NAME for that model's projector): the model then sees images (current engine, built with make setup-vision; docs/images.md). Default: the one that comes with the model: the one mmproj*.gguf beside the model file or in its hf:// repository folder, or its ollama:// manifest's projector layer")
	v.media = media.DefaultConfig()
	v.media.RegisterFlags(fs)
}

// resolveProjector is the projector of the model ref: mmproj when given (a path, an hf:// reference fetched as a
// model is, or an ollama:// model whose projector layer is taken), else the one that comes with the model: the one
// mmproj*.gguf beside the model file or in its hf:// repository's folder, or its ollama:// manifest's projector
// layer ("" when there is none). explicit says mmproj named it. An error with explicit false is a projector that
// could not be found or fetched: the caller serves the model without one.
func resolveProjector(ctx context.Context, cfg config, ref, mmproj string, stderr io.Writer) (path string, explicit bool, err error) {
	opts := sourceOptions(cfg)
	if strings.Contains(ref, "://") || strings.Contains(mmproj, "://") {
		bar := source.NewProgressBar(stderr)
		defer bar.Finish()
		opts = append(opts, source.WithProgress(bar.Update))
	}
	switch {
	case mmproj == "":
		p, err := source.ResolveProjector(ctx, ref, opts...)
		return p, false, err
	case strings.HasPrefix(strings.ToLower(mmproj), "ollama://"):
		p, err := source.ResolveProjector(ctx, mmproj, opts...)
		if err == nil && p == "" {
			err = fmt.Errorf("%s has no projector layer", mmproj)
		}
		return p, true, err
	case strings.Contains(mmproj, "://"):
		p, err := source.Resolve(ctx, mmproj, opts...)
		return p, true, err
	}
	return mmproj, true, nil
}

// imageOptions are the responder's image decoder (media's sandboxed child, started from this very binary) and the
// counters of its images.
func imageOptions(v visionFlags, dec *media.Decoder) []chat.Option {
	return []chat.Option{chat.WithImageDecoder(chat.NewMediaDecoder(dec, v.media.Limits, v.media.DecodedCacheBytes, v.stats)),
		chat.WithImageStats(v.stats)}
}
