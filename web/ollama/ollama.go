// Package ollama serves Ollama's own API, for the clients that speak only it (VS Code Copilot
// Chat's Ollama provider, Home Assistant, Open WebUI's Ollama connection,
// the official ollama JavaScript and Python libraries):
//
//	GET  /api/version  {"version"}
//	GET  /api/tags     the loaded model, as Ollama lists installed ones
//	POST /api/show     details, model_info (from the GGUF), template, parameters, capabilities
//	GET  /api/ps       the loaded model, its size, context and expiry
//	POST /api/chat     a conversation, NDJSON-streamed by default (chat.go)
//	POST /api/generate a prompt, templated or raw, with the legacy context array
//	HEAD /             Ollama's liveness probe (GET / stays the chat page)
//
// With one model, Parley answers to an Ollama-style name, name:latest (from
// the GGUF's general.name or its file name), and to that name without the
// tag; any other name is a 404 in Ollama's shape. With several
// the name picks the model, each served as NAME:latest (its configured
// name), /api/tags lists them all and /api/ps those the residency manager
// holds loaded, with their keep-alive's expiry. The model-management
// and embedding endpoints answer 501 with what Parley does instead, never a
// silent success. Errors are Ollama's {"error": "..."} (ErrorBody).
package ollama

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// ollamaVersion is the Ollama release whose API these routes follow (and
// whose llama.cpp binding Parley links). Clients check it against their
// minimum (VS Code's Ollama provider wants 0.6.4 or later).
const ollamaVersion = "0.24.0"

// ollamaError is Ollama's error body.
type ollamaError struct {
	Error string `json:"error"`
}

// API serves Ollama's endpoints over the shared core.
type API struct {
	core *apicore.Core
}

// New returns the endpoints over core.
func New(core *apicore.Core) *API { return &API{core: core} }

// MountUnsupported answers Ollama's routes for what Parley does another
// way (pulling, pushing, creating models) with 501 and what to do instead.
// Without embeddings (a server that serves none), /api/embed and
// /api/embeddings are answered so too.
func MountUnsupported(g *echo.Group, embeddings bool) {
	for _, u := range ollamaUnsupported {
		if embeddings && (u.path == "/api/embed" || u.path == "/api/embeddings") {
			continue
		}
		g.Add(u.method, u.path, unsupportedOllama(u.instead))
	}
}

// ErrorBody is err as Ollama's error body, {"error": "..."}.
func ErrorBody(err error) any { return ollamaError{parley.ErrorMessage(err)} }

// ollamaUnsupported are Ollama's routes for what Parley does another way.
var ollamaUnsupported = []struct{ method, path, instead string }{
	{http.MethodPost, "/api/pull", "Parley serves the models it was started with: start it with --model hf://OWNER/REPO/FILE.gguf to download one, --model ollama://NAME:TAG to serve one Ollama already pulled, --model PATH.gguf, or several with --models DIR or --models-file FILE"},
	{http.MethodPost, "/api/push", "Parley does not publish models"},
	{http.MethodPost, "/api/create", "Parley serves GGUF files as they are: start it with --model PATH.gguf (sampling defaults are flags, the chat template --template)"},
	{http.MethodPost, "/api/copy", "Parley serves one model under its own name"},
	{http.MethodDelete, "/api/delete", "Parley serves the models it was started with; with several, POST /admin/models/NAME/unload unloads one"},
	{http.MethodPost, "/api/embed", "this server serves no embeddings"},
	{http.MethodPost, "/api/embeddings", "this server serves no embeddings"},
	{http.MethodHead, "/api/blobs/:digest", "Parley does not take model uploads: start it with --model PATH.gguf"},
	{http.MethodPost, "/api/blobs/:digest", "Parley does not take model uploads: start it with --model PATH.gguf"},
}

// unsupportedOllama answers 501 Not Implemented, saying what to do instead.
func unsupportedOllama(instead string) echo.HandlerFunc {
	return func(c echo.Context) error {
		msg := fmt.Sprintf("%s %s is not supported by Parley: %s", c.Request().Method, c.Request().URL.Path, instead)
		if c.Request().Method == http.MethodHead {
			return c.NoContent(http.StatusNotImplemented)
		}
		return c.JSON(http.StatusNotImplemented, ollamaError{msg})
	}
}

// ollamaModelName is the Ollama-style name of model (a request's, see
// checkOllamaModel; "" the default), or of the loaded model with one model.
func (s *API) ollamaModelName(model string) string {
	return Name(s.core.ModelName(model))
}

// Name is a model's Ollama-style name: the model name in lower case,
// runs of characters Ollama does not allow in a name made one '-', and the
// tag "latest".
func Name(model string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(model) {
		ok := r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-'
		switch {
		case ok:
			b.WriteRune(r)
			dash = false
		case !dash && b.Len() > 0:
			b.WriteByte('-')
			dash = true
		}
	}
	name := strings.Trim(b.String(), "-.")
	if name == "" {
		name = "parley"
	}
	return name + ":latest"
}

// checkOllamaModel accepts the served model's names (name:latest, the name
// without its tag, and the name /v1/models lists), case-insensitively; any
// other name is a 404, an empty one a 400 naming field. It returns the
// request's model (apicore.Facts.Model): "" with one model.
//
// With several models the name picks the model (apicore.Core.ResolveModel):
// any served model's name, or its Ollama-style name with or without its tag.
func (s *API) checkOllamaModel(name, field string) (string, error) {
	name = strings.TrimSpace(name)
	if name == "" {
		return "", parley.FieldErrorf(field, "is required")
	}
	if s.core.Models != nil {
		return s.core.ResolveModel(name)
	}
	full := s.ollamaModelName("")
	for _, n := range []string{full, strings.TrimSuffix(full, ":latest"), s.core.ModelName("")} {
		if strings.EqualFold(name, n) {
			return "", nil
		}
	}
	return "", parley.Errorf(parley.ENotFound, "model %q not found: this server serves %q", name, full)
}

// ollamaDetails is Ollama's ModelDetails.
type ollamaDetails struct {
	ParentModel       string   `json:"parent_model"`
	Format            string   `json:"format"`
	Family            string   `json:"family"`
	Families          []string `json:"families"`
	ParameterSize     string   `json:"parameter_size"`
	QuantizationLevel string   `json:"quantization_level"`
}

// ollamaListModel is one model of /api/tags and /api/ps.
type ollamaListModel struct {
	Name          string        `json:"name"`
	Model         string        `json:"model"`
	ModifiedAt    *time.Time    `json:"modified_at,omitempty"` // /api/tags
	Size          int64         `json:"size"`
	Digest        string        `json:"digest"`
	Details       ollamaDetails `json:"details"`
	ExpiresAt     *time.Time    `json:"expires_at,omitempty"`     // /api/ps
	SizeVRAM      *int64        `json:"size_vram,omitempty"`      // /api/ps
	ContextLength int           `json:"context_length,omitempty"` // /api/ps
}

// loadedModel is the facts of model (a request's, "" the default), or of
// the loaded model with one model.
func (s *API) loadedModel(model string) parley.ModelInfo {
	_, info := s.core.ModelFor(model)
	return info
}

// ollamaFileFacts are the model file's modification time and a digest that
// names the loaded file (its path, size and modification time: hashing a
// multi-gigabyte file per request is not worth it).
func ollamaFileFacts(info parley.ModelInfo) (time.Time, string) {
	mod := time.Now()
	if st, err := os.Stat(info.Path); err == nil {
		mod = st.ModTime()
	}
	h := sha256.Sum256([]byte(fmt.Sprintf("%s\x00%d\x00%d", info.Path, info.SizeBytes, mod.UnixNano())))
	return mod, hex.EncodeToString(h[:])
}

func (s *API) ollamaListEntry(model string) ollamaListModel {
	info := s.loadedModel(model)
	mod, digest := ollamaFileFacts(info)
	name := s.ollamaModelName(model)
	return ollamaListModel{Name: name, Model: name, ModifiedAt: &mod, Size: info.SizeBytes, Digest: digest, Details: ollamaDetailsOf(info)}
}

func ollamaDetailsOf(info parley.ModelInfo) ollamaDetails {
	d := ollamaDetails{Format: "gguf", Family: info.Architecture, Families: []string{}, QuantizationLevel: info.Quantization}
	if info.Architecture != "" {
		d.Families = []string{info.Architecture}
	}
	d.ParameterSize = humanCount(info.Parameters)
	return d
}

// humanCount writes a parameter count as Ollama does: 8.0B, 260.0K.
func humanCount(n uint64) string {
	units := []struct {
		div  float64
		unit string
	}{{1e12, "T"}, {1e9, "B"}, {1e6, "M"}, {1e3, "K"}}
	for _, u := range units {
		if v := float64(n) / u.div; v >= 1 {
			if v >= 100 {
				return fmt.Sprintf("%.0f%s", v, u.unit)
			}
			return fmt.Sprintf("%.1f%s", v, u.unit)
		}
	}
	return fmt.Sprintf("%d", n)
}

func (s *API) Version(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"version": ollamaVersion})
}

// Tags is GET /api/tags: every model Parley serves, loaded or
// not (Ollama lists the models installed).
func (s *API) Tags(c echo.Context) error {
	if s.core.Models != nil {
		var list []ollamaListModel
		for _, m := range s.core.Models.Models() {
			list = append(list, s.ollamaListEntry(m.Name))
		}
		return c.JSON(http.StatusOK, map[string][]ollamaListModel{"models": list})
	}
	return c.JSON(http.StatusOK, map[string][]ollamaListModel{"models": {s.ollamaListEntry("")}})
}

// PS is GET /api/ps: the loaded model. It stays loaded while
// the server runs, so it never expires: expires_at is far in the future,
// as Ollama shows a model kept with keep_alive -1.
//
// With several models it lists the models the residency manager holds
// loaded, each with its size (weights and KV cache) and when its
// keep-alive runs out (far in the future for a pinned model or one kept
// forever; for one with replies in flight, its keep-alive from now).
func (s *API) PS(c echo.Context) error {
	forever := time.Now().AddDate(100, 0, 0).UTC()
	if s.core.Models == nil {
		return c.JSON(http.StatusOK, map[string][]ollamaListModel{"models": {s.ollamaPSEntry("", 0, forever)}})
	}
	list := []ollamaListModel{}
	for _, m := range s.core.Models.Models() {
		if m.State != "loaded" {
			continue
		}
		exp := forever
		if m.ExpiresAt != nil {
			exp = m.ExpiresAt.UTC()
		}
		list = append(list, s.ollamaPSEntry(m.Name, m.SizeBytes, exp))
	}
	return c.JSON(http.StatusOK, map[string][]ollamaListModel{"models": list})
}

// ollamaPSEntry is the /api/ps entry of model ("" the loaded one); size is
// its memory (0: the file's size).
func (s *API) ollamaPSEntry(model string, size int64, expires time.Time) ollamaListModel {
	info := s.loadedModel(model)
	m := s.ollamaListEntry(model)
	m.ModifiedAt = nil
	m.ExpiresAt = &expires
	if size > 0 {
		m.Size = size
	}
	vram := int64(0)
	if info.Device.Type == "gpu" && info.Device.LayersTotal > 0 {
		vram = m.Size * int64(info.Device.LayersOffloaded) / int64(info.Device.LayersTotal)
	}
	m.SizeVRAM = &vram
	m.ContextLength = info.ContextLength
	return m
}

// Alias finds a served model among ms by its Ollama-style name (see Name),
// with or without its tag.
func Alias(ms []apicore.ModelStatus, name string) (string, bool) {
	name = strings.ToLower(strings.TrimSpace(name))
	for _, m := range ms {
		full := Name(m.Name)
		if name == full || name == strings.TrimSuffix(full, ":latest") {
			return m.Name, true
		}
	}
	return "", false
}
