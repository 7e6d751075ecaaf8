package web

import (
	"github.com/parley-chat/parley/media"
)

// WithImages sets how the APIs take requests' images: cfg's limits, and its remote-URL policy (http(s) image URLs
// are fetched only from the hosts it allows). Without it the limits are media's defaults and only data: URLs and
// base64 are taken.
func WithImages(cfg media.Config) Option {
	return func(s *Server) {
		s.core.ImagePolicy.Limits, s.core.ImagePolicy.Fetcher = cfg.Limits, cfg.NewFetcher()
	}
}

// WithImageStats makes the APIs count the images they refuse into st, and /metrics report st's counters (the
// chat layer counts its refusals and decodes into the same Stats: chat.WithImageStats, chat.NewMediaDecoder).
func WithImageStats(st *media.Stats) Option {
	return func(s *Server) {
		s.core.ImagePolicy.Stats = st
		s.ops().imageStats = st
	}
}
