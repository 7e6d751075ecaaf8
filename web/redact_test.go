package web_test

import (
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parley-chat/parley/web"
)

func get(tb testing.TB, url, key string) (int, string) {
	tb.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		tb.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// TestModelPathsOnlyToTheOperator: the model's path (/info's path, /api/show's
// modelfile) reaches only the server's own key; a named user's key sees the
// file's base name. /health without a key says only its status; with one,
// the device too.
func TestModelPathsOnlyToTheOperator(t *testing.T) {
	s := openStack(t, stackOpts{tokenizer: true, cfg: func(c *web.Config) {
		c.APIKey = "admin-key"
		c.Users = []web.UserKey{{User: "alice", Key: "alice-key"}}
	}, options: func(s *stack) []web.Option {
		return []web.Option{web.WithResponder(s.responder), web.WithModelInfo(s.engine.Info),
			web.WithInfo(func() web.Info { return web.Info{ModelInfo: s.engine.Info(), Template: "plain"} })}
	}})
	path := s.engine.Info().Path
	dir := filepath.Dir(path)
	if !filepath.IsAbs(path) {
		t.Fatalf("the model's path %q should be absolute for this test", path)
	}
	for _, c := range []struct {
		key     string
		full    bool
		allowed bool
	}{{"admin-key", true, true}, {"alice-key", false, true}} {
		code, body := get(t, s.base+"/info", c.key)
		if code != http.StatusOK || strings.Contains(body, dir) == !c.full || !strings.Contains(body, filepath.Base(path)) {
			t.Errorf("/info with %s: %d, full path shown %v, want %v: %s", c.key, code, strings.Contains(body, dir), c.full, body)
		}
		res := post(t, s.base+"/api/show", map[string]any{"model": "llama:latest"}, "Authorization", "Bearer "+c.key)
		var show struct {
			Modelfile string `json:"modelfile"`
		}
		decodeBody(t, res, http.StatusOK, &show)
		if strings.Contains(show.Modelfile, dir) == !c.full || !strings.Contains(show.Modelfile, "FROM ") {
			t.Errorf("/api/show with %s: modelfile %q, full path shown want %v", c.key, show.Modelfile, c.full)
		}
	}
	code, body := get(t, s.base+"/health", "")
	var h map[string]any
	if err := json.Unmarshal([]byte(body), &h); err != nil || code != http.StatusOK || len(h) != 1 || h["status"] != "ok" {
		t.Errorf("/health without a key: %d %s, want only the status", code, body)
	}
	code, body = get(t, s.base+"/health", "alice-key")
	if code != http.StatusOK || !strings.Contains(body, `"device"`) {
		t.Errorf("/health with a key: %d %s, want the device too", code, body)
	}
}
