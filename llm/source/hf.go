package source

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"
)

const (
	// defaultRevision is what the hub serves when no @REVISION is given. A
	// file cached under it is never refreshed: pin a revision (a commit hash)
	// for reproducible deployments, or delete the cached file to update.
	defaultRevision = "main"
	// progressEvery is the least time between two progress callbacks in the
	// middle of a transfer (the first and the last are always made).
	progressEvery = 100 * time.Millisecond
	// copyBufferSize is the read size of the download loop (bytes).
	copyBufferSize = 256 << 10
	// maxHubMessage caps how much of a hub's error message goes into ours.
	maxHubMessage = 200
)

// hubNameRE is an owner or repository name on the hub.
var hubNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// revisionRE is a branch, tag or commit. Slashes (refs/pr/1) are allowed and
// path-escaped both in the URL and in the cache directory name.
var revisionRE = regexp.MustCompile(`^[A-Za-z0-9._][A-Za-z0-9._/-]*$`)

// hfRef is a parsed hf:// reference. Invariant after parseHF: owner and repo
// match hubNameRE, file is a relative slash path of non-empty segments other
// than "." and ".." ending in .gguf, revision matches revisionRE and is not
// "." or "..". So cachePath cannot escape the cache directory.
type hfRef struct {
	owner, repo, file, revision string
}

func (r hfRef) String() string {
	return "hf://" + r.owner + "/" + r.repo + "/" + r.file + "@" + r.revision
}

// url is {endpoint}/{owner}/{repo}/resolve/{revision}/{file}, every part
// path-escaped.
func (r hfRef) url(endpoint string) string {
	segs := strings.Split(r.file, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return endpoint + "/" + url.PathEscape(r.owner) + "/" + url.PathEscape(r.repo) +
		"/resolve/" + url.PathEscape(r.revision) + "/" + strings.Join(segs, "/")
}

// cachePath is {cache}/hf/{owner}/{repo}/{escaped revision}/{file}.
func (r hfRef) cachePath(cacheDir string) string {
	return filepath.Join(cacheDir, "hf", r.owner, r.repo, url.PathEscape(r.revision), filepath.FromSlash(r.file))
}

func hasGGUFSuffix(s string) bool { return strings.HasSuffix(strings.ToLower(s), ".gguf") }

// parseHF parses OWNER/REPO/PATH/TO/FILE.gguf[@REVISION] (the part after hf://).
func parseHF(s string) (hfRef, error) {
	bad := func(why string) (hfRef, error) {
		return hfRef{}, fmt.Errorf("model %q: %s (want hf://OWNER/REPO/FILE.gguf[@REVISION]): %w", "hf://"+s, why, ErrInvalidRef)
	}
	r := hfRef{revision: defaultRevision}
	path := s
	// The revision is split off only after a .gguf name, so a file name
	// that itself contains '@' still parses.
	if i := strings.LastIndexByte(s, '@'); i >= 0 && hasGGUFSuffix(s[:i]) {
		path, r.revision = s[:i], s[i+1:]
		if r.revision == "" || r.revision == "." || r.revision == ".." || !revisionRE.MatchString(r.revision) {
			return bad(fmt.Sprintf("bad revision %q", r.revision))
		}
	}
	parts := strings.Split(path, "/")
	if len(parts) < 3 {
		return bad("missing owner, repository or file")
	}
	r.owner, r.repo = parts[0], parts[1]
	if !hubNameRE.MatchString(r.owner) || !hubNameRE.MatchString(r.repo) {
		return bad(fmt.Sprintf("bad owner or repository name %q", r.owner+"/"+r.repo))
	}
	for _, p := range parts[2:] {
		if p == "" || p == "." || p == ".." || strings.ContainsFunc(p, func(c rune) bool { return c == '\\' || unicode.IsControl(c) }) {
			return bad(fmt.Sprintf("bad file path segment %q", p))
		}
	}
	r.file = strings.Join(parts[2:], "/")
	if !hasGGUFSuffix(r.file) {
		return bad(fmt.Sprintf("file %q does not end in .gguf", r.file))
	}
	return r, nil
}

// endpoint returns the hub base URL without a trailing slash.
func (o *options) hubEndpoint() (string, error) {
	ep := o.endpoint
	if ep == "" {
		ep = o.getenv("HF_ENDPOINT")
	}
	if ep == "" {
		ep = DefaultEndpoint
	}
	u, err := url.Parse(ep)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("hub endpoint %q: want an http(s) URL: %w", ep, ErrInvalidRef)
	}
	return strings.TrimRight(ep, "/"), nil
}

// cacheRoot returns the download cache directory.
func (o *options) cacheRoot() (string, error) {
	if o.cacheDir != "" {
		return o.cacheDir, nil
	}
	if xdg := o.getenv("XDG_CACHE_HOME"); xdg != "" && filepath.IsAbs(xdg) {
		return filepath.Join(xdg, "parley", "models"), nil
	}
	if home := o.getenv("HOME"); home != "" {
		return filepath.Join(home, ".cache", "parley", "models"), nil
	}
	return "", errors.New("no cache directory: set XDG_CACHE_HOME or HOME, or give a cache directory")
}

func (o *options) bearer() string {
	if o.tokenSet {
		return o.token
	}
	return o.getenv("HF_TOKEN")
}

// httpClient returns the client to use and a function to call when done
// with it. A client of our own has its idle connections closed at the end,
// so no transport goroutine outlives Resolve; a caller's client is left alone.
func (o *options) httpClient() (*http.Client, func()) {
	if o.client != nil {
		return o.client, func() {}
	}
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: responseHeaderTimeout,
		IdleConnTimeout:       30 * time.Second,
		ForceAttemptHTTP2:     true,
	}
	return &http.Client{Transport: tr}, tr.CloseIdleConnections
}

// resolveHF returns the cached file for the reference, downloading it first
// if it is not there (or does not match the expected sha256).
func resolveHF(ctx context.Context, s string, o *options) (string, error) {
	ref, err := parseHF(s)
	if err != nil {
		return "", err
	}
	return resolveHFRef(ctx, ref, o)
}

// resolveHFRef is resolveHF for a parsed reference.
func resolveHFRef(ctx context.Context, ref hfRef, o *options) (string, error) {
	endpoint, err := o.hubEndpoint()
	if err != nil {
		return "", err
	}
	root, err := o.cacheRoot()
	if err != nil {
		return "", fmt.Errorf("model %s: %w", ref, err)
	}
	final := ref.cachePath(root)
	// Fast path without the lock: a good cached file is used as is. A bad
	// one is only removed under the lock, where no one can be renaming a
	// fresh download into its place.
	if ok, err := useCached(final, o.sha256, false); err != nil {
		return "", err
	} else if ok {
		return final, nil
	}
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return "", fmt.Errorf("model %s: create cache directory: %w", ref, err)
	}
	// Serialise with any other download of the same file (another goroutine
	// or process); whoever waited finds the file in place afterwards.
	unlock, err := lockFile(ctx, final+".lock")
	if err != nil {
		return "", fmt.Errorf("model %s: %w", ref, err)
	}
	defer unlock()
	if ok, err := useCached(final, o.sha256, true); err != nil {
		return "", err
	} else if ok {
		return final, nil
	}
	client, done := o.httpClient()
	defer done()
	d := download{
		ref:      ref,
		url:      ref.url(endpoint),
		token:    o.bearer(),
		client:   client,
		partial:  final + ".partial",
		final:    final,
		wantSHA:  o.sha256,
		progress: o.progress,
		stall:    o.stallTimeout,
	}
	if err := d.run(ctx); err != nil {
		return "", err
	}
	return final, nil
}

// useCached reports whether final is a usable cached download. A cached file
// that is not GGUF or fails the expected checksum is not an error: only a
// checked file is ever renamed into place, so it was damaged or the expected
// sum has changed, and it is downloaded again. With remove (the caller holds
// the lock) such a file is deleted.
func useCached(final, wantSHA string, remove bool) (bool, error) {
	if _, err := os.Stat(final); errors.Is(err, os.ErrNotExist) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("cached model %s: %w", final, err)
	}
	err := CheckGGUF(final)
	if err == nil && wantSHA != "" {
		err = checkSHA256(final, wantSHA)
	}
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, ErrNotGGUF) || errors.Is(err, ErrChecksum):
		if !remove {
			return false, nil
		}
		if rmErr := os.Remove(final); rmErr != nil {
			return false, fmt.Errorf("remove bad cached model: %w", rmErr)
		}
		return false, nil
	default:
		return false, err
	}
}

// download is one transfer of a hub file into partial, then renamed to final.
type download struct {
	ref            hfRef
	url, token     string
	client         *http.Client
	partial, final string
	wantSHA        string
	progress       func(done, total int64)
	stall          time.Duration
}

// run downloads (resuming partial if present), verifies and renames into
// place. On a network error or cancellation the partial file is kept for the
// next run; on a checksum or format failure it is removed.
func (d *download) run(ctx context.Context) error {
	// A stall timer cancels the transfer when no byte arrived for d.stall;
	// reads push it back. It is stopped before run returns. nil: no limit.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var stall *time.Timer
	if d.stall > 0 {
		stall = time.AfterFunc(d.stall, func() { cancel(ErrStalled) })
		defer stall.Stop()
	}

	var offset int64
	if fi, err := os.Stat(d.partial); err == nil {
		offset = fi.Size()
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("model %s: %w", d.ref, err)
	}
	resp, start, total, err := d.get(ctx, offset)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	// Created only now, so a refused request leaves nothing in the cache.
	// Only this process writes it (we hold the lock), so offset still holds.
	f, err := os.OpenFile(d.partial, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("model %s: open %s: %w", d.ref, d.partial, err)
	}
	defer f.Close() // after the explicit Close below this is a no-op error
	if start != offset {
		// The server restarts from start (0 when it ignored our Range, or
		// when our partial file turned out larger than the file): drop what
		// we have beyond it. Only 0 is possible today; see get.
		if err := f.Truncate(start); err != nil {
			return fmt.Errorf("model %s: truncate %s: %w", d.ref, d.partial, err)
		}
		offset = start
	}
	if start == 0 {
		d.saveETag(resp.Header.Get("ETag"))
	}

	var h hash.Hash
	if d.wantSHA != "" {
		h = sha256.New()
		if _, err := io.Copy(h, io.NewSectionReader(f, 0, offset)); err != nil {
			return fmt.Errorf("model %s: hash %s: %w", d.ref, d.partial, err)
		}
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return fmt.Errorf("model %s: seek %s: %w", d.ref, d.partial, err)
	}
	n, err := d.copy(ctx, f, h, resp.Body, offset, total, stall)
	if err != nil {
		return err
	}
	if total >= 0 && n != total {
		return fmt.Errorf("model %s: got %d of %d bytes; partial file kept, run again to resume: %w", d.ref, n, total, io.ErrUnexpectedEOF)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("model %s: sync %s: %w", d.ref, d.partial, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("model %s: close %s: %w", d.ref, d.partial, err)
	}
	if h != nil {
		if got := hex.EncodeToString(h.Sum(nil)); got != d.wantSHA {
			return d.discard(fmt.Errorf("model %s: downloaded file's sha256 is %s, want %s (file removed): %w", d.ref, got, d.wantSHA, ErrChecksum))
		}
	}
	if err := CheckGGUF(d.partial); errors.Is(err, ErrNotGGUF) {
		return d.discard(fmt.Errorf("model %s: the hub served a file that is not GGUF (file removed): %w", d.ref, err))
	} else if err != nil {
		return fmt.Errorf("model %s: %w", d.ref, err)
	}
	if err := os.Rename(d.partial, d.final); err != nil {
		return fmt.Errorf("model %s: %w", d.ref, err)
	}
	_ = os.Remove(d.etagPath()) // only guards a partial file; a leftover is harmless
	syncDir(filepath.Dir(d.final))
	return nil
}

// discard removes the partial file and returns err (with the removal's
// failure joined, if any).
func (d *download) discard(err error) error {
	_ = os.Remove(d.etagPath())
	if rmErr := os.Remove(d.partial); rmErr != nil {
		return errors.Join(err, rmErr)
	}
	return err
}

// get requests the file from offset on and returns the response to read,
// the offset its body starts at and the file's total size (-1 if unknown).
// It handles 206 (resumed), 200 (whole file: start 0, the server ignored the
// range or there was none) and 416 (our partial is not shorter than the file:
// complete if equal, else restart from 0). The returned body must be closed.
func (d *download) get(ctx context.Context, offset int64) (*http.Response, int64, int64, error) {
	resp, err := d.do(ctx, offset)
	if err != nil {
		return nil, 0, 0, d.netErr(ctx, err, offset, -1)
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return resp, 0, resp.ContentLength, nil
	case http.StatusPartialContent:
		start, total, ok := parseContentRange(resp.Header.Get("Content-Range"))
		if ok && start == offset {
			return resp, offset, total, nil
		}
		resp.Body.Close()
		if offset == 0 {
			return nil, 0, 0, fmt.Errorf("model %s: HTTP 206 with Content-Range %q to a request without Range", d.ref, resp.Header.Get("Content-Range"))
		}
		// A range we did not ask for: start over with a plain request
		// (offset 0 sends no Range, so this recurses at most once).
		return d.get(ctx, 0)
	case http.StatusRequestedRangeNotSatisfiable:
		resp.Body.Close()
		if _, total, ok := parseContentRange(resp.Header.Get("Content-Range")); ok && total == offset {
			// The partial file is already whole (a previous run stopped
			// between the last byte and the rename).
			return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}, offset, total, nil
		}
		if offset == 0 {
			return nil, 0, 0, fmt.Errorf("model %s: HTTP 416 to a request without Range", d.ref)
		}
		// Our partial file is longer than the hub's file (it changed): start over.
		return d.get(ctx, 0)
	default:
		defer resp.Body.Close()
		return nil, 0, 0, d.statusErr(resp)
	}
}

// do sends one GET, with a Range header when offset > 0.
func (d *download) do(ctx context.Context, offset int64) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.url, nil)
	if err != nil {
		return nil, err
	}
	if offset > 0 {
		req.Header.Set("Range", "bytes="+strconv.FormatInt(offset, 10)+"-")
		// If-Range: resume only if the file is still the version the
		// partial file began with; else the server sends it whole (200) and
		// we restart, instead of splicing two versions (e.g. "main" moved).
		if tag, err := os.ReadFile(d.etagPath()); err == nil && len(tag) > 0 {
			req.Header.Set("If-Range", string(tag))
		}
	}
	// identity: a transparently gunzipped body would make byte offsets and
	// Content-Length meaningless for resume.
	req.Header.Set("Accept-Encoding", "identity")
	req.Header.Set("User-Agent", "parley")
	if d.token != "" {
		// net/http drops Authorization on redirects to another host (the hub
		// redirects to a signed CDN URL), so the token stays with the hub.
		req.Header.Set("Authorization", "Bearer "+d.token)
	}
	return d.client.Do(req)
}

// etagPath holds the ETag of the response a partial file began with.
func (d *download) etagPath() string { return d.partial + ".etag" }

// saveETag remembers the validator of a transfer that starts from byte 0,
// for If-Range on a later resume. Weak ETags are not allowed in If-Range,
// so they (or none) leave no file, and a resume is then unguarded. Errors
// are ignored for the same reason: the cost is only the guard.
func (d *download) saveETag(tag string) {
	_ = os.Remove(d.etagPath())
	if tag != "" && !strings.HasPrefix(tag, "W/") {
		_ = os.WriteFile(d.etagPath(), []byte(tag), 0o644)
	}
}

// statusErr turns an unexpected hub status into an error naming the cause.
func (d *download) statusErr(resp *http.Response) error {
	msg := resp.Header.Get("X-Error-Message")
	if len(msg) > maxHubMessage {
		msg = msg[:maxHubMessage] + "..."
	}
	if msg != "" {
		msg = " (" + msg + ")"
	}
	switch resp.StatusCode {
	case http.StatusNotFound:
		return fmt.Errorf("model %s: not found on the hub (HTTP 404 from %s)%s: %w", d.ref, d.url, msg, ErrNotFound)
	case http.StatusUnauthorized, http.StatusForbidden:
		hint := "the repository is private or gated (or does not exist): set HF_TOKEN to a token with access"
		if d.token != "" {
			hint = "the token was refused or has no access to this repository (gated models need their terms accepted on the hub)"
		}
		return fmt.Errorf("model %s: HTTP %d from %s: %s%s: %w", d.ref, resp.StatusCode, d.url, hint, msg, ErrUnauthorized)
	default:
		return fmt.Errorf("model %s: unexpected HTTP %s from %s%s", d.ref, resp.Status, d.url, msg)
	}
}

// copy streams body into f (and h when checking), calling the progress
// callback, pushing back the stall timer on every read. It returns the file
// size reached.
func (d *download) copy(ctx context.Context, f *os.File, h hash.Hash, body io.Reader, done, total int64, stall *time.Timer) (int64, error) {
	d.report(done, total)
	last, reported := time.Now(), done
	buf := make([]byte, copyBufferSize)
	for {
		if stall != nil {
			// Also pushes back past the time spent hashing a resumed prefix.
			stall.Reset(d.stall)
		}
		n, rerr := body.Read(buf)
		if n > 0 {
			if _, err := f.Write(buf[:n]); err != nil {
				return done, fmt.Errorf("model %s: write %s: %w", d.ref, d.partial, err)
			}
			if h != nil {
				h.Write(buf[:n])
			}
			done += int64(n)
			if now := time.Now(); now.Sub(last) >= progressEvery {
				d.report(done, total)
				last, reported = now, done
			}
		}
		if rerr != nil {
			// The last figure is always reported, and only once.
			if done != reported {
				d.report(done, total)
			}
			if errors.Is(rerr, io.EOF) {
				return done, nil
			}
			return done, d.netErr(ctx, rerr, done, total)
		}
	}
}

func (d *download) report(done, total int64) {
	if d.progress != nil {
		d.progress(done, total)
	}
}

// netErr names the cause of a failed request or read: cancellation, stall,
// no network, or a connection lost mid-transfer (partial kept for resume).
func (d *download) netErr(ctx context.Context, err error, done, total int64) error {
	var dnsErr *net.DNSError
	var opErr *net.OpError
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, ErrStalled):
		return fmt.Errorf("model %s: no data for %s at %s; partial file kept, run again to resume: %w", d.ref, d.stall, sizeOf(done, total), ErrStalled)
	case cause != nil:
		return fmt.Errorf("model %s: download stopped at %s, partial file kept: %w", d.ref, sizeOf(done, total), cause)
	case errors.As(err, &dnsErr) || (errors.As(err, &opErr) && (opErr.Op == "dial" || opErr.Op == "proxyconnect")):
		return fmt.Errorf("model %s: cannot reach the hub (offline?): %w: %w", d.ref, ErrOffline, err)
	case done > 0:
		return fmt.Errorf("model %s: download interrupted at %s; partial file kept, run again to resume: %w", d.ref, sizeOf(done, total), err)
	default:
		// Request errors are *url.Error, which already name the method and URL.
		return fmt.Errorf("model %s: %w", d.ref, err)
	}
}

func sizeOf(done, total int64) string {
	if total < 0 {
		return strconv.FormatInt(done, 10) + " bytes"
	}
	return strconv.FormatInt(done, 10) + " of " + strconv.FormatInt(total, 10) + " bytes"
}

// parseContentRange parses "bytes START-END/TOTAL" or "bytes */TOTAL"
// (TOTAL may be "*", returned as -1). start is -1 for the "*" form.
func parseContentRange(s string) (start, total int64, ok bool) {
	rest, found := strings.CutPrefix(s, "bytes ")
	if !found {
		return 0, 0, false
	}
	rng, tot, found := strings.Cut(rest, "/")
	if !found {
		return 0, 0, false
	}
	total = -1
	if tot != "*" {
		t, err := strconv.ParseInt(tot, 10, 64)
		if err != nil || t < 0 {
			return 0, 0, false
		}
		total = t
	}
	if rng == "*" {
		return -1, total, true
	}
	first, _, found := strings.Cut(rng, "-")
	if !found {
		return 0, 0, false
	}
	start, err := strconv.ParseInt(first, 10, 64)
	if err != nil || start < 0 {
		return 0, 0, false
	}
	return start, total, true
}

// syncDir makes a rename in dir durable. Failure is ignored: the file itself
// is synced, and at worst a crash loses the rename, so the next run downloads
// again (or finds the complete partial file and only renames it).
func syncDir(dir string) {
	if f, err := os.Open(dir); err == nil {
		_ = f.Sync()
		_ = f.Close()
	}
}
