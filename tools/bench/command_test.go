package main

import "testing"

// The recorded command names no path of the machine that ran it: models,
// outputs and peers' binaries by the variables the docs use, Parley's own
// files inside the repository relative to it.
func TestRecordedCommand(t *testing.T) {
	const root = "/home/me/parley"
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"models and outputs",
			[]string{"-models", "/tmp/m/a-f16.gguf,/home/me/.cache/parley/models/b.gguf", "-json", "/tmp/run/bench.json", "-scratch", "/tmp/run/scratch", "-out", "/tmp/run/BENCHMARKS.md"},
			"go run ./tools/bench -models $MODELS/a-f16.gguf,$MODELS/b.gguf -json $OUT/bench.json -scratch $OUT/scratch -out $OUT/BENCHMARKS.md"},
		{"the repository's own files",
			[]string{"-parley", "/home/me/parley/bin/parley", "-out", "/home/me/parley/BENCHMARKS.md", "-engine-lib", "lib/llama-current"},
			"go run ./tools/bench -parley bin/parley -out BENCHMARKS.md -engine-lib lib/llama-current"},
		{"binaries elsewhere",
			[]string{"--parley=/tmp/g/bin/parley", "-ollama", "/tmp/g/bin/ollama", "-llama-server=/opt/llama/bin/llama-server", "-engine-lib", "../other/lib"},
			"go run ./tools/bench --parley=$PARLEY_BIN -ollama $OLLAMA_BIN -llama-server=$LLAMA_SERVER_BIN -engine-lib $PARLEY_ENGINE_LIB"},
		{"other flags as given, spaces quoted",
			[]string{"-sessions", "1,8", "-raw=false", "-parley-args", "--max-conns-per-ip 1024", "-out", ""},
			"go run ./tools/bench -sessions 1,8 -raw=false -parley-args '--max-conns-per-ip 1024' -out ''"},
		{"a path flag last, without its value", []string{"-models"}, "go run ./tools/bench -models"},
	}
	for _, c := range cases {
		if got := recordedCommand(root, c.args); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, got, c.want)
		}
	}
	if got := modelFile("/tmp/gpurun/m/synthetic-llama1b-f16.gguf"); got != "$MODELS/synthetic-llama1b-f16.gguf" {
		t.Errorf("models table: %s", got)
	}
}
