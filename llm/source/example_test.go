package source_test

import (
	"context"
	"fmt"
	"os"

	"github.com/parley-chat/parley/llm/source"
)

// How the entry point resolves --model before loading it: a terminal bar for
// downloads, the checksum from --model-sha256, errors printed as they are.
func ExampleResolve() {
	ctx := context.Background()
	bar := source.NewProgressBar(os.Stderr)
	path, err := source.Resolve(ctx, "hf://ggml-org/models/tinyllamas/stories260K.gguf",
		source.WithSHA256("270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d"),
		source.WithProgress(bar.Update),
	)
	bar.Finish()
	if err != nil {
		fmt.Fprintln(os.Stderr, err) // e.g. "... cannot reach the hub (offline?) ..."
		return
	}
	fmt.Println("loading", path)
}
