package source_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parley-chat/parley/llm/source"
)

// hub is a local stand-in for the Hugging Face hub: it serves body at
// /{owner}/{repo}/resolve/{revision}/{file} and records what it was asked.
type hub struct {
	*httptest.Server
	body []byte
	path string // the one path that exists

	// Behaviour, set before the first request.
	ignoreRange bool   // answer 200 with the whole file even to a Range request
	etag        string // ETag of the file, when non-empty
	status      int    // when non-zero, answer every request with this status
	cutAfter    int64  // when > 0, stop the body after this many bytes...
	block       bool   // ...and then hang (until the client leaves) instead of closing

	mu     sync.Mutex
	reqs   []*http.Request // headers of every request
	served int64           // body bytes written, over all requests
}

func newHub(t *testing.T, body []byte, path string) *hub {
	t.Helper()
	h := &hub{body: body, path: path}
	h.Server = httptest.NewServer(http.HandlerFunc(h.serve))
	t.Cleanup(h.Close)
	return h
}

func (h *hub) serve(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.reqs = append(h.reqs, r.Clone(context.Background()))
	h.mu.Unlock()
	if h.status != 0 {
		w.Header().Set("X-Error-Message", "status set by the test")
		http.Error(w, http.StatusText(h.status), h.status)
		return
	}
	if r.URL.EscapedPath() != h.path {
		w.Header().Set("X-Error-Code", "EntryNotFound")
		w.Header().Set("X-Error-Message", "Entry not found")
		http.NotFound(w, r)
		return
	}
	if h.etag != "" {
		w.Header().Set("ETag", h.etag)
	}
	cw := &countingWriter{ResponseWriter: w, h: h, r: r}
	if h.ignoreRange {
		w.Header().Set("Content-Length", strconv.Itoa(len(h.body)))
		_, _ = cw.Write(h.body)
		return
	}
	http.ServeContent(cw, r, "", time.Time{}, bytes.NewReader(h.body))
}

// countingWriter counts the file bytes of 200/206 bodies (not error texts)
// and applies cutAfter/block.
type countingWriter struct {
	http.ResponseWriter
	h       *hub
	r       *http.Request
	status  int
	written int64
}

func (w *countingWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

var errCut = errors.New("cut by the test")

func (w *countingWriter) Write(p []byte) (int, error) {
	if cut := w.h.cutAfter; cut > 0 && w.written+int64(len(p)) > cut {
		p = p[:cut-w.written]
		n, _ := w.ResponseWriter.Write(p)
		w.add(n)
		if w.h.block {
			_ = http.NewResponseController(w.ResponseWriter).Flush()
			<-w.r.Context().Done()
		}
		return n, errCut
	}
	n, err := w.ResponseWriter.Write(p)
	w.add(n)
	return n, err
}

func (w *countingWriter) add(n int) {
	if w.status != 0 && w.status != http.StatusOK && w.status != http.StatusPartialContent {
		return
	}
	w.written += int64(n)
	w.h.mu.Lock()
	w.h.served += int64(n)
	w.h.mu.Unlock()
}

func (h *hub) requests() []*http.Request {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*http.Request(nil), h.reqs...)
}

func (h *hub) bytesServed() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.served
}

// progressLog records progress callbacks.
type progressLog struct {
	mu    sync.Mutex
	calls [][2]int64
}

func (p *progressLog) fn(done, total int64) {
	p.mu.Lock()
	p.calls = append(p.calls, [2]int64{done, total})
	p.mu.Unlock()
}

func (p *progressLog) get() [][2]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([][2]int64(nil), p.calls...)
}

const (
	testRef  = "hf://ggml-org/models/tinyllamas/stories260K.gguf"
	testPath = "/ggml-org/models/resolve/main/tinyllamas/stories260K.gguf"
)

// cachedPath is where testRef lands in cache (revision main).
func cachedPath(cache string) string {
	return filepath.Join(cache, "hf", "ggml-org", "models", "main", "tinyllamas", "stories260K.gguf")
}

func hubOpts(h *hub, cache string, more ...source.Option) []source.Option {
	return append([]source.Option{
		source.WithGetenv(noEnv),
		source.WithEndpoint(h.URL),
		source.WithCacheDir(cache),
	}, more...)
}

func assertFile(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: %d bytes differ from the %d expected", path, len(got), len(want))
	}
}

func assertGone(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s still exists (stat: %v)", p, err)
		}
	}
}

func TestResolveHF(t *testing.T) {
	body, sum := model(t)
	notGGUF := []byte("<!doctype html><p>login required</p>")
	tests := []struct {
		name    string
		ref     string
		path    string // what the hub serves
		body    []byte
		status  int
		opts    []source.Option
		wantErr error
		wantMsg string
		// wantFile is where the file must land (relative to the cache), for successes.
		wantFile string
	}{
		{name: "download", ref: testRef, path: testPath, body: body,
			wantFile: "hf/ggml-org/models/main/tinyllamas/stories260K.gguf"},
		{name: "download with checksum", ref: testRef, path: testPath, body: body, opts: []source.Option{source.WithSHA256(sum)},
			wantFile: "hf/ggml-org/models/main/tinyllamas/stories260K.gguf"},
		{name: "revision", ref: "hf://o/r/m.gguf@v1.0", path: "/o/r/resolve/v1.0/m.gguf", body: body,
			wantFile: "hf/o/r/v1.0/m.gguf"},
		{name: "revision with slash", ref: "hf://o/r/m.gguf@refs/pr/1", path: "/o/r/resolve/refs%2Fpr%2F1/m.gguf", body: body,
			wantFile: "hf/o/r/refs%2Fpr%2F1/m.gguf"},
		{name: "checksum mismatch", ref: testRef, path: testPath, body: body, opts: []source.Option{source.WithSHA256(strings.Repeat("ab", 32))},
			wantErr: source.ErrChecksum, wantMsg: "sha256 is " + sum},
		{name: "not on the hub", ref: "hf://o/r/missing.gguf", path: testPath, body: body,
			wantErr: source.ErrNotFound, wantMsg: "not found on the hub (HTTP 404"},
		{name: "unauthorized", ref: testRef, path: testPath, status: http.StatusUnauthorized,
			wantErr: source.ErrUnauthorized, wantMsg: "set HF_TOKEN"},
		{name: "forbidden with token", ref: testRef, path: testPath, status: http.StatusForbidden, opts: []source.Option{source.WithToken("s3cr3t-token")},
			wantErr: source.ErrUnauthorized, wantMsg: "HTTP 403"},
		{name: "server error", ref: testRef, path: testPath, status: http.StatusBadGateway, wantMsg: "unexpected HTTP 502"},
		{name: "hub serves html", ref: testRef, path: testPath, body: notGGUF, wantErr: source.ErrNotGGUF, wantMsg: "not GGUF"},
		{name: "missing file", ref: "hf://owner/repo", wantErr: source.ErrInvalidRef},
		{name: "not gguf suffix", ref: "hf://o/r/model.safetensors", wantErr: source.ErrInvalidRef, wantMsg: "does not end in .gguf"},
		{name: "dot-dot owner", ref: "hf://../r/m.gguf", wantErr: source.ErrInvalidRef},
		{name: "dot-dot file", ref: "hf://o/r/../../m.gguf", wantErr: source.ErrInvalidRef},
		{name: "empty segment", ref: "hf://o/r//m.gguf", wantErr: source.ErrInvalidRef},
		{name: "empty revision", ref: "hf://o/r/m.gguf@", wantErr: source.ErrInvalidRef},
		{name: "dot-dot revision", ref: "hf://o/r/m.gguf@..", wantErr: source.ErrInvalidRef},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHub(t, tt.body, tt.path)
			h.status = tt.status
			cache := t.TempDir()
			var prog progressLog
			opts := hubOpts(h, cache, append([]source.Option{source.WithProgress(prog.fn)}, tt.opts...)...)
			got, err := source.Resolve(context.Background(), tt.ref, opts...)
			if tt.wantErr != nil || tt.wantMsg != "" {
				if err == nil {
					t.Fatalf("Resolve(%q) = %q, want an error", tt.ref, got)
				}
				t.Logf("error: %v", err)
				if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
					t.Fatalf("Resolve(%q) error = %v, want %v", tt.ref, err, tt.wantErr)
				}
				if !strings.Contains(err.Error(), tt.wantMsg) {
					t.Fatalf("error %q does not say %q", err, tt.wantMsg)
				}
				if strings.Contains(err.Error(), "s3cr3t") {
					t.Fatalf("error leaks the token: %q", err)
				}
				// Nothing unusable is left in the cache.
				assertGone(t, cachedPath(cache), cachedPath(cache)+".partial")
				return
			}
			if err != nil {
				t.Fatalf("Resolve(%q) = %v", tt.ref, err)
			}
			if want := filepath.Join(cache, filepath.FromSlash(tt.wantFile)); got != want {
				t.Fatalf("path = %q, want %q", got, want)
			}
			assertFile(t, got, body)
			assertGone(t, got+".partial")
			calls := prog.get()
			n := int64(len(body))
			if len(calls) < 2 || calls[0] != [2]int64{0, n} || calls[len(calls)-1] != [2]int64{n, n} {
				t.Fatalf("progress calls = %v, want from {0 %d} to {%d %d}", calls, n, n, n)
			}
			for i := 1; i < len(calls); i++ {
				if calls[i][0] < calls[i-1][0] {
					t.Fatalf("progress went backwards: %v", calls)
				}
			}
			reqs := h.requests()
			if len(reqs) != 1 {
				t.Fatalf("hub saw %d requests, want 1", len(reqs))
			}
			if r, a := reqs[0].Header.Get("Range"), reqs[0].Header.Get("Authorization"); r != "" || a != "" {
				t.Fatalf("request had Range %q, Authorization %q; want a plain GET", r, a)
			}
		})
	}
}

func TestResolveHFOffline(t *testing.T) {
	body, _ := model(t)
	h := newHub(t, body, testPath)
	h.Close() // nothing listens on its port any more
	_, err := source.Resolve(context.Background(), testRef, hubOpts(h, t.TempDir())...)
	t.Logf("error: %v", err)
	if !errors.Is(err, source.ErrOffline) || !strings.Contains(err.Error(), "offline") {
		t.Fatalf("error = %v, want ErrOffline", err)
	}
}

func TestResolveHFResume(t *testing.T) {
	body, sum := model(t)
	const have = 400_000 // bytes already on disk from an earlier, interrupted run
	tests := []struct {
		name        string
		prefix      []byte // content of the partial file
		ignoreRange bool
		etag        string // the hub's ETag for the file
		savedETag   string // the ETag recorded with the partial file
		sha         string
		wantErr     error
		wantRange   string
		wantIfRange string
		wantServed  int64
	}{
		{name: "range honoured", prefix: body[:have], sha: sum,
			wantRange: "bytes=400000-", wantServed: int64(len(body) - have)},
		{name: "range honoured, no checksum", prefix: body[:have],
			wantRange: "bytes=400000-", wantServed: int64(len(body) - have)},
		{name: "same version", prefix: body[:have], etag: `"v1"`, savedETag: `"v1"`,
			wantRange: "bytes=400000-", wantIfRange: `"v1"`, wantServed: int64(len(body) - have)},
		// The file changed on the hub since the partial file began: the hub
		// answers If-Range with the whole new file, which replaces the
		// partial one instead of being spliced onto it (no checksum needed).
		{name: "changed version", prefix: bytes.Repeat([]byte{0xEE}, have), etag: `"v2"`, savedETag: `"v1"`,
			wantRange: "bytes=400000-", wantIfRange: `"v1"`, wantServed: int64(len(body))},
		// A server that ignores Range sends the whole file with 200: the
		// partial file must be restarted, not appended to. A garbage prefix
		// proves it is discarded.
		{name: "range ignored", prefix: bytes.Repeat([]byte{0xEE}, have), ignoreRange: true, sha: sum,
			wantRange: "bytes=400000-", wantServed: int64(len(body))},
		// The partial is already whole: 416, nothing to transfer, just verify and rename.
		{name: "partial complete", prefix: body, sha: sum,
			wantRange: "bytes=" + strconv.Itoa(len(body)) + "-", wantServed: 0},
		// A partial file longer than the hub's file (it changed upstream): restart.
		{name: "partial too long", prefix: append(append([]byte(nil), body...), 1, 2, 3), sha: sum,
			wantRange: "bytes=" + strconv.Itoa(len(body)+3) + "-", wantServed: int64(len(body))},
		// A corrupt prefix is caught by the checksum of the whole file, and removed.
		{name: "corrupt prefix", prefix: bytes.Repeat([]byte{0xEE}, have), sha: sum, wantErr: source.ErrChecksum,
			wantRange: "bytes=400000-", wantServed: int64(len(body) - have)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHub(t, body, testPath)
			h.ignoreRange, h.etag = tt.ignoreRange, tt.etag
			cache := t.TempDir()
			final := cachedPath(cache)
			writeFile(t, final+".partial", tt.prefix)
			if tt.savedETag != "" {
				writeFile(t, final+".partial.etag", []byte(tt.savedETag))
			}
			var prog progressLog
			got, err := source.Resolve(context.Background(), testRef,
				hubOpts(h, cache, source.WithSHA256(tt.sha), source.WithProgress(prog.fn))...)
			reqs := h.requests()
			if len(reqs) == 0 {
				t.Fatal("hub saw no request")
			}
			if reqs[0].Header.Get("Range") != tt.wantRange || reqs[0].Header.Get("If-Range") != tt.wantIfRange {
				t.Fatalf("first request Range = %q, If-Range = %q; want %q, %q",
					reqs[0].Header.Get("Range"), reqs[0].Header.Get("If-Range"), tt.wantRange, tt.wantIfRange)
			}
			if served := h.bytesServed(); served != tt.wantServed {
				t.Fatalf("hub served %d bytes, want %d", served, tt.wantServed)
			}
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("error = %v, want %v", err, tt.wantErr)
				}
				assertGone(t, final, final+".partial")
				return
			}
			if err != nil {
				t.Fatalf("Resolve = %v", err)
			}
			assertFile(t, got, body)
			assertGone(t, final+".partial", final+".partial.etag")
			if calls := prog.get(); len(calls) == 0 || calls[len(calls)-1][0] != int64(len(body)) {
				t.Fatalf("progress calls = %v, want to end at %d", calls, len(body))
			}
		})
	}
}

// An interrupted transfer keeps its partial file and the next run resumes it.
func TestResolveHFInterruptedThenResumed(t *testing.T) {
	body, sum := model(t)
	h := newHub(t, body, testPath)
	const cut = 300_000
	h.cutAfter, h.etag = cut, `"abc123"`
	cache := t.TempDir()
	final := cachedPath(cache)

	_, err := source.Resolve(context.Background(), testRef, hubOpts(h, cache, source.WithSHA256(sum))...)
	t.Logf("error: %v", err)
	if !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(err.Error(), "run again to resume") {
		t.Fatalf("interrupted download error = %v, want unexpected EOF naming resume", err)
	}
	if fi, err := os.Stat(final + ".partial"); err != nil || fi.Size() != cut {
		t.Fatalf("partial file after the cut: %v (size %v), want %d bytes", err, fi, cut)
	}
	assertGone(t, final)
	if tag, err := os.ReadFile(final + ".partial.etag"); err != nil || string(tag) != `"abc123"` {
		t.Fatalf("recorded ETag = %q, %v; want the hub's", tag, err)
	}

	h.cutAfter = 0
	got, err := source.Resolve(context.Background(), testRef, hubOpts(h, cache, source.WithSHA256(sum))...)
	if err != nil {
		t.Fatalf("resumed Resolve = %v", err)
	}
	assertFile(t, got, body)
	reqs := h.requests()
	if len(reqs) != 2 {
		t.Fatalf("hub saw %d requests, want 2", len(reqs))
	}
	if r, ir := reqs[1].Header.Get("Range"), reqs[1].Header.Get("If-Range"); r != "bytes=300000-" || ir != `"abc123"` {
		t.Fatalf("second request Range = %q, If-Range = %q; want bytes=300000-, \"abc123\"", r, ir)
	}
	assertGone(t, final+".partial", final+".partial.etag")
	if served := h.bytesServed(); served != int64(len(body)) {
		t.Fatalf("hub served %d bytes over both runs, want exactly %d", served, len(body))
	}
}

// A second resolve uses the cache and never touches the network.
func TestResolveHFCached(t *testing.T) {
	body, sum := model(t)
	h := newHub(t, body, testPath)
	cache := t.TempDir()
	first, err := source.Resolve(context.Background(), testRef, hubOpts(h, cache)...)
	if err != nil {
		t.Fatalf("first Resolve = %v", err)
	}
	h.Close()
	for _, opts := range [][]source.Option{nil, {source.WithSHA256(sum)}} {
		var prog progressLog
		second, err := source.Resolve(context.Background(), testRef,
			hubOpts(h, cache, append(opts, source.WithProgress(prog.fn))...)...)
		if err != nil || second != first {
			t.Fatalf("cached Resolve = %q, %v; want %q", second, err, first)
		}
		if calls := prog.get(); len(calls) != 0 {
			t.Fatalf("cached Resolve reported progress %v", calls)
		}
	}
	if n := len(h.requests()); n != 1 {
		t.Fatalf("hub saw %d requests, want 1", n)
	}
	// With a different expected checksum, the cached file is not trusted:
	// it is dropped and fetched again, which fails here because the hub is gone.
	_, err = source.Resolve(context.Background(), testRef, hubOpts(h, cache, source.WithSHA256(strings.Repeat("0", 64)))...)
	if !errors.Is(err, source.ErrOffline) {
		t.Fatalf("Resolve with another checksum = %v, want a fresh download (ErrOffline)", err)
	}
	assertGone(t, first)
}

func TestResolveHFToken(t *testing.T) {
	body, _ := model(t)
	tests := []struct {
		name string
		opts []source.Option
		want string // Authorization header
	}{
		{name: "option", opts: []source.Option{source.WithToken("hf_opt")}, want: "Bearer hf_opt"},
		{name: "env", opts: []source.Option{source.WithGetenv(envOf(map[string]string{"HF_TOKEN": "hf_env"}))}, want: "Bearer hf_env"},
		{name: "option beats env", opts: []source.Option{
			source.WithGetenv(envOf(map[string]string{"HF_TOKEN": "hf_env"})), source.WithToken("hf_opt")}, want: "Bearer hf_opt"},
		{name: "explicit empty", opts: []source.Option{
			source.WithGetenv(envOf(map[string]string{"HF_TOKEN": "hf_env"})), source.WithToken("")}, want: ""},
		{name: "none", want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHub(t, body, testPath)
			if _, err := source.Resolve(context.Background(), testRef, hubOpts(h, t.TempDir(), tt.opts...)...); err != nil {
				t.Fatalf("Resolve = %v", err)
			}
			if got := h.requests()[0].Header.Get("Authorization"); got != tt.want {
				t.Fatalf("Authorization = %q, want %q", got, tt.want)
			}
		})
	}
}

// HF_ENDPOINT and XDG_CACHE_HOME / HOME choose the hub and the cache.
func TestResolveHFEnv(t *testing.T) {
	body, _ := model(t)
	h := newHub(t, body, testPath)
	xdg, home := t.TempDir(), t.TempDir()
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{name: "xdg", env: map[string]string{"HF_ENDPOINT": h.URL + "/", "XDG_CACHE_HOME": xdg, "HOME": home},
			want: cachedPath(filepath.Join(xdg, "parley", "models"))},
		{name: "home", env: map[string]string{"HF_ENDPOINT": h.URL, "HOME": home},
			want: cachedPath(filepath.Join(home, ".cache", "parley", "models"))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := source.Resolve(context.Background(), testRef, source.WithGetenv(envOf(tt.env)))
			if err != nil || got != tt.want {
				t.Fatalf("Resolve = %q, %v; want %q", got, err, tt.want)
			}
			assertFile(t, got, body)
		})
	}
	_, err := source.Resolve(context.Background(), testRef, source.WithGetenv(envOf(map[string]string{"HF_ENDPOINT": "ftp://x", "HOME": home})))
	if !errors.Is(err, source.ErrInvalidRef) {
		t.Fatalf("bad HF_ENDPOINT: error = %v, want ErrInvalidRef", err)
	}
}

// Cancelling the context, or a hub that stops sending, ends the download
// with the cause named and the partial file kept.
func TestResolveHFCancelAndStall(t *testing.T) {
	body, _ := model(t)
	const cut = 200_000
	tests := []struct {
		name    string
		cancel  bool // cancel the context once cut bytes are on disk
		opts    []source.Option
		wantErr error
	}{
		{name: "cancel", cancel: true, wantErr: context.Canceled},
		{name: "stall", opts: []source.Option{source.WithStallTimeout(300 * time.Millisecond)}, wantErr: source.ErrStalled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHub(t, body, testPath)
			h.cutAfter, h.block = cut, true
			cache := t.TempDir()
			partial := cachedPath(cache) + ".partial"
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var wg sync.WaitGroup
			defer wg.Wait()
			if tt.cancel {
				// Owned by this test; ends when it cancels or the test's ctx is done.
				wg.Add(1)
				go func() {
					defer wg.Done()
					for ctx.Err() == nil {
						if fi, err := os.Stat(partial); err == nil && fi.Size() == cut {
							cancel()
							return
						}
						time.Sleep(10 * time.Millisecond)
					}
				}()
			}
			start := time.Now()
			_, err := source.Resolve(ctx, testRef, hubOpts(h, cache, tt.opts...)...)
			cancel()
			t.Logf("error: %v", err)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("error = %v, want %v", err, tt.wantErr)
			}
			// The hub never sends the rest: the error is the check, and this
			// bound only catches a download that does not stop.
			if el := time.Since(start); el > time.Minute {
				t.Fatalf("took %s to stop", el)
			}
			if fi, err := os.Stat(partial); err != nil || fi.Size() != cut {
				t.Fatalf("partial file: %v (%v), want %d bytes kept", err, fi, cut)
			}
		})
	}
}

// Two resolves of the same file at once download it once: the second waits
// for the first (file lock) and then finds it in the cache.
func TestResolveHFConcurrent(t *testing.T) {
	body, sum := model(t)
	h := newHub(t, body, testPath)
	cache := t.TempDir()
	const n = 3
	var wg sync.WaitGroup
	paths := make([]string, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			paths[i], errs[i] = source.Resolve(context.Background(), testRef, hubOpts(h, cache, source.WithSHA256(sum))...)
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || paths[i] != cachedPath(cache) {
			t.Fatalf("resolve %d = %q, %v", i, paths[i], errs[i])
		}
	}
	if reqs := len(h.requests()); reqs != 1 {
		t.Fatalf("hub saw %d requests, want 1", reqs)
	}
	assertFile(t, cachedPath(cache), body)
}

// A caller's HTTP client is used (and left open for the caller to close).
func TestResolveHFHTTPClient(t *testing.T) {
	body, _ := model(t)
	h := newHub(t, body, testPath)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	var used bool
	client := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		used = true
		return tr.RoundTrip(r)
	})}
	if _, err := source.Resolve(context.Background(), testRef, hubOpts(h, t.TempDir(), source.WithHTTPClient(client))...); err != nil {
		t.Fatalf("Resolve = %v", err)
	}
	if !used {
		t.Fatal("the given HTTP client was not used")
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// The progress bar works as the WithProgress callback of a real download.
func TestResolveHFProgressBar(t *testing.T) {
	body, _ := model(t)
	h := newHub(t, body, testPath)
	var out bytes.Buffer
	bar := source.NewProgressBar(&out)
	_, err := source.Resolve(context.Background(), testRef, hubOpts(h, t.TempDir(), source.WithProgress(bar.Update))...)
	bar.Finish()
	if err != nil {
		t.Fatalf("Resolve = %v", err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(lines[0], "[>") || !strings.Contains(last, "] 100% 1.2/1.2 MB") || strings.Contains(out.String(), "\r") {
		t.Fatalf("progress output (not a terminal) = %q", out.String())
	}
}
