package web

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/parley-chat/parley/media"
)

// ImageStats is what the engine counts of the images prompts carry (EngineStats.Images): images the projector
// encoded, the time it took, and images found in a slot's KV cache already (a later turn of the conversation, or a
// state restored by the KV swap), which are not encoded again.
type ImageStats struct {
	Encoded    int64         // images through the projector's encoder
	EncodeTime time.Duration // the encoder's time in them
	Reused     int64         // image places of prompts served from the KV cache instead
}

// imageCollectors reads the image counters at scrape time: the engine's encodes (stats, nil without an engine),
// and the refusals and decodes st counts (nil: zeros, the series still there).
func imageCollectors(stats func() EngineStats, st *media.Stats) []prometheus.Collector {
	var cs []prometheus.Collector
	counter := func(name, help string, v func() float64) {
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, v))
	}
	if stats != nil {
		im := func() ImageStats { return stats().Images }
		counter("parley_image_encodes_total", "Images the vision projector encoded: each image of a prompt that the KV cache did not hold.",
			func() float64 { return float64(im().Encoded) })
		counter("parley_image_encode_seconds_total", "Time the vision projector spent encoding images (off the decode loop).",
			func() float64 { return im().EncodeTime.Seconds() })
		counter("parley_images_reused_total", "Images of prompts found in a slot's KV cache (a later turn of the same conversation, or a restored state), so not encoded again.",
			func() float64 { return float64(im().Reused) })
	}
	counter("parley_image_decodes_total", "Images decoded to pixels in the sandboxed decoder child.",
		func() float64 { return float64(st.Snapshot().Decodes) })
	counter("parley_image_decode_seconds_total", "Time images took to decode in the sandboxed child, its start included.",
		func() float64 { return st.Snapshot().DecodeTime.Seconds() })
	counter("parley_image_decodes_kept_total", "Images found already decoded (--image-cache-bytes), so not decoded again.",
		func() float64 { return float64(st.Snapshot().Kept) })
	for _, reason := range media.Reasons() {
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "parley_image_refusals_total",
			Help:        "Images refused, by reason: format, malformed, too_large, too_many, encoding, decode, decoder (the decoder could not start), remote_off, remote (a URL refused), no_vision (a model without a projector), other.",
			ConstLabels: prometheus.Labels{"reason": reason},
		}, func() float64 { return float64(st.Snapshot().Refused[reason]) }))
	}
	return cs
}
