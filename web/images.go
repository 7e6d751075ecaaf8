package web

import (
	"github.com/parley-chat/parley/media"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// WithImages sets how the APIs take requests' images: cfg's limits, and its remote-URL policy (http(s) image URLs
// are fetched only from the hosts it allows). Without it the limits are media's defaults and only data: URLs and
// base64 are taken.
func WithImages(cfg media.Config) Option {
	return func(s *Server) {
		s.core.ImagePolicy = apicore.ImagePolicy{Limits: cfg.Limits, Fetcher: cfg.NewFetcher()}
	}
}
