package web

import "github.com/parley-chat/parley/toolloop"

// WithTools gives the APIs the tools that run on the server: host lists
// and calls them under each user's policy (*mcp.Manager is one). Without
// it a request that asks for them is refused, naming the server it asked for.
func WithTools(host toolloop.Host) Option {
	return func(s *Server) { s.core.Tools = host }
}
