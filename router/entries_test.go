package router_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parley-chat/parley/internal/testmodel"
	"github.com/parley-chat/parley/router"
)

func TestNameOf(t *testing.T) {
	for ref, want := range map[string]string{
		"/models/qwen3-0.6b.gguf":                    "qwen3-0.6b",
		"stories260K.gguf":                           "stories260K",
		"hf://ggml-org/models/tinyllamas/s260K.gguf": "s260K",
		"hf://owner/repo/m.gguf@0123abcd":            "m",
		"ollama://llama3.2:1b":                       "llama3.2-1b",
		"ollama://library/qwen3":                     "qwen3",
		"hf://owner/repo@dev/sub/file.Q4_K_M.gguf":   "file.Q4_K_M",
	} {
		if got := router.NameOf(ref); got != want {
			t.Errorf("NameOf(%q) = %q, want %q", ref, got, want)
		}
	}
}

func writeFile(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestReadFileRefusesWhatItCannotServe: each mistake in a models file is
// an error that names the entry.
func TestReadFileRefusesWhatItCannotServe(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ name, body, want string }{
		{"unknown field", `{"models":[{"path":"a.gguf","ctxx":4}]}`, `unknown field "ctxx"`},
		{"no path", `{"models":[{"name":"a"}]}`, "models[0]: path is required"},
		{"name twice", `{"models":[{"path":"x/a.gguf"},{"path":"y/a.gguf"}]}`, `models[1]: the name "a" is given twice`},
		{"bad keep_alive", `{"models":[{"path":"a.gguf","keep_alive":"soon"}]}`, "models[0] (a): keep_alive"},
		{"negative ctx", `{"models":[{"path":"a.gguf","ctx":-1}]}`, "must not be negative"},
		{"gpu_layers below auto", `{"models":[{"path":"a.gguf","gpu_layers":-2}]}`, "must not be negative"},
		{"not JSON", `models:`, "invalid character"},
	} {
		_, err := router.ReadFile(writeFile(t, dir, "models.json", c.body))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: want an error with %q, got %v", c.name, c.want, err)
		}
	}
	big := writeFile(t, dir, "big.json", `{"models":[`+strings.Repeat(" ", router.MaxFileBytes)+`]}`)
	if _, err := router.ReadFile(big); err == nil || !strings.Contains(err.Error(), "over") {
		t.Errorf("a file over the bound: %v", err)
	}
	entries, err := router.ReadFile(writeFile(t, dir, "ok.json",
		`{"models":[{"path":"hf://o/r/tiny.gguf","keep_alive":"10m","default":true},{"name":"n","path":"n.gguf","keep_alive":-1,"gpu_layers":-1}]}`))
	if err != nil || len(entries) != 2 || entries[0].Name != "tiny" || entries[1].Name != "n" || !entries[0].Default {
		t.Fatalf("a sound file: %+v, %v", entries, err)
	}
}

// TestEntries: the folder's files, then the file's entries (overriding a
// folder entry of the same name), then --model, which is the default.
func TestEntries(t *testing.T) {
	dir := t.TempDir()
	if err := os.Symlink(testmodel.Path(t), filepath.Join(dir, "b-good.gguf")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "a-broken.gguf", "not a gguf at all")
	writeFile(t, dir, "notes.txt", "not a model")

	// With no default named, a damaged file that sorts first is not the
	// default: the first sound model is.
	entries, def, err := router.Entries(dir, "", "")
	if err != nil || len(entries) != 2 || entries[0].Name != "a-broken" || def != "b-good" {
		t.Fatalf("folder: entries %+v, default %q, err %v", entries, def, err)
	}

	file := writeFile(t, t.TempDir(), "models.json",
		`{"models":[{"name":"b-good","path":"`+testmodel.Path(t)+`","ctx":128},{"name":"c","path":"hf://o/r/c.gguf","default":true}]}`)
	entries, def, err = router.Entries(dir, file, "")
	if err != nil || len(entries) != 3 || def != "c" || entries[1].Name != "b-good" || entries[1].Ctx != 128 {
		t.Fatalf("folder and file: entries %+v, default %q, err %v", entries, def, err)
	}
	entries, def, err = router.Entries(dir, file, "ollama://llama3.2:1b")
	if err != nil || len(entries) != 4 || def != "llama3.2-1b" {
		t.Fatalf("with --model: entries %+v, default %q, err %v", entries, def, err)
	}

	two := writeFile(t, t.TempDir(), "two.json", `{"models":[{"path":"a.gguf","default":true},{"path":"b.gguf","default":true}]}`)
	if _, _, err := router.Entries("", two, ""); err == nil || !strings.Contains(err.Error(), "both") {
		t.Errorf("two defaults: %v", err)
	}
	if _, _, err := router.Entries(t.TempDir(), "", ""); err == nil || !strings.Contains(err.Error(), "no models") {
		t.Errorf("an empty folder: %v", err)
	}
	if _, _, err := router.Entries(filepath.Join(dir, "missing"), "", ""); err == nil {
		t.Errorf("a missing folder: no error")
	}
}

// In a models folder a projector is not a model: mmproj-NAME.gguf is NAME's projector, and a model without one has
// none.
func TestEntriesPairProjectors(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"llava.gguf", "mmproj-llava.gguf", "plain.gguf", "MMPROJ-other.gguf"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	entries, _, err := router.Entries(dir, "", "")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, e := range entries {
		got[e.Name] = filepath.Base(e.Mmproj)
	}
	want := map[string]string{"llava": "mmproj-llava.gguf", "plain": "."}
	if len(got) != len(want) || got["llava"] != want["llava"] || got["plain"] != want["plain"] {
		t.Errorf("entries %v, want %v", got, want)
	}
}
