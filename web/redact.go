package web

import (
	"maps"
	"net/http"
	"path/filepath"
	"strings"
)

// What a client is told about the deployment.
//
// Where a model lives on the server's disk (its path, which names the
// operator's folders and accounts) is the operator's business: it is shown
// only to a request with the server's own key (--api-key, which is also the
// key of the admin endpoints), never to a named user's key and never on a
// server without --api-key. Everyone else sees the file's base name. /health
// says more than "up" only to a request with an accepted key (any request
// when no key is configured): without one, just its status.

// operator reports whether r carries the server's own API key.
func (s *Server) operator(r *http.Request) bool {
	if s.cfg.APIKey == "" {
		return false
	}
	user, ok := s.identify(r)
	return ok && user == ""
}

// baseName is what a request that is not the operator's sees of a model's
// path (see above).
func baseName(path string) string {
	if path == "" {
		return ""
	}
	return filepath.Base(path)
}

// redactPath returns text with every occurrence of path (a model's, in a
// load error say) replaced by its base name.
func redactPath(text, path string) string {
	if path == "" || text == "" {
		return text
	}
	if dir := filepath.Dir(path); dir != "." && dir != "/" {
		text = strings.ReplaceAll(text, dir+string(filepath.Separator), "")
	}
	return strings.ReplaceAll(text, path, baseName(path))
}

// modelsFor returns ms as r may see them: without the operator's key, paths
// become base names (in settings, in load errors).
func (s *Server) modelsFor(r *http.Request, ms []ModelStatus) []ModelStatus {
	if s.operator(r) {
		return ms
	}
	out := make([]ModelStatus, len(ms))
	for i, m := range ms {
		out[i] = redactStatus(m)
	}
	return out
}

func redactStatus(m ModelStatus) ModelStatus {
	path := m.Info.Path
	if p, ok := m.Settings["path"].(string); ok {
		if path == "" {
			path = p
		}
		m.Settings = maps.Clone(m.Settings)
		m.Settings["path"] = baseName(p)
		m.LastError = redactPath(m.LastError, p)
	}
	m.LastError = redactPath(m.LastError, path)
	m.Info.Path = baseName(m.Info.Path)
	return m
}
