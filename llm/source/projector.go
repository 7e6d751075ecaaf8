package source

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// A vision model is two GGUF files: the language model and its projector (an "mmproj" file, llama.cpp's clip
// architecture). The hubs publish them side by side, and Ollama keeps the projector as a layer of the model's
// manifest; ResolveProjector finds it where the model came from.

const (
	// maxTreePages bounds the pages of a hub folder listing read while looking for a projector (a page holds up to
	// a thousand entries; a model's folder has a few dozen).
	maxTreePages = 10
	// maxTreeBytes bounds one page of a hub folder listing, in bytes.
	maxTreeBytes = 8 << 20
)

// ErrSeveralProjectors: more than one projector stands beside the model; the caller must name one.
var ErrSeveralProjectors = errors.New("several projectors beside the model")

// ResolveProjector returns the path of the vision projector that comes with the model ref names, fetched as the
// model is: for hf://OWNER/REPO/DIR/FILE.gguf[@REVISION], the one file named mmproj*.gguf (any case) in DIR of the
// repository at the same revision, downloaded into the cache (the hub's folder listing names it); for
// ollama://NAME[:TAG], the blob of the manifest's projector layer; for a plain path, the one mmproj*.gguf beside
// the file. It returns "" when there is none, and an error wrapping ErrSeveralProjectors when there are several
// (then the caller names one). WithSHA256 is the model's and does not apply here.
func ResolveProjector(ctx context.Context, ref string, opts ...Option) (string, error) {
	o := options{stallTimeout: defaultStallTimeout, getenv: os.Getenv}
	for _, opt := range opts {
		opt(&o)
	}
	if o.getenv == nil {
		o.getenv = os.Getenv
	}
	o.sha256 = ""
	m := schemeRE.FindStringSubmatch(ref)
	if m == nil {
		return FindProjector(ref)
	}
	switch strings.ToLower(m[1]) {
	case "hf":
		return hfProjector(ctx, ref[len(m[0]):], &o)
	case "ollama":
		return ollamaProjector(ref[len(m[0]):], &o)
	}
	return "", fmt.Errorf("model %q: unsupported scheme %q: %w", ref, m[1], ErrInvalidRef)
}

// FindProjector returns the projector beside a model file, as llama.cpp's converters and the model hubs name it:
// the one file in the model's folder whose name starts with "mmproj" and ends in ".gguf" (any case). It returns ""
// when there is none, and an error wrapping ErrSeveralProjectors when there are several.
func FindProjector(modelPath string) (string, error) {
	dir := filepath.Dir(modelPath)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("find a projector beside %s: %w", modelPath, err)
	}
	var found []string
	for _, en := range entries {
		if en.Type().IsRegular() && isProjectorName(en.Name()) {
			found = append(found, filepath.Join(dir, en.Name()))
		}
	}
	return oneProjector(modelPath, found)
}

// isProjectorName reports whether a file name is a projector's: mmproj*.gguf, any case.
func isProjectorName(name string) bool {
	name = strings.ToLower(name)
	return strings.HasPrefix(name, "mmproj") && hasGGUFSuffix(name)
}

func oneProjector(model string, found []string) (string, error) {
	switch len(found) {
	case 0:
		return "", nil
	case 1:
		return found[0], nil
	}
	return "", fmt.Errorf("%w %s (%s): name one", ErrSeveralProjectors, model, strings.Join(found, ", "))
}

// hfProjector finds the projector beside the hf:// model s in the hub's listing of its folder, and downloads it.
func hfProjector(ctx context.Context, s string, o *options) (string, error) {
	ref, err := parseHF(s)
	if err != nil {
		return "", err
	}
	endpoint, err := o.hubEndpoint()
	if err != nil {
		return "", err
	}
	dir, folder := path.Dir(ref.file), path.Dir(ref.file) // the listing names the repository's root "", path.Dir "."
	if folder == "." {
		folder = ""
	}
	names, err := hfFolder(ctx, endpoint, ref, folder, o)
	if err != nil {
		return "", err
	}
	var found []string
	for _, n := range names {
		if path.Dir(n) == dir && isProjectorName(path.Base(n)) {
			found = append(found, n)
		}
	}
	file, err := oneProjector(ref.String(), found)
	if err != nil || file == "" {
		return "", err
	}
	ref.file = file
	return resolveHFRef(ctx, ref, o)
}

// treeEntry is one entry of the hub's folder listing (GET /api/models/OWNER/REPO/tree/REVISION/DIR).
type treeEntry struct {
	Type string `json:"type"` // "file" or "directory"
	Path string `json:"path"` // from the repository's root
}

// hfFolder lists the files of dir in the repository at ref's revision, following the listing's pages (its Link
// header's rel="next").
func hfFolder(ctx context.Context, endpoint string, ref hfRef, dir string, o *options) ([]string, error) {
	u := endpoint + "/api/models/" + url.PathEscape(ref.owner) + "/" + url.PathEscape(ref.repo) + "/tree/" + url.PathEscape(ref.revision)
	if dir != "" {
		segs := strings.Split(dir, "/")
		for i, s := range segs {
			segs[i] = url.PathEscape(s)
		}
		u += "/" + strings.Join(segs, "/")
	}
	client, done := o.httpClient()
	defer done()
	var names []string
	for page := 0; u != "" && page < maxTreePages; page++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return nil, fmt.Errorf("model %s: list its folder: %w", ref, err)
		}
		req.Header.Set("User-Agent", "parley")
		if tok := o.bearer(); tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := client.Do(req)
		if err != nil {
			d := download{ref: ref, url: u}
			return nil, d.netErr(ctx, err, 0, -1)
		}
		if resp.StatusCode != http.StatusOK {
			d := download{ref: ref, url: u, token: o.bearer()}
			err := d.statusErr(resp)
			resp.Body.Close()
			return nil, fmt.Errorf("list its folder: %w", err)
		}
		var entries []treeEntry
		err = json.NewDecoder(io.LimitReader(resp.Body, maxTreeBytes)).Decode(&entries)
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("model %s: the hub's listing of its folder: %w", ref, err)
		}
		for _, e := range entries {
			if e.Type == "file" {
				names = append(names, e.Path)
			}
		}
		u = nextLink(resp.Header.Get("Link"), resp.Request.URL)
	}
	return names, nil
}

// nextLink is the rel="next" URL of a Link header, resolved against base ("" when there is none).
func nextLink(h string, base *url.URL) string {
	for _, part := range strings.Split(h, ",") {
		target, params, ok := strings.Cut(strings.TrimSpace(part), ";")
		if !ok || !strings.Contains(strings.ReplaceAll(params, " ", ""), `rel="next"`) {
			continue
		}
		target = strings.Trim(strings.TrimSpace(target), "<>")
		u, err := base.Parse(target)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host != base.Host {
			return "" // a next page only on the same hub
		}
		return u.String()
	}
	return ""
}
