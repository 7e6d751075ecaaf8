package source_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parley-chat/parley/llm/source"
)

// repoHub is a stand-in for the hub that serves a repository: its files at /OWNER/REPO/resolve/REVISION/PATH, and
// the listing of its folders at /api/models/OWNER/REPO/tree/REVISION[/DIR], pageSize entries a page (0: one page).
type repoHub struct {
	*httptest.Server
	owner, repo, revision string
	files                 map[string][]byte // by path from the repository's root
	pageSize              int

	mu     sync.Mutex
	listed []string // the listing URLs asked for
	got    []string // the file paths downloaded
}

func newRepoHub(t *testing.T, revision string, files map[string][]byte) *repoHub {
	t.Helper()
	h := &repoHub{owner: "ggml-org", repo: "vision", revision: revision, files: files}
	h.Server = httptest.NewServer(http.HandlerFunc(h.serve))
	t.Cleanup(h.Close)
	return h
}

func (h *repoHub) serve(w http.ResponseWriter, r *http.Request) {
	treePrefix := "/api/models/" + h.owner + "/" + h.repo + "/tree/" + h.revision
	filePrefix := "/" + h.owner + "/" + h.repo + "/resolve/" + h.revision + "/"
	switch p := r.URL.Path; {
	case p == treePrefix || strings.HasPrefix(p, treePrefix+"/"):
		h.mu.Lock()
		h.listed = append(h.listed, r.URL.String())
		h.mu.Unlock()
		dir := strings.TrimPrefix(strings.TrimPrefix(p, treePrefix), "/")
		type entry struct {
			Type string `json:"type"`
			Path string `json:"path"`
			Size int    `json:"size"`
		}
		var all []entry
		dirs := map[string]bool{}
		for f, b := range h.files {
			rel := f
			if dir != "" {
				if !strings.HasPrefix(f, dir+"/") {
					continue
				}
				rel = strings.TrimPrefix(f, dir+"/")
			}
			if sub, _, ok := strings.Cut(rel, "/"); ok {
				if d := strings.TrimPrefix(dir+"/"+sub, "/"); !dirs[d] {
					dirs[d] = true
					all = append(all, entry{Type: "directory", Path: d})
				}
				continue
			}
			all = append(all, entry{Type: "file", Path: f, Size: len(b)})
		}
		slices.SortFunc(all, func(a, b entry) int { return strings.Compare(a.Path, b.Path) }) // pages hold still
		if len(all) == 0 {
			http.NotFound(w, r)
			return
		}
		page := all
		if h.pageSize > 0 {
			start := 0
			if c := r.URL.Query().Get("cursor"); c != "" {
				start = len(c) // the cursor is as many x as entries were served
			}
			end := min(start+h.pageSize, len(all))
			page = all[start:end]
			if end < len(all) {
				w.Header().Set("Link", `<`+h.URL+p+`?cursor=`+strings.Repeat("x", end)+`>; rel="next"`)
			}
		}
		json.NewEncoder(w).Encode(page)
	case strings.HasPrefix(p, filePrefix):
		b, ok := h.files[strings.TrimPrefix(p, filePrefix)]
		if !ok {
			http.NotFound(w, r)
			return
		}
		h.mu.Lock()
		h.got = append(h.got, strings.TrimPrefix(p, filePrefix))
		h.mu.Unlock()
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(b))
	default:
		http.NotFound(w, r)
	}
}

// A projector stands beside its model on the hub: ResolveProjector finds the one mmproj*.gguf in the model's folder
// at the model's revision through the hub's listing (following its pages), downloads it into the cache and returns
// it; a folder without one gives "", a folder with two an error that says to name one.
func TestResolveProjectorHF(t *testing.T) {
	body, _ := model(t)
	proj := append([]byte("GGUF"), bytes.Repeat([]byte{7}, 60)...)
	other := append([]byte("GGUF"), bytes.Repeat([]byte{9}, 60)...)
	files := map[string][]byte{
		"model-Q8_0.gguf":           body,
		"mmproj-model-f16.gguf":     proj,
		"README.md":                 []byte("# a vision model"),
		"sub/model.gguf":            body,
		"sub/MMPROJ-sub.gguf":       other,
		"sub/deeper/mmproj-x.gguf":  proj,
		"none/model.gguf":           body,
		"two/model.gguf":            body,
		"two/mmproj-a.gguf":         proj,
		"two/mmproj-b.gguf":         other,
		"two/not-mmproj-model.gguf": other,
	}
	for _, tc := range []struct {
		name, ref, revision string
		pageSize            int
		want                []byte
		wantFile            string
		wantErr             error
	}{
		{name: "beside the model at the root", ref: "model-Q8_0.gguf", revision: "main", want: proj, wantFile: "mmproj-model-f16.gguf"},
		{name: "pages of the listing", ref: "model-Q8_0.gguf", revision: "main", pageSize: 1, want: proj, wantFile: "mmproj-model-f16.gguf"},
		{name: "in a folder, any case", ref: "sub/model.gguf", revision: "main", want: other, wantFile: "sub/MMPROJ-sub.gguf"},
		{name: "at a pinned revision", ref: "sub/model.gguf@0123abcd", revision: "0123abcd", want: other, wantFile: "sub/MMPROJ-sub.gguf"},
		{name: "none beside it", ref: "none/model.gguf", revision: "main"},
		{name: "two beside it", ref: "two/model.gguf", revision: "main", wantErr: source.ErrSeveralProjectors},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newRepoHub(t, tc.revision, files)
			h.pageSize = tc.pageSize
			cache := t.TempDir()
			got, err := source.ResolveProjector(context.Background(), "hf://ggml-org/vision/"+tc.ref,
				source.WithGetenv(noEnv), source.WithEndpoint(h.URL), source.WithCacheDir(cache),
				// The model's checksum is not the projector's.
				source.WithSHA256(strings.Repeat("0", 64)))
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), "name one") {
					t.Fatalf("got %q, %v; want %v", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == nil {
				if got != "" || len(h.got) != 0 {
					t.Fatalf("got %q (downloaded %v); want none", got, h.got)
				}
				return
			}
			wantPath := filepath.Join(cache, "hf", "ggml-org", "vision", tc.revision, filepath.FromSlash(tc.wantFile))
			if got != wantPath {
				t.Errorf("path %s, want %s", got, wantPath)
			}
			assertFile(t, got, tc.want)
			if tc.pageSize > 0 && len(h.listed) < 2 {
				t.Errorf("listed %v: want the listing's pages followed", h.listed)
			}
			// Cached: a second call downloads nothing more.
			n := len(h.got)
			if again, err := source.ResolveProjector(context.Background(), "hf://ggml-org/vision/"+tc.ref,
				source.WithGetenv(noEnv), source.WithEndpoint(h.URL), source.WithCacheDir(cache)); err != nil || again != got || len(h.got) != n {
				t.Errorf("again: %q, %v, downloads %v", again, err, h.got)
			}
		})
	}
	t.Run("a hub that cannot list", func(t *testing.T) {
		h := newHub(t, body, testPath)
		_, err := source.ResolveProjector(context.Background(), testRef, hubOpts(h, t.TempDir())...)
		if !errors.Is(err, source.ErrNotFound) {
			t.Fatalf("got %v, want ErrNotFound", err)
		}
	})
}

// An Ollama vision model keeps its projector as a layer of its manifest: ResolveProjector returns that layer's
// blob, and "" for a model without one.
func TestResolveProjectorOllama(t *testing.T) {
	store, _, _ := newStore(t)
	body, sum := model(t)
	proj := append([]byte("GGUF"), bytes.Repeat([]byte{7}, 60)...)
	psum := sha256.Sum256(proj)
	pblob := writeFile(t, filepath.Join(store, "blobs", "sha256-"+hex.EncodeToString(psum[:])), proj)
	ml := layer{MediaType: modelMediaType, Digest: "sha256:" + sum, Size: int64(len(body))}
	pl := layer{MediaType: "application/vnd.ollama.image.projector", Digest: "sha256:" + hex.EncodeToString(psum[:]), Size: int64(len(proj))}
	writeManifest(t, store, "registry.ollama.ai/library/seer/latest", ml, pl)
	writeManifest(t, store, "registry.ollama.ai/library/lost/latest", ml,
		layer{MediaType: pl.MediaType, Digest: "sha256:" + strings.Repeat("b", 64), Size: 5})
	opts := []source.Option{source.WithGetenv(noEnv), source.WithOllamaDir(store)}
	if got, err := source.ResolveProjector(context.Background(), "ollama://seer", opts...); err != nil || got != pblob {
		t.Errorf("seer: %q, %v; want %s", got, err, pblob)
	}
	if got, err := source.Resolve(context.Background(), "ollama://seer", opts...); err != nil || filepath.Base(got) != "sha256-"+sum {
		t.Errorf("seer's model: %q, %v", got, err)
	}
	if got, err := source.ResolveProjector(context.Background(), "ollama://stories", opts...); err != nil || got != "" {
		t.Errorf("stories: %q, %v; want none", got, err)
	}
	if _, err := source.ResolveProjector(context.Background(), "ollama://lost", opts...); !errors.Is(err, source.ErrNotFound) {
		t.Errorf("a missing projector blob: %v, want ErrNotFound", err)
	}
}

// A plain path's projector is the one mmproj*.gguf beside it.
func TestResolveProjectorFile(t *testing.T) {
	dir := t.TempDir()
	m := writeFile(t, filepath.Join(dir, "m.gguf"), []byte("GGUF"))
	if got, err := source.ResolveProjector(context.Background(), m); err != nil || got != "" {
		t.Errorf("none: %q, %v", got, err)
	}
	p := writeFile(t, filepath.Join(dir, "mmproj-m.gguf"), []byte("GGUF"))
	if got, err := source.ResolveProjector(context.Background(), m); err != nil || got != p {
		t.Errorf("one: %q, %v", got, err)
	}
	writeFile(t, filepath.Join(dir, "mmproj-other.GGUF"), []byte("GGUF"))
	if _, err := source.ResolveProjector(context.Background(), m); !errors.Is(err, source.ErrSeveralProjectors) {
		t.Errorf("two: %v", err)
	}
	_ = os.Remove(p)
}
