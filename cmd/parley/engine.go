package main

import (
	"flag"
	"fmt"

	"github.com/parley-chat/parley/llm"
)

// engineFlags are the engine's flags: which engine, the decode threads'
// pool and polling, and where the weights live. Each has its PARLEY_
// environment variable, as every flag does.
type engineFlags struct {
	engine, lib string
	poll        int
	threadPool  bool
	hugePages   string
}

func (f *engineFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.engine, "engine", llm.EngineAuto, "llama.cpp engine: auto (current when its libraries load and no GPU is to be used, else embedded), embedded (built in, llama.cpp of 2025-12) or current (a current llama.cpp from --engine-lib, CPU; loads this year's architectures, and decodes faster on the CPU: docs/engines.md)")
	fs.StringVar(&f.lib, "engine-lib", "", "folder of the current engine's libraries (default: lib/llama-current beside bin/, as make setup lays it out)")
	fs.IntVar(&f.poll, "poll", llm.DefaultPoll, "how hard the decode threads poll for the next step, 0 (sleep at once) to 100; polling makes each step start sooner, at a small idle CPU cost (docs/notes/2026-11-25-thread-pool-and-engines.md)")
	fs.StringVar(&f.hugePages, "huge-pages", llm.HugePagesAuto, "where a model that runs on the CPU keeps its weights: auto (read into memory on 2 MiB transparent huge pages when the kernel offers them and the file is at most half the available memory; decodes faster, docs/notes/2026-11-27-huge-pages.md) or off (mapped from the file)")
	fs.BoolVar(&f.threadPool, "thread-pool", true, "keep one persistent pool of decode threads (false: ggml starts and joins its threads at every step)")
}

func (f *engineFlags) check() error {
	switch f.engine {
	case llm.EngineEmbedded, llm.EngineCurrent, llm.EngineAuto:
	default:
		return fmt.Errorf("--engine: want auto, embedded or current, got %q", f.engine)
	}
	if f.poll < 0 || f.poll > 100 {
		return fmt.Errorf("--poll: want 0 to 100, got %d", f.poll)
	}
	switch f.hugePages {
	case llm.HugePagesAuto, llm.HugePagesOff:
	default:
		return fmt.Errorf("--huge-pages: want auto or off, got %q", f.hugePages)
	}
	return nil
}

// apply sets cfg's fields from the flags.
func (f *engineFlags) apply(cfg *llm.Config) {
	cfg.Poll = f.poll
	if f.poll == 0 {
		cfg.Poll = -1 // the flag's 0 is "no polling"; Config's 0 is the default
	}
	cfg.NoThreadPool = !f.threadPool
	cfg.HugePages = f.hugePages
	cfg.Engine, cfg.LibDir = f.engine, f.lib
}
