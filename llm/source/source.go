// Package source owns turning a --model value into the path of a local GGUF
// file: a plain path (checked), a Hugging Face reference hf://OWNER/REPO/FILE.gguf
// (downloaded once into a cache, resumable, optionally checksummed, with
// progress), or an ollama://NAME[:TAG] reference (the blob of a model already
// in a local Ollama store, used in place, never copied).
//
// It is pure Go, does no logging (errors carry the cause; progress goes to a
// caller's callback) and does not import llm: it only finds files that llm
// then loads.
package source

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"regexp"
	"strings"
	"time"
)

// Sentinel errors, matched with errors.Is. Every error Resolve returns wraps
// at most one of them plus the underlying cause, and its message names the
// file or reference it is about.
var (
	// ErrInvalidRef: the reference or an option is malformed (unknown scheme,
	// bad hf:// path, bad sha256 hex).
	ErrInvalidRef = errors.New("invalid model reference")
	// ErrNotFound: the file, the hub file, the Ollama store, the Ollama model or
	// its blob does not exist.
	ErrNotFound = errors.New("model not found")
	// ErrNotGGUF: the file exists but does not start with the GGUF magic.
	ErrNotGGUF = errors.New("not a GGUF file")
	// ErrChecksum: the file's sha256 differs from the expected one. A
	// downloaded file that fails the check has been removed.
	ErrChecksum = errors.New("sha256 checksum mismatch")
	// ErrOffline: the hub could not be reached (dial or DNS failure).
	ErrOffline = errors.New("model hub unreachable")
	// ErrUnauthorized: the hub answered 401 or 403 (private, gated, or no/bad token).
	ErrUnauthorized = errors.New("model hub refused access")
	// ErrNoModelLayer: an Ollama manifest has no GGUF model layer.
	ErrNoModelLayer = errors.New("ollama manifest has no model layer")
	// ErrStalled: a download received no bytes for the stall timeout.
	ErrStalled = errors.New("download stalled")
)

// ggufMagic is the first four bytes of every GGUF file.
const ggufMagic = "GGUF"

// Defaults. Every one can be overridden by an option.
const (
	// DefaultEndpoint is the Hugging Face hub; env HF_ENDPOINT overrides it.
	DefaultEndpoint = "https://huggingface.co"
	// defaultStallTimeout aborts a download that received no bytes for this
	// long; a dead connection otherwise hangs for the kernel's TCP timeout.
	defaultStallTimeout = 2 * time.Minute
	// responseHeaderTimeout bounds the wait for the hub's answer to a request
	// (not the body, which may take hours).
	responseHeaderTimeout = 60 * time.Second
)

// Option configures Resolve.
type Option func(*options)

type options struct {
	cacheDir     string
	endpoint     string
	sha256       string // lower-case hex, or "" for no check
	progress     func(done, total int64)
	ollamaDir    string
	client       *http.Client
	token        string
	tokenSet     bool
	stallTimeout time.Duration
	getenv       func(string) string
}

// WithCacheDir sets where hf:// downloads are kept. Default:
// $XDG_CACHE_HOME/parley/models, else ~/.cache/parley/models.
func WithCacheDir(dir string) Option { return func(o *options) { o.cacheDir = dir } }

// WithEndpoint sets the hub base URL (e.g. a mirror, or a test server).
// Default: env HF_ENDPOINT, else DefaultEndpoint.
func WithEndpoint(url string) Option { return func(o *options) { o.endpoint = url } }

// WithSHA256 sets the expected sha256 (64 hex digits) of the model file. An
// empty string means no check. Downloads are verified as they are written; a
// cached or local file is hashed (one read of the file); an Ollama blob is
// compared by its content-addressed name.
func WithSHA256(hex string) Option {
	return func(o *options) { o.sha256 = strings.ToLower(strings.TrimSpace(hex)) }
}

// WithProgress sets a callback for download progress: bytes on disk so far
// and the total size (-1 when the server does not say). It is called from the
// goroutine running Resolve, at the start and the end of a transfer and about
// ten times a second in between; it must return quickly. It is not called
// when nothing is downloaded.
func WithProgress(fn func(done, total int64)) Option { return func(o *options) { o.progress = fn } }

// WithOllamaDir sets the Ollama models directory (the one holding manifests/
// and blobs/). Default: env OLLAMA_MODELS, else ~/.ollama/models.
func WithOllamaDir(dir string) Option { return func(o *options) { o.ollamaDir = dir } }

// WithHTTPClient sets the client used for downloads. The caller keeps
// ownership: Resolve does not close its idle connections. Its Timeout, if
// any, bounds the whole download, so leave it zero for large files.
func WithHTTPClient(c *http.Client) Option { return func(o *options) { o.client = c } }

// WithToken sets the bearer token sent to the hub (never logged, never put in
// an error). Default: env HF_TOKEN. An explicit empty token sends none.
func WithToken(token string) Option {
	return func(o *options) { o.token, o.tokenSet = token, true }
}

// WithStallTimeout aborts a download that receives no bytes for d (default 2
// minutes; d <= 0 means no limit). The partial file is kept, so the next
// Resolve resumes it.
func WithStallTimeout(d time.Duration) Option { return func(o *options) { o.stallTimeout = d } }

// WithGetenv replaces os.Getenv for every variable this package reads:
// HF_ENDPOINT, HF_TOKEN, OLLAMA_MODELS, XDG_CACHE_HOME and HOME. Tests use it
// to stay hermetic. (The default HTTP client still takes HTTPS_PROXY and
// friends from the process environment, as net/http does.)
func WithGetenv(fn func(string) string) Option { return func(o *options) { o.getenv = fn } }

// schemeRE matches a URL-like scheme prefix ("hf://", "s3://"); a Windows
// drive path ("C:\x") does not match, so it stays a plain path.
var schemeRE = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9+.-]*)://`)

// sha256RE is an expected digest as WithSHA256 accepts it.
var sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Resolve turns ref into the path of a local GGUF file. ref is a plain path,
// hf://OWNER/REPO/FILE.gguf[@REVISION] or ollama://[[HOST/]NAMESPACE/]NAME[:TAG].
// Every path it returns exists, is a regular file and starts with the GGUF
// magic (and matches WithSHA256 when given). It is safe for concurrent use,
// also across processes sharing a cache directory (a lock file serialises
// downloads of the same file). Cancelling ctx stops a download and keeps the
// partial file for the next call to resume.
func Resolve(ctx context.Context, ref string, opts ...Option) (string, error) {
	o := options{stallTimeout: defaultStallTimeout, getenv: os.Getenv}
	for _, opt := range opts {
		opt(&o)
	}
	if o.getenv == nil {
		o.getenv = os.Getenv
	}
	if o.sha256 != "" && !sha256RE.MatchString(o.sha256) {
		return "", fmt.Errorf("sha256 %q: want 64 hex digits: %w", o.sha256, ErrInvalidRef)
	}
	if ref == "" {
		return "", fmt.Errorf("empty model reference: %w", ErrInvalidRef)
	}
	m := schemeRE.FindStringSubmatch(ref)
	if m == nil {
		return resolveFile(ref, o.sha256)
	}
	switch strings.ToLower(m[1]) {
	case "hf":
		return resolveHF(ctx, ref[len(m[0]):], &o)
	case "ollama":
		return resolveOllama(ref[len(m[0]):], &o)
	default:
		return "", fmt.Errorf("model %q: unsupported scheme %q (want a file path, hf://OWNER/REPO/FILE.gguf or ollama://NAME[:TAG]): %w",
			ref, m[1], ErrInvalidRef)
	}
}

// resolveFile checks a plain path: it exists, is a regular file, is readable,
// starts with the GGUF magic, and has the expected sha256 if one is given.
func resolveFile(path, wantSHA string) (string, error) {
	if err := CheckGGUF(path); err != nil {
		return "", err
	}
	if wantSHA != "" {
		if err := checkSHA256(path, wantSHA); err != nil {
			return "", err
		}
	}
	return path, nil
}

// checkGGUF opens path and checks its first bytes, naming the cause of any
// failure: not found, permission, a directory, too short, wrong magic.
func CheckGGUF(path string) error {
	f, err := os.Open(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("model file %s: no such file: %w", path, ErrNotFound)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("model file %s: permission denied: %w", path, err)
	case err != nil:
		return fmt.Errorf("model file %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("model file %s: %w", path, err)
	}
	if fi.IsDir() {
		return fmt.Errorf("model file %s: is a directory: %w", path, ErrNotGGUF)
	} else if !fi.Mode().IsRegular() {
		return fmt.Errorf("model file %s: not a regular file (%s): %w", path, fi.Mode().Type(), ErrNotGGUF)
	}
	var head [4]byte
	if _, err := io.ReadFull(f, head[:]); errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("model file %s: only %d bytes: %w", path, fi.Size(), ErrNotGGUF)
	} else if err != nil {
		return fmt.Errorf("model file %s: %w", path, err)
	}
	if string(head[:]) != ggufMagic {
		return fmt.Errorf("model file %s: starts with %q, want %q: %w", path, head[:], ggufMagic, ErrNotGGUF)
	}
	return nil
}

// checkSHA256 hashes the file at path and compares it with want (lower-case
// hex). It does not remove anything: the caller decides what a mismatch means.
func checkSHA256(path, want string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("model file %s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("hash %s: %w", path, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("model file %s: sha256 is %s, want %s: %w", path, got, want, ErrChecksum)
	}
	return nil
}
