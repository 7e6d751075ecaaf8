package chat_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"slices"
	"strings"
	"testing"
)

// Every interface that chat's code type-asserts a Generator for (the
// expression gen, or a field gen, asserted to a type) is embedded in
// chat.Engine, so that a wrapper which implements Engine forwards every
// capability the Responder uses (a wrapper without SavedTokens
// kept every conversation cold after a restart, and no test noticed).
func TestEngineListsEveryCapability(t *testing.T) {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var embedded []string
	asserted := map[string]string{} // type name -> where
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.TypeSpec:
				if it, ok := n.Type.(*ast.InterfaceType); ok && n.Name.Name == "Engine" {
					for _, m := range it.Methods.List {
						if id, ok := m.Type.(*ast.Ident); ok && len(m.Names) == 0 {
							embedded = append(embedded, id.Name)
						}
					}
				}
			case *ast.Field:
				// The check below finds a Generator by its name: hold every
				// field and parameter of type Generator to it.
				if id, ok := n.Type.(*ast.Ident); ok && id.Name == "Generator" {
					for _, nm := range n.Names {
						if nm.Name != "gen" {
							t.Errorf("%s: a Generator named %s, want gen (the name this test looks for)", fset.Position(nm.Pos()), nm.Name)
						}
					}
				}
			case *ast.TypeAssertExpr:
				if n.Type != nil && isGen(n.X) {
					if id, ok := n.Type.(*ast.Ident); ok {
						asserted[id.Name] = fset.Position(n.Pos()).String()
					} else {
						t.Errorf("%s: a Generator asserted to a type that is not a named interface of chat", fset.Position(n.Pos()))
					}
				}
			}
			return true
		})
	}
	if !slices.Contains(embedded, "Generator") {
		t.Fatalf("chat.Engine embeds %v: want Generator among them", embedded)
	}
	if len(asserted) == 0 {
		t.Fatal("found no type assertion on a Generator: the test no longer sees what it checks")
	}
	for name, where := range asserted {
		if !slices.Contains(embedded, name) {
			t.Errorf("%s: a Generator is asserted to %s, which chat.Engine does not embed", where, name)
		}
	}
}

// isGen reports whether x is the identifier gen or a selector of a field gen.
func isGen(x ast.Expr) bool {
	switch x := x.(type) {
	case *ast.Ident:
		return x.Name == "gen"
	case *ast.SelectorExpr:
		return x.Sel.Name == "gen"
	}
	return false
}
