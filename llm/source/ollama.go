package source

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// Ollama's store layout (github.com/ollama/ollama v0.24.0, manifest and
// types/model): {models}/manifests/{host}/{namespace}/{model}/{tag} is a JSON
// image manifest; each layer's content is at {models}/blobs/sha256-{hex}. A
// model imported from or pulled as GGUF has exactly one layer of
// ollamaModelMediaType whose blob is the GGUF file byte for byte.
const (
	ollamaModelMediaType = "application/vnd.ollama.image.model"
	// ollamaProjectorMediaType is the layer of a vision model's projector (an mmproj GGUF).
	ollamaProjectorMediaType = "application/vnd.ollama.image.projector"
	ollamaDefaultHost        = "registry.ollama.ai"
	ollamaDefaultNS          = "library"
	ollamaDefaultTag         = "latest"
	// maxSuggestions caps the model names listed in a not-found error.
	maxSuggestions = 5
)

// Part syntax as Ollama's types/model accepts it.
var (
	ollamaHostRE  = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,349}$`)
	ollamaNSRE    = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_-]{0,79}$`)
	ollamaModelRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}$`)
	ollamaDigest  = regexp.MustCompile(`^sha256[:-]([0-9a-fA-F]{64})$`)
)

// ollamaName is a fully qualified model name. Invariant after parseOllama:
// every part matches its regexp above, so none is "." or ".." or holds a
// separator, and path() stays inside the manifests directory.
type ollamaName struct {
	host, namespace, model, tag string
}

// String is the shortest form Ollama shows: defaults left out, tag kept.
func (n ollamaName) String() string {
	var b strings.Builder
	if !strings.EqualFold(n.host, ollamaDefaultHost) {
		b.WriteString(n.host + "/" + n.namespace + "/")
	} else if !strings.EqualFold(n.namespace, ollamaDefaultNS) {
		b.WriteString(n.namespace + "/")
	}
	b.WriteString(n.model + ":" + n.tag)
	return b.String()
}

func (n ollamaName) path(manifests string) string {
	return filepath.Join(manifests, n.host, n.namespace, n.model, n.tag)
}

// parseOllama parses [[HOST/]NAMESPACE/]MODEL[:TAG] (the part after ollama://)
// the way Ollama does: a ':' after the last '/' starts the tag, so a host
// with a port ("localhost:5000/ns/m") keeps its port.
func parseOllama(s string) (ollamaName, error) {
	n := ollamaName{host: ollamaDefaultHost, namespace: ollamaDefaultNS, tag: ollamaDefaultTag}
	rest := s
	if i := strings.LastIndexByte(s, ':'); i > strings.LastIndexByte(s, '/') {
		rest, n.tag = s[:i], s[i+1:]
	}
	parts := strings.Split(rest, "/")
	switch len(parts) {
	case 1:
		n.model = parts[0]
	case 2:
		n.namespace, n.model = parts[0], parts[1]
	case 3:
		n.host, n.namespace, n.model = parts[0], parts[1], parts[2]
	default:
		return n, fmt.Errorf("model %q: want ollama://[[HOST/]NAMESPACE/]NAME[:TAG]: %w", "ollama://"+s, ErrInvalidRef)
	}
	if !ollamaHostRE.MatchString(n.host) || !ollamaNSRE.MatchString(n.namespace) ||
		!ollamaModelRE.MatchString(n.model) || !ollamaModelRE.MatchString(n.tag) {
		return n, fmt.Errorf("model %q: bad Ollama model name: %w", "ollama://"+s, ErrInvalidRef)
	}
	return n, nil
}

// ollamaManifest is the part of an Ollama image manifest this package reads.
type ollamaManifest struct {
	Layers []ollamaLayer `json:"layers"`
}

type ollamaLayer struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"` // bytes
}

// ollamaStore returns the models directory: option, env OLLAMA_MODELS, or
// ~/.ollama/models (Ollama's own default).
func (o *options) ollamaStore() (string, error) {
	if o.ollamaDir != "" {
		return o.ollamaDir, nil
	}
	if dir := o.getenv("OLLAMA_MODELS"); dir != "" {
		return dir, nil
	}
	if home := o.getenv("HOME"); home != "" {
		return filepath.Join(home, ".ollama", "models"), nil
	}
	return "", fmt.Errorf("no Ollama store: set OLLAMA_MODELS or HOME: %w", ErrNotFound)
}

// resolveOllama returns the blob path of the GGUF model layer of a model in a
// local Ollama store. Nothing is copied: llama.cpp maps the blob in place.
func resolveOllama(s string, o *options) (string, error) {
	name, store, m, err := readOllama(s, o)
	if err != nil {
		return "", err
	}
	i := slices.IndexFunc(m.Layers, func(l ollamaLayer) bool { return l.MediaType == ollamaModelMediaType })
	if i < 0 {
		types := make([]string, 0, len(m.Layers))
		for _, l := range m.Layers {
			types = append(types, l.MediaType)
		}
		return "", fmt.Errorf("ollama model %s: no %s layer (has %s; a safetensors or cloud model has no GGUF to load): %w",
			name, ollamaModelMediaType, strings.Join(types, ", "), ErrNoModelLayer)
	}
	return ollamaBlob(name, store, m.Layers[i], "model", o.sha256)
}

// ollamaProjector returns the blob path of the vision projector layer of a model in a local Ollama store ("" when
// its manifest has none), as Ollama stores a vision model pulled or created from GGUF: the projector GGUF is a
// layer of its own beside the model's.
func ollamaProjector(s string, o *options) (string, error) {
	name, store, m, err := readOllama(s, o)
	if err != nil {
		return "", err
	}
	i := slices.IndexFunc(m.Layers, func(l ollamaLayer) bool { return l.MediaType == ollamaProjectorMediaType })
	if i < 0 {
		return "", nil
	}
	return ollamaBlob(name, store, m.Layers[i], "projector", "")
}

// readOllama finds the manifest of the model s names in the local Ollama store, and reads it.
func readOllama(s string, o *options) (ollamaName, string, ollamaManifest, error) {
	name, err := parseOllama(s)
	if err != nil {
		return name, "", ollamaManifest{}, err
	}
	store, err := o.ollamaStore()
	if err != nil {
		return name, "", ollamaManifest{}, err
	}
	manifests := filepath.Join(store, "manifests")
	if fi, err := os.Stat(manifests); errors.Is(err, fs.ErrNotExist) {
		return name, "", ollamaManifest{}, fmt.Errorf("ollama store %s not found (no manifests directory; set OLLAMA_MODELS to Ollama's models directory): %w", store, ErrNotFound)
	} else if err != nil {
		return name, "", ollamaManifest{}, fmt.Errorf("ollama store %s: %w", store, err)
	} else if !fi.IsDir() {
		return name, "", ollamaManifest{}, fmt.Errorf("ollama store %s: manifests is not a directory: %w", store, ErrNotFound)
	}

	data, err := os.ReadFile(name.path(manifests))
	if errors.Is(err, fs.ErrNotExist) {
		// Ollama treats names case-insensitively; the file system may not.
		all := listOllama(manifests)
		i := slices.IndexFunc(all, func(m ollamaName) bool {
			return strings.EqualFold(m.host, name.host) && strings.EqualFold(m.namespace, name.namespace) &&
				strings.EqualFold(m.model, name.model) && strings.EqualFold(m.tag, name.tag)
		})
		if i < 0 {
			return name, "", ollamaManifest{}, fmt.Errorf("ollama model %s not found in %s%s: %w", name, store, suggest(name, all), ErrNotFound)
		}
		name = all[i]
		data, err = os.ReadFile(name.path(manifests))
	}
	if err != nil {
		return name, "", ollamaManifest{}, fmt.Errorf("ollama model %s: read manifest: %w", name, err)
	}
	var m ollamaManifest
	if err := json.Unmarshal(data, &m); err != nil {
		return name, "", ollamaManifest{}, fmt.Errorf("ollama model %s: manifest %s: %w", name, name.path(manifests), err)
	}
	return name, store, m, nil
}

// ollamaBlob returns the path of layer's blob (what names the layer in errors), checked: present, of the size the
// manifest says, with the sha256 wantSHA when one is given, and GGUF.
func ollamaBlob(name ollamaName, store string, layer ollamaLayer, what, wantSHA string) (string, error) {
	dm := ollamaDigest.FindStringSubmatch(layer.Digest)
	if dm == nil {
		return "", fmt.Errorf("ollama model %s: %s layer digest %q is not sha256: %w", name, what, layer.Digest, ErrInvalidRef)
	}
	blob := filepath.Join(store, "blobs", "sha256-"+dm[1])
	fi, err := os.Stat(blob)
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("ollama model %s: %s blob %s missing (incomplete store; pull the model again): %w", name, what, blob, ErrNotFound)
	} else if err != nil {
		return "", fmt.Errorf("ollama model %s: %w", name, err)
	}
	if layer.Size > 0 && fi.Size() != layer.Size {
		return "", fmt.Errorf("ollama model %s: %s blob %s is %d bytes, manifest says %d (incomplete pull?)", name, what, blob, fi.Size(), layer.Size)
	}
	// The blob is named by its content's sha256 (Ollama verifies it on pull
	// and create), so comparing names is enough and costs no read.
	if wantSHA != "" && !strings.EqualFold(dm[1], wantSHA) {
		return "", fmt.Errorf("ollama model %s: sha256 is %s, want %s: %w", name, strings.ToLower(dm[1]), wantSHA, ErrChecksum)
	}
	if err := CheckGGUF(blob); err != nil {
		return "", fmt.Errorf("ollama model %s: %w", name, err)
	}
	return blob, nil
}

// listOllama returns every model name in the store (the 4-level directory
// tree under manifests). Unreadable directories are skipped: the list only
// serves lookups by case and suggestions.
func listOllama(manifests string) []ollamaName {
	var names []ollamaName
	subdirs := func(dir string) []string {
		entries, _ := os.ReadDir(dir)
		var out []string
		for _, e := range entries {
			out = append(out, e.Name())
		}
		return out
	}
	for _, h := range subdirs(manifests) {
		for _, ns := range subdirs(filepath.Join(manifests, h)) {
			for _, m := range subdirs(filepath.Join(manifests, h, ns)) {
				for _, t := range subdirs(filepath.Join(manifests, h, ns, m)) {
					names = append(names, ollamaName{host: h, namespace: ns, model: m, tag: t})
				}
			}
		}
	}
	return names
}

// suggest lists store names close to want for an error message: the same
// model under other tags, names containing one another, or a small typo.
func suggest(want ollamaName, all []ollamaName) string {
	if len(all) == 0 {
		return " (the store has no models)"
	}
	w := strings.ToLower(want.model)
	var near []string
	for _, n := range all {
		m := strings.ToLower(n.model)
		if strings.Contains(m, w) || strings.Contains(w, m) || editDistance(m, w) <= 2 {
			near = append(near, n.String())
		}
	}
	label := "similar"
	if len(near) == 0 {
		label = "the store has"
		for _, n := range all {
			near = append(near, n.String())
		}
	}
	slices.Sort(near)
	if len(near) > maxSuggestions {
		near = append(near[:maxSuggestions], "...")
	}
	return " (" + label + ": " + strings.Join(near, ", ") + ")"
}

// editDistance is the Levenshtein distance of a and b, by bytes (names are ASCII).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
