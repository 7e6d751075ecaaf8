package main

import (
	"go.uber.org/zap"

	"github.com/parley-chat/parley/mcp"
)

// openMCP starts the MCP servers of --mcp-config: the shared ones at once,
// each user's on first use. Without the flag it returns a Manager with no
// servers, whose Close does nothing of note.
func openMCP(cfg config, log *zap.Logger) *mcp.Manager {
	c := cfg.mcp
	if c == nil {
		c = &mcp.Config{}
	}
	m := mcp.New(c, mcp.WithLogger(log.Named("mcp")))
	if len(c.Servers) > 0 {
		labels := make([]string, 0, len(c.Servers))
		for label := range c.Servers {
			labels = append(labels, label)
		}
		log.Info("mcp servers configured", zap.Strings("servers", labels), zap.Int("users_with_policy", len(c.Users)))
	}
	return m
}
