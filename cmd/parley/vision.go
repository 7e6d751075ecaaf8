package main

// Images: the model's vision projector (--mmproj, or the one mmproj*.gguf beside the model) and the --image-*
// limits, decoder and remote-URL policy (package media), wired into the chat layer and the APIs.

import (
	"flag"

	"go.uber.org/zap"

	"github.com/parley-chat/parley/chat"
	"github.com/parley-chat/parley/llm"
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
	fs.StringVar(&v.mmproj, "mmproj", "", "the model's vision projector (an mmproj GGUF): the model then sees images (current engine, built with make setup-vision; docs/images.md). Default: the one mmproj*.gguf beside the model file, if there is exactly one")
	v.media = media.DefaultConfig()
	v.media.RegisterFlags(fs)
}

// projector is the projector of the model file at modelPath: --mmproj when given, else the one mmproj*.gguf beside
// the model ("" when there is none, or several: then a warning says to name one). explicit says --mmproj named it.
func (v *visionFlags) projector(modelPath string, log *zap.Logger) (path string, explicit bool) {
	if v.mmproj != "" {
		return v.mmproj, true
	}
	p, err := llm.FindProjector(modelPath)
	if err != nil {
		log.Warn("no projector loaded: name one with --mmproj", zap.Error(err))
		return "", false
	}
	return p, false
}

// imageOptions are the responder's image decoder (media's sandboxed child, started from this very binary) and the
// counters of its images.
func imageOptions(v visionFlags, dec *media.Decoder) []chat.Option {
	return []chat.Option{chat.WithImageDecoder(chat.NewMediaDecoder(dec, v.media.Limits, v.media.DecodedCacheBytes, v.stats)),
		chat.WithImageStats(v.stats)}
}
