package web_test

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"
)

// TestFamiliesStandApart holds the shape of web's packages: web (the
// server and the one route table) may import every package under it; an
// API family (a package under web/ outside web/internal) imports neither
// web nor another family; a shared package under web/internal imports
// neither web nor any family. It reads the import graph from go list.
func TestFamiliesStandApart(t *testing.T) {
	const root = "github.com/parley-chat/parley/web"
	out, err := exec.Command("go", "list", "-json=ImportPath,Deps", "./...").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	type pkg struct {
		ImportPath string
		Deps       []string
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("decode go list: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	internal := func(path string) bool { return strings.HasPrefix(path, root+"/internal/") }
	family := func(path string) bool { return strings.HasPrefix(path, root+"/") && !internal(path) }
	families := 0
	for _, p := range pkgs {
		if p.ImportPath == root {
			continue
		}
		if !strings.HasPrefix(p.ImportPath, root+"/") {
			t.Fatalf("go list ./... in web listed %s", p.ImportPath)
		}
		if family(p.ImportPath) {
			families++
		}
		for _, d := range p.Deps {
			switch {
			case d == root:
				t.Errorf("%s imports web: a package under web never imports the server", p.ImportPath)
			case family(d) && d != p.ImportPath:
				t.Errorf("%s imports the family %s: families and the shared core stand apart", p.ImportPath, d)
			}
		}
	}
	if len(pkgs) < 2 {
		t.Fatalf("go list found %d packages under web; want the server and its parts", len(pkgs))
	}
	t.Logf("%d packages under web, %d of them API families", len(pkgs), families)
}
