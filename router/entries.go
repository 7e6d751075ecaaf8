package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/parley-chat/parley/llm/source"
)

// Entry is one configured model: an entry of the models file, a *.gguf of
// the models folder, or --model.
type Entry struct {
	Name      string          `json:"name"`
	Path      string          `json:"path"` // a GGUF path, hf://OWNER/REPO/FILE.gguf or ollama://NAME[:TAG]
	Ctx       int             `json:"ctx,omitempty"`
	Parallel  int             `json:"parallel,omitempty"`
	Threads   int             `json:"threads,omitempty"`
	GPULayers *int            `json:"gpu_layers,omitempty"` // -1 = auto
	Template  string          `json:"template,omitempty"`   // as --template
	Mmproj    string          `json:"mmproj,omitempty"`     // the model's vision projector, as --mmproj
	Pin       bool            `json:"pin,omitempty"`
	KeepAlive json.RawMessage `json:"keep_alive,omitempty"` // "10m", seconds, or -1 (forever)
	Load      bool            `json:"load,omitempty"`       // load at startup
	Default   bool            `json:"default,omitempty"`
}

// modelsFile is the models file.
type modelsFile struct {
	Models []Entry `json:"models"`
}

// MaxFileBytes bounds the models file.
const MaxFileBytes = 1 << 20

// Entries gathers the models of a folder (every *.gguf in dir, each named
// after its file), a models file and one model reference (the default,
// when given; "" for none), and names the default model. A later source
// overrides an earlier entry of the same name. Without a default named by
// the file or by model, the default is the first entry that is not a
// damaged local file.
func Entries(dir, file, model string) ([]Entry, string, error) {
	var out []Entry
	add := func(e Entry) {
		if i := slices.IndexFunc(out, func(o Entry) bool { return o.Name == e.Name }); i >= 0 {
			out[i] = e
			return
		}
		out = append(out, e)
	}
	if dir != "" {
		paths, err := filepath.Glob(filepath.Join(dir, "*.gguf"))
		if err != nil {
			return nil, "", fmt.Errorf("--models: %w", err)
		}
		if _, err := os.Stat(dir); err != nil {
			return nil, "", fmt.Errorf("--models: %w", err)
		}
		slices.Sort(paths)
		for _, p := range paths {
			if isProjector(p) {
				continue // a vision projector, not a model: it pairs with its model (projectorFor)
			}
			add(Entry{Name: NameOf(p), Path: p, Mmproj: projectorFor(p, paths)})
		}
	}
	def := ""
	if file != "" {
		entries, err := ReadFile(file)
		if err != nil {
			return nil, "", fmt.Errorf("--models-file %s: %w", file, err)
		}
		for _, e := range entries {
			if e.Default {
				if def != "" {
					return nil, "", fmt.Errorf("--models-file: both %q and %q are the default", def, e.Name)
				}
				def = e.Name
			}
			add(e)
		}
	}
	if model != "" {
		e := Entry{Name: NameOf(model), Path: model}
		add(e)
		def = e.Name
	}
	if len(out) == 0 {
		return nil, "", errors.New("no models: --models found no *.gguf and no other model is configured")
	}
	if def == "" {
		def = firstSound(out)
	}
	return out, def, nil
}

// firstSound names the default model when none is named: the first entry
// that is not a local file failing its GGUF check (a remote hf:// or
// ollama:// entry counts as sound until it is fetched), so that one damaged
// file in --models does not become every default request's error. "" when
// none is: the registry then takes the first.
func firstSound(entries []Entry) string {
	for _, e := range entries {
		if strings.Contains(e.Path, "://") || source.CheckGGUF(e.Path) == nil {
			return e.Name
		}
	}
	return ""
}

// ReadFile reads and checks a models file: unknown fields, a model without
// a path and a name given twice are errors that name them.
func ReadFile(path string) ([]Entry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseFile(f)
}

func parseFile(r io.Reader) ([]Entry, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxFileBytes {
		return nil, fmt.Errorf("over %d bytes", MaxFileBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var mf modelsFile
	if err := dec.Decode(&mf); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for i := range mf.Models {
		e := &mf.Models[i]
		if e.Path == "" {
			return nil, fmt.Errorf("models[%d]: path is required", i)
		}
		if e.Name == "" {
			e.Name = NameOf(e.Path)
		}
		if seen[e.Name] {
			return nil, fmt.Errorf("models[%d]: the name %q is given twice", i, e.Name)
		}
		seen[e.Name] = true
		if _, err := e.keepAlive(); err != nil {
			return nil, fmt.Errorf("models[%d] (%s): keep_alive: %w", i, e.Name, err)
		}
		if e.Ctx < 0 || e.Parallel < 0 || e.Threads < 0 || (e.GPULayers != nil && *e.GPULayers < -1) {
			return nil, fmt.Errorf("models[%d] (%s): ctx, parallel, threads and gpu_layers must not be negative (gpu_layers -1 = auto)", i, e.Name)
		}
	}
	return mf.Models, nil
}

// keepAlive is the entry's keep_alive (nil: the flag's): a duration string
// ("10m"), a number of seconds, or a negative number (forever).
func (e Entry) keepAlive() (*time.Duration, error) {
	raw := bytes.TrimSpace(e.KeepAlive)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		d, err := time.ParseDuration(s)
		if err != nil {
			return nil, fmt.Errorf("want a duration such as \"10m\" or a number of seconds, got %q", s)
		}
		return &d, nil
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil {
		return nil, fmt.Errorf("want a duration such as \"10m\" or a number of seconds, got %s", raw)
	}
	d := time.Duration(f * float64(time.Second))
	if f < 0 {
		d = -1
	}
	return &d, nil
}

// NameOf names a model after its file: the base name without .gguf (for
// ollama://NAME:TAG, NAME-TAG; an hf:// revision is dropped).
func NameOf(ref string) string {
	ref = strings.TrimPrefix(strings.TrimPrefix(ref, "ollama://"), "hf://")
	if i := strings.LastIndex(ref, "@"); i > 0 && !strings.Contains(ref[i:], "/") {
		ref = ref[:i] // an hf:// revision
	}
	base := filepath.Base(ref)
	if ext := filepath.Ext(base); strings.EqualFold(ext, ".gguf") {
		base = strings.TrimSuffix(base, ext) // only .gguf: llama3.2:1b keeps its dot
	}
	return strings.ReplaceAll(base, ":", "-")
}

// isProjector reports whether a GGUF in a models folder is a vision projector: its name starts with "mmproj", as
// llama.cpp's converters and the model hubs name them.
func isProjector(path string) bool {
	return strings.HasPrefix(strings.ToLower(filepath.Base(path)), "mmproj")
}

// projectorFor is the projector of the model at path among a folder's files: mmproj-NAME.gguf, where NAME is the
// model's name ("" when there is none). Several models share a folder, so a projector pairs with a model by name.
func projectorFor(path string, paths []string) string {
	want := "mmproj-" + strings.ToLower(NameOf(path)) + ".gguf"
	for _, p := range paths {
		if strings.ToLower(filepath.Base(p)) == want {
			return p
		}
	}
	return ""
}
