package main

import (
	"path/filepath"
	"strings"
)

// The command a report records names this machine's paths by variables, as
// the docs do, so that BENCHMARKS.md holds no machine's folders and a reader
// runs the command with their own: each model as $MODELS/<file>, the files
// the run writes as $OUT/<file>, the peers' binaries as $OLLAMA_BIN and
// $LLAMA_SERVER_BIN. Parley's binary and the current engine's libraries keep
// a path inside the repository (bin/parley, lib/llama-current), relative to
// its root; elsewhere they are $PARLEY_BIN and $PARLEY_ENGINE_LIB, the
// variables the tests read them from.

// pathFlags maps each flag whose value is a path to how it is recorded.
var pathFlags = map[string]func(root, path string) string{
	"models":       func(_, p string) string { return eachPath(p, modelFile) },
	"out":          func(root, p string) string { return inRepoOr(root, p, inDir("$OUT")) },
	"json":         func(root, p string) string { return inRepoOr(root, p, inDir("$OUT")) },
	"scratch":      func(root, p string) string { return inRepoOr(root, p, inDir("$OUT")) },
	"ollama":       func(_, _ string) string { return "$OLLAMA_BIN" },
	"llama-server": func(_, _ string) string { return "$LLAMA_SERVER_BIN" },
	"parley":       func(root, p string) string { return inRepoOr(root, p, named("$PARLEY_BIN")) },
	"engine-lib":   func(root, p string) string { return inRepoOr(root, p, named("$PARLEY_ENGINE_LIB")) },
}

// recordedCommand is the command line of a run with args, for the report:
// the paths in args named as pathFlags says (root is the repository's), an
// argument with spaces quoted.
func recordedCommand(root string, args []string) string {
	out := []string{"go", "run", "./tools/bench"}
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, value, inline := strings.Cut(strings.TrimLeft(a, "-"), "=")
		path, isPath := pathFlags[name]
		record := func(root, v string) string {
			if v == "" {
				return "''" // "none", as -out "" says
			}
			return path(root, v)
		}
		switch {
		case !strings.HasPrefix(a, "-") || !isPath:
			out = append(out, shellQuote(a))
		case inline:
			out = append(out, a[:len(a)-len(value)]+record(root, value))
		case i+1 < len(args):
			i++
			out = append(out, a, record(root, args[i]))
		default:
			out = append(out, a)
		}
	}
	return strings.Join(out, " ")
}

// modelFile is how the report names a model's file: $MODELS/<file>.
func modelFile(path string) string { return inDir("$MODELS")(path) }

// eachPath records each path of a comma-separated list.
func eachPath(list string, record func(string) string) string {
	var out []string
	for _, p := range splitList(list) {
		out = append(out, record(p))
	}
	return strings.Join(out, ",")
}

// inDir records a path as its file name in the folder named by variable.
func inDir(variable string) func(string) string {
	return func(p string) string { return variable + "/" + filepath.Base(p) }
}

// named records any path as variable.
func named(variable string) func(string) string { return func(string) string { return variable } }

// inRepoOr records a path inside the repository at root relative to it
// (a relative path is taken as one already), any other by record.
func inRepoOr(root, p string, record func(string) string) string {
	if !filepath.IsAbs(p) {
		if c := filepath.Clean(p); c != ".." && !strings.HasPrefix(c, "../") && !strings.HasPrefix(p, "~") {
			return c
		}
		return record(p)
	}
	if rel, err := filepath.Rel(root, p); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
		return rel
	}
	return record(p)
}

// shellQuote quotes an argument with white space or quotes for a POSIX shell.
func shellQuote(a string) string {
	if a != "" && !strings.ContainsAny(a, " \t\n'\"$`\\") {
		return a
	}
	return "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
}
