package main

// Several models in one server (--models DIR, --models-file FILE): their
// flags, and the router (package router) that loads them on demand and
// gives each request its model's chat responder, as serve's models.

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/parley-chat/parley/chat"
	"github.com/parley-chat/parley/llm/registry"
	"github.com/parley-chat/parley/router"
)

// modelsFlags are the flags of several models.
type modelsFlags struct {
	dir, file       string
	maxLoaded       int
	memory          modelsBudget
	keepAlive       time.Duration
	clientKeepAlive keepAlivePolicyFlag
	minResidency    residencyFlag
}

func (m *modelsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&m.dir, "models", "", "serve every *.gguf in this folder, each named after its file (without .gguf); a request's model field picks one, loaded on first use")
	fs.StringVar(&m.file, "models-file", "", "a JSON file of models and their settings (docs/models.md); with --models, its entries add to and override the folder's")
	fs.IntVar(&m.maxLoaded, "max-loaded-models", 0, "models loaded at once at most, with several models (0 = no cap): the least recently used idle one unloads first")
	m.memory, m.minResidency = -1, -1
	fs.Var(&m.memory, "max-models-memory", "memory the loaded models may take together, estimated from each GGUF's size and its KV cache (auto = three quarters of the machine's memory; 0 = no budget); a model over the whole budget is refused before it loads; e.g. 8GiB")
	fs.DurationVar(&m.keepAlive, "keep-alive", registry.DefaultKeepAlive, "with several models, how long a model stays loaded after its last reply (a negative value: until it must make room); see --client-keep-alive for a request's keep_alive")
	fs.Var(&m.clientKeepAlive, "client-keep-alive", "what a request's keep_alive may do: extend (lengthen the model's stay after that reply, never shorten it or unload the model for others), obey (Ollama's: it becomes the model's, 0 unloads it), ignore")
	fs.Var(&m.minResidency, "min-residency", "how long a loaded model stays at least before it is unloaded for another model's room (requests for the other wait meanwhile): a duration, 0 = none, auto = 3x its own load time, at most a minute")
}

// modelsBudget is --max-models-memory: a size, or auto (< 0), three
// quarters of the machine's memory.
type modelsBudget int64

func (b *modelsBudget) String() string {
	if *b < 0 {
		return "auto"
	}
	return strconv.FormatInt(int64(*b), 10)
}

func (b *modelsBudget) Set(s string) error {
	if strings.EqualFold(strings.TrimSpace(s), "auto") {
		*b = -1
		return nil
	}
	var n byteSize
	if err := n.Set(s); err != nil {
		return err
	}
	*b = modelsBudget(n)
	return nil
}

// bytes is the budget in bytes (0: none): auto is three quarters of
// /proc/meminfo's MemTotal, or no budget where that cannot be read.
func (b modelsBudget) bytes() int64 {
	if b >= 0 {
		return int64(b)
	}
	return memTotal() / 4 * 3
}

// memTotal is the machine's memory in bytes (0 when unknown).
func memTotal() int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// keepAlivePolicyFlag is --client-keep-alive.
type keepAlivePolicyFlag registry.KeepAlivePolicy

func (p *keepAlivePolicyFlag) String() string { return registry.KeepAlivePolicy(*p).String() }

func (p *keepAlivePolicyFlag) Set(s string) error {
	v, err := registry.ParseKeepAlivePolicy(s)
	*p = keepAlivePolicyFlag(v)
	return err
}

// residencyFlag is --min-residency: a duration, or auto (< 0).
type residencyFlag time.Duration

func (r *residencyFlag) String() string {
	if *r < 0 {
		return "auto"
	}
	return time.Duration(*r).String()
}

func (r *residencyFlag) Set(s string) error {
	if strings.EqualFold(strings.TrimSpace(s), "auto") {
		*r = -1
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return fmt.Errorf("want a duration such as 10s, 0 or auto, got %q", s)
	}
	*r = residencyFlag(d)
	return nil
}

func (c config) severalModels() bool { return c.models.dir != "" || c.models.file != "" }

// newRouter configures every model of --models, --models-file and --model
// and the router over them.
func newRouter(cfg config, log *zap.Logger, stderr io.Writer, ropts []chat.Option) (*router.Router, error) {
	entries, def, err := router.Entries(cfg.models.dir, cfg.models.file, cfg.model)
	if err != nil {
		return nil, err
	}
	return router.New(router.Config{
		Entries:   entries,
		Default:   def,
		Engine:    engineConfig(cfg, "", log.Named("llm")),
		MaxTokens: cfg.maxTokens,
		Options:   ropts,
		Resolve: func(ctx context.Context, ref string) (string, error) {
			mc := cfg
			mc.model = ref
			return resolveModel(ctx, mc, stderr)
		},
		ResolveProjector: func(ctx context.Context, ref, mmproj string) (string, bool, error) {
			return resolveProjector(ctx, cfg, ref, mmproj, stderr)
		},
		MaxLoaded:       cfg.models.maxLoaded,
		MemoryBudget:    cfg.models.memory.bytes(),
		KeepAlive:       cfg.models.keepAlive,
		ClientKeepAlive: registry.KeepAlivePolicy(cfg.models.clientKeepAlive),
		MinResidency:    time.Duration(cfg.models.minResidency),
		Logger:          log,
	})
}
