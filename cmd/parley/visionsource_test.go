package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parley-chat/parley/internal/testbin"
	"github.com/parley-chat/parley/internal/testmodel"
)

// writeBlob writes data into an Ollama store as its blob and returns its manifest layer.
func writeBlob(t *testing.T, store, mediaType string, data []byte) map[string]any {
	t.Helper()
	sum := sha256.Sum256(data)
	hexSum := hex.EncodeToString(sum[:])
	if err := os.MkdirAll(filepath.Join(store, "blobs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(store, "blobs", "sha256-"+hexSum), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return map[string]any{"mediaType": mediaType, "digest": "sha256:" + hexSum, "size": len(data)}
}

// visionStore is an Ollama store holding the model "seer": the test model and the synthetic projector as the
// manifest's model and projector layers, as Ollama keeps a vision model.
func visionStore(t *testing.T) string {
	t.Helper()
	model, err := os.ReadFile(testmodel.Path(t))
	if err != nil {
		t.Fatal(err)
	}
	proj, err := os.ReadFile(visionProjector(t))
	if err != nil {
		t.Fatal(err)
	}
	store := t.TempDir()
	m, _ := json.Marshal(map[string]any{"schemaVersion": 2, "layers": []any{
		writeBlob(t, store, "application/vnd.ollama.image.model", model),
		writeBlob(t, store, "application/vnd.ollama.image.projector", proj),
	}})
	dir := filepath.Join(store, "manifests", "registry.ollama.ai", "library", "seer")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "latest"), m, 0o644); err != nil {
		t.Fatal(err)
	}
	return store
}

// seesImages checks that the server's model (model names it, "" the default) says it sees images and answers a
// chat with one.
func seesImages(t *testing.T, s *server, model string) {
	t.Helper()
	if model == "" {
		if info := getJSON(t, s, "/info"); info["vision"] != true {
			t.Errorf("/info vision = %v\n%s", info["vision"], s.log())
		}
		model = "x"
	}
	req := openAIImageChat(dataURL(testPNG(t, 24, 24, 5)), "Once upon a time")
	req["model"] = model
	if status, out := postJSON(t, s, "/v1/chat/completions", req); status != 200 {
		t.Errorf("an image chat: %d %v\n%s", status, out, s.log())
	}
}

// A model from hf:// comes with the projector beside it in its repository folder: the server finds it in the hub's
// listing, downloads it into the model cache with the model, and sees images.
func TestVisionProjectorFromHF(t *testing.T) {
	bin := testbin.Parley(t)
	visionLibDir(t, bin)
	model, err := os.ReadFile(testmodel.Path(t))
	if err != nil {
		t.Fatal(err)
	}
	proj, err := os.ReadFile(visionProjector(t))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{"stories.gguf": model, "mmproj-stories-f16.gguf": proj}
	hub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/models/owner/seer/tree/main" {
			var list []map[string]any
			for name, b := range files {
				list = append(list, map[string]any{"type": "file", "path": name, "size": len(b)})
			}
			json.NewEncoder(w).Encode(list)
			return
		}
		if b, ok := files[strings.TrimPrefix(r.URL.Path, "/owner/seer/resolve/main/")]; ok {
			w.Write(b)
			return
		}
		http.NotFound(w, r)
	}))
	defer hub.Close()
	t.Setenv("HF_ENDPOINT", hub.URL)
	cache := t.TempDir()
	s := launch(t, bin, "--model", "hf://owner/seer/stories.gguf", "--model-cache", cache, "--engine", "current", "--store", "memory")
	seesImages(t, s, "")
	if _, err := os.Stat(filepath.Join(cache, "hf", "owner", "seer", "main", "mmproj-stories-f16.gguf")); err != nil {
		t.Errorf("the projector is not in the model cache: %v", err)
	}
}

// A model from ollama:// comes with its manifest's projector layer: the server takes that blob as the projector,
// with one model and with several (a models file entry).
func TestVisionProjectorFromOllama(t *testing.T) {
	bin := testbin.Parley(t)
	visionLibDir(t, bin)
	store := visionStore(t)
	t.Run("one model", func(t *testing.T) {
		s := launch(t, bin, "--model", "ollama://seer", "--ollama-models", store, "--engine", "current", "--store", "memory")
		seesImages(t, s, "")
	})
	t.Run("several models", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "models.json")
		entries := `{"models":[{"name":"plain","path":"` + testmodel.Path(t) + `","default":true},{"name":"seer","path":"ollama://seer"}]}`
		if err := os.WriteFile(file, []byte(entries), 0o644); err != nil {
			t.Fatal(err)
		}
		s := launch(t, bin, "--models-file", file, "--ollama-models", store, "--engine", "current", "--store", "memory")
		seesImages(t, s, "seer")
		req := openAIImageChat(dataURL(testPNG(t, 24, 24, 5)), "Once upon a time")
		req["model"] = "plain"
		if status, out := postJSON(t, s, "/v1/chat/completions", req); status != 400 || !strings.Contains(errorMessage(out), "does not see images") {
			t.Errorf("the model without a projector: %d %v", status, out)
		}
	})
}
