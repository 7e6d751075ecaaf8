// Command parley serves a WebSocket chat (and HTTP streaming APIs) over a
// llama.cpp model running in-process.
//
//	parley --model stories260K.gguf            # chat at http://127.0.0.1:8000
//
// Every flag can also be set with an environment variable: --max-tokens is
// PARLEY_MAX_TOKENS. Flags win over the environment.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
	"github.com/parley-chat/parley/llm"
	"github.com/parley-chat/parley/llm/kvcache"
	"github.com/parley-chat/parley/llm/offload"
	"github.com/parley-chat/parley/llm/source"
	"github.com/parley-chat/parley/mcp"
	"github.com/parley-chat/parley/media"
	"github.com/parley-chat/parley/router"
	"github.com/parley-chat/parley/session"
	"github.com/parley-chat/parley/web"
)

func main() {
	if chat.SandboxChild(os.Getenv) {
		// This process is the chat-template sandbox another parley started (chat.NewSandbox).
		os.Exit(chat.ServeSandbox(os.Getenv, os.Stdin, os.Stdout))
	}
	if llm.GPUProbeChild(os.Getenv) {
		// This process is the current engine's GPU probe another parley started.
		os.Exit(llm.ServeGPUProbe(os.Getenv))
	}
	if media.DecoderChild(os.Getenv) {
		// This process is an image decoder another parley started (media.NewDecoder).
		os.Exit(media.ServeDecoder(os.Getenv, os.Stdin, os.Stdout))
	}
	if len(os.Args) > 1 && os.Args[1] == "healthcheck" {
		os.Exit(healthcheck(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "store" {
		os.Exit(storeCommand(os.Args[2:], os.Stdout, os.Stderr))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "parley:", err)
		os.Exit(1)
	}
}

// The web server takes the session layer as a web.Sessions and mounts the
// Responses and Conversations APIs only when a type assertion finds
// web.Conversations on it; these lines make a Service that stops
// satisfying either a compile error here instead of a silent 404 there.
var (
	_ web.Sessions      = (*session.Service)(nil)
	_ web.Conversations = (*session.Service)(nil)
)

// config is every flag's value.
type config struct {
	model, modelSHA256, modelCache, ollamaModels string
	addr, systemPrompt, logFormat, logLevel      string
	store, dataDir, apiKey, template             string
	userEntries                                  userFlag
	usersFile                                    string
	cacheScope                                   string // --cache-scope: user or client
	users                                        []web.UserKey
	allowedOrigins, allowedHosts                 string
	ctx, threads, parallel, queue, batch         int
	queuePerClient, slotsPerClient               int
	flashAttn, kvCacheType                       string
	gpuLayers                                    gpuLayersFlag
	kvUnified                                    string
	cacheSlots                                   int
	version                                      bool
	maxTokens, maxTokensLimit                    int
	maxConns, maxConnsPerIP, promptsPerMinute    int
	maxPromptTokens, maxQueuedPrompts            int
	maxSessions                                  int
	maxSessionBytes                              int
	maxMessageBytes                              int64
	sessionTTL, drainTimeout                     time.Duration
	resumeGrace                                  time.Duration
	resumeBuffer                                 int
	temperature, topP, minP, repeatPenalty       float64
	topK, repeatLastN                            int
	seed                                         int64
	llamaLog                                     bool
	// the step budget, the body timeout, TCP connections
	stepBudget, bodyTimeout time.Duration
	draft                   string
	draftMax                int
	draftModel              string
	maxHTTPConns            int
	// per-client limits, byte budgets
	maxSessionsPerClient, sessionCreatesPerMinute, maxUnusedPerClient int
	evictIdleFloor                                                    time.Duration
	maxStoreBytes, maxBodyBytesInflight                               int64
	clientStoreShare                                                  float64
	maxHTTPConnsPerIP                                                 int
	// the KV swap: bytes of sessions' KV state kept in RAM and on disk
	kvCacheRAM, kvCacheDisk, kvCacheMinFree byteSize
	// the KV states in a tier every replica reaches
	kvShared      string
	kvSharedBytes byteSize
	kvSharedWait  bool
	kvTier        kvcache.Tier // opened by run from kvShared; nil without
	tools         *mcp.Manager // opened by run from mcp; the server's tools (none without --mcp-config)
	// the engine
	engine engineFlags
	// several models
	models modelsFlags
	// images: the projector, limits, decoder, remote URLs
	vision visionFlags
	// MCP servers (tools that run on the server)
	mcpConfig string
	mcp       *mcp.Config // read from mcpConfig; nil without it
}

// declareFlags declares every flag on a new FlagSet, its values in c.
func declareFlags(c *config, getenv func(string) string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("parley", flag.ContinueOnError)
	fs.SetOutput(stderr)
	def := parley.DefaultParams()
	fs.StringVar(&c.model, "model", "", "model: a GGUF file path, hf://OWNER/REPO/FILE.gguf[@REVISION] or ollama://NAME[:TAG] (required, unless --models or --models-file; with them, the default model)")
	fs.StringVar(&c.modelSHA256, "model-sha256", "", "expected sha256 of the model file (checked after download)")
	fs.StringVar(&c.modelCache, "model-cache", "", "where hf:// downloads are kept (default: the user cache dir, parley/models)")
	fs.StringVar(&c.ollamaModels, "ollama-models", "", "Ollama model store for ollama:// (default: $OLLAMA_MODELS or ~/.ollama/models)")
	fs.StringVar(&c.addr, "addr", "127.0.0.1:8000", "address to listen on")
	fs.IntVar(&c.ctx, "ctx", llm.DefaultContextLength, "context window per session, in tokens")
	fs.IntVar(&c.threads, "threads", defaultThreads(), "CPU threads for llama.cpp (default: half the logical CPUs, about the physical cores)")
	fs.IntVar(&c.parallel, "parallel", llm.DefaultParallel, "replies generated at once (KV-cache slots)")
	fs.IntVar(&c.cacheSlots, "cache-slots", 0, "KV-cache slots kept, at least --parallel (the default): conversations whose cache survives between turns, so that more stateless clients than --parallel that resend their conversation are evaluated only for their new tokens; each costs --ctx tokens of KV memory")
	fs.IntVar(&c.queue, "queue", llm.DefaultQueueSize, "replies that may wait for a slot before clients are told the server is busy")
	fs.IntVar(&c.queuePerClient, "queue-per-client", 0, "of those, how many one client (address, or named user) may have waiting; past it its requests get 503 busy with Retry-After while others still get in (0 = half of --queue plus --parallel)")
	fs.IntVar(&c.slotsPerClient, "slots-per-client", 0, "slots one client may hold while another client waits for one (alone it may use all; waiting clients are served round robin either way; 0 = --parallel minus a quarter, -1 = no cap)")
	fs.IntVar(&c.batch, "batch", llm.DefaultBatchSize, "llama.cpp batch size in tokens")
	fs.StringVar(&c.flashAttn, "flash-attn", "auto", "flash attention: off, on or auto (auto: on when layers run on a GPU, off on the CPU, where off is faster as conversations grow; see BENCHMARKS.md, Flash attention on CPU)")
	fs.StringVar(&c.kvCacheType, "kv-cache-type", "f16", "KV cache element type: f16, q8_0 (about half the memory per session) or q4_0 (a quarter); quantized needs flash attention (on, or auto on a GPU)")
	fs.StringVar(&c.kvUnified, "kv-unified", "off", "one KV cache buffer shared by all --parallel slots (on) instead of one per slot (off, the default: the faster at 64 sessions on an H100, docs/notes/2026-11-25-gpu.md)")
	c.gpuLayers = gpuLayersFlag(offload.Auto)
	fs.Var(&c.gpuLayers, "gpu-layers", "layers offloaded to the GPU: auto (as many as fit in its free memory with the KV cache for --parallel x --ctx), 0 (CPU only) or a count; without a GPU the model runs on the CPU")
	fs.IntVar(&c.maxTokens, "max-tokens", def.MaxTokens, "default reply cap in tokens")
	fs.IntVar(&c.maxTokensLimit, "max-tokens-limit", 4096, "the largest reply cap a client may ask for")
	fs.StringVar(&c.systemPrompt, "system-prompt", "", "system prompt for new sessions")
	fs.StringVar(&c.template, "template", "", "chat template override: a family (chatml, llama3, llama2, mistral, gemma, phi3, phi4, zephyr, plain) or a Jinja template file; default: the model's own (tokenizer.chat_template)")
	fs.Float64Var(&c.temperature, "temperature", def.Temperature, "default sampling temperature (0 = greedy)")
	fs.IntVar(&c.topK, "top-k", def.TopK, "default top-k (0 = off)")
	fs.Float64Var(&c.topP, "top-p", def.TopP, "default top-p (1 = off)")
	fs.Float64Var(&c.minP, "min-p", def.MinP, "default min-p (0 = off)")
	fs.Float64Var(&c.repeatPenalty, "repeat-penalty", def.RepeatPenalty, "default repetition penalty (1 = off)")
	fs.IntVar(&c.repeatLastN, "repeat-last-n", def.RepeatLastN, "tokens the repetition penalty looks back over")
	fs.Int64Var(&c.seed, "seed", def.Seed, "default seed (-1 = random)")
	fs.BoolVar(&c.version, "version", false, "print Parley's version and its llama.cpp engines', then exit")
	fs.StringVar(&c.logFormat, "log-format", "", "log format: console or json (default: console on a terminal, else json)")
	fs.StringVar(&c.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.BoolVar(&c.llamaLog, "llama-log", false, "show llama.cpp's own log lines on stderr")
	fs.StringVar(&c.store, "store", "bolt", "session store: bolt (durable file under --data-dir), memory, or redis://HOST:PORT/DB (shared by replicas)")
	fs.StringVar(&c.dataDir, "data-dir", defaultDataDir(getenv), "directory for the session database")
	fs.DurationVar(&c.sessionTTL, "session-ttl", 24*time.Hour, "idle sessions expire after this long")
	fs.IntVar(&c.maxSessionBytes, "max-session-bytes", session.DefaultMaxBytes, "bytes of one conversation's text kept (its system prompt and messages; images have their own budget, --image-max-bytes-per-conversation): past it the oldest turns are dropped, never the newest (0 = no cap)")
	fs.IntVar(&c.maxSessions, "max-sessions", 10000, "sessions kept at most; when full, the least recently used one is evicted if idle past --evict-idle-floor, else the new session is refused (507)")
	fs.DurationVar(&c.evictIdleFloor, "evict-idle-floor", session.DefaultEvictFloor, "a full store evicts only sessions idle for longer than this (0 = any, the least recently used first)")
	fs.IntVar(&c.maxSessionsPerClient, "max-sessions-per-client", session.DefaultMaxPerOwner, "sessions one client (an IPv4 address or an IPv6 /64) may hold at once (over it: 429; 0 = no bound)")
	fs.IntVar(&c.sessionCreatesPerMinute, "session-creates-per-minute", session.DefaultCreatesPerMinute, "sessions one client may create per minute, WebSocket chats, conversations and responses together (over it: 429; 0 = no bound)")
	fs.IntVar(&c.maxUnusedPerClient, "max-unused-per-client", session.DefaultMaxUnused, "WebSocket sessions one client may hold that never ran a turn; past it its oldest such session is deleted")
	fs.StringVar(&c.allowedOrigins, "allowed-origins", "", "comma-separated origins allowed to open WebSockets besides the server's own (* = any)")
	fs.StringVar(&c.allowedHosts, "allowed-hosts", "", "comma-separated Host header values accepted (DNS-rebinding guard; * = any); default: IP addresses, localhost and the --addr host")
	fs.StringVar(&c.apiKey, "api-key", "", "require this key (Authorization: Bearer, or WebSocket subprotocol parley.key.KEY)")
	fs.Var(&c.userEntries, "user", "a named user NAME:KEY (repeat for more): the key is accepted like --api-key's, and its user reaches only its own conversations")
	fs.StringVar(&c.mcpConfig, "mcp-config", "", "JSON file of the MCP servers Parley runs tools on, and which users may use which of their tools (see the README)")
	fs.StringVar(&c.usersFile, "users", "", "file of named users, one NAME:KEY a line (# comments), as --user")
	fs.StringVar(&c.cacheScope, "cache-scope", "user", "who shares KV caches (a slot's prompt, a copied prefix, saved states): user (each user its own; without named users, every client of the one key) or client (each client address of each user its own)")
	fs.Int64Var(&c.maxMessageBytes, "max-message-bytes", web.DefaultMaxMessageBytes, "largest WebSocket message accepted; a JSON-mode message with images may be larger by what its images may take (--image-max-bytes x --image-max-per-request, as base64), its bytes past this held from the body budget")
	fs.IntVar(&c.maxConns, "max-conns", web.DefaultMaxConns, "open WebSocket connections at most")
	fs.IntVar(&c.maxConnsPerIP, "max-conns-per-ip", web.DefaultMaxConnsPerIP, "open WebSocket connections per client address at most")
	fs.IntVar(&c.promptsPerMinute, "prompts-per-minute", web.DefaultPromptsPerMinute, "prompts per connection per minute at most")
	fs.IntVar(&c.maxPromptTokens, "max-prompt-tokens", web.DefaultMaxPromptTokens, "tokens in one prompt at most (over it: too_large; -1 = no cap)")
	fs.IntVar(&c.maxQueuedPrompts, "max-queued-prompts", web.DefaultMaxQueuedPrompts, "prompts that may wait on one connection behind the reply streaming")
	fs.DurationVar(&c.drainTimeout, "drain-timeout", web.DefaultDrainTimeout, "on shutdown, how long running replies may finish")
	fs.DurationVar(&c.resumeGrace, "resume-grace", defaultResumeGrace, "how long a chat reply goes on after its WebSocket drops, for a client that resumes the session (0 = cancel at once)")
	fs.IntVar(&c.resumeBuffer, "resume-buffer", web.DefaultResumeBuffer, "tokens a chat reply may generate while no client follows it; past it the reply is cancelled")
	fs.DurationVar(&c.bodyTimeout, "body-timeout", web.DefaultBodyTimeout, "longest a client may take to send a request body")
	fs.IntVar(&c.maxHTTPConns, "max-http-conns", web.DefaultMaxHTTPConns, "open TCP connections at most, WebSockets included (over it: 503)")
	fs.Int64Var(&c.maxStoreBytes, "max-store-bytes", 0, "bytes the session store may hold (records); a write past it is refused with 507 store_full. 0 = 1 GiB, and with --store bolt at most half the free space of --data-dir at start; -1 = no budget")
	fs.Float64Var(&c.clientStoreShare, "client-store-share", session.DefaultClientShare, "fraction of --max-store-bytes the sessions created by one client (an IPv4 address or an IPv6 /64) may hold (over it: 507; 1 = no share limit)")
	fs.Int64Var(&c.maxBodyBytesInflight, "max-body-bytes-inflight", web.DefaultMaxBodyBytesInflight, "bytes of request bodies held at once by the requests being handled (one address: a quarter); over it: 503 (429), Retry-After")
	fs.IntVar(&c.maxHTTPConnsPerIP, "max-http-conns-per-ip", web.DefaultMaxHTTPConnsPerIP, "open TCP connections per client address at most, WebSockets included (over it: 429)")
	fs.StringVar(&c.draft, "draft", llm.DraftAuto, "speculative decoding from the conversation's own text (greedy replies are the same tokens): auto drafts where the step times it measures say drafts pay, ngram whenever the conversation offers a continuation, off never")
	fs.IntVar(&c.draftMax, "draft-max", llm.DefaultDraftMax, "longest draft per reply and decode step, in tokens")
	fs.StringVar(&c.draftModel, "draft-model", "", "a small GGUF model of the same vocabulary whose greedy continuation is the draft, instead of the conversation's text (one model only; --draft off then means auto)")
	fs.DurationVar(&c.stepBudget, "step-budget", llm.DefaultStepBudget, "longest one reply may take to sample one token (grammar matching included); a reply over it is ended with an error")
	kvCacheFlags(fs, c)
	c.engine.register(fs)
	c.models.register(fs)
	c.vision.register(fs)

	fs.Usage = func() { printUsage(fs, stderr) }
	return fs
}

func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	var c config
	fs := declareFlags(&c, getenv, stderr)
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if c.version {
		return c, nil // nothing else is needed to say the version
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name == "version" {
			return // a command, not a setting: an environment that holds PARLEY_VERSION still serves
		}
		env := envName(f.Name)
		if v := getenv(env); v != "" && !set[f.Name] && envErr == nil {
			if err := fs.Set(f.Name, v); err != nil {
				envErr = fmt.Errorf("%s: %w", env, err)
			}
		}
	})
	if envErr != nil {
		return c, envErr
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q (flags start with --)", fs.Arg(0))
	}
	if c.model == "" && !c.severalModels() {
		return c, errors.New("no model: give --model PATH (a GGUF file) or set PARLEY_MODEL, or --models DIR or --models-file FILE for several")
	}
	if c.draftModel != "" && c.severalModels() {
		return c, errors.New("--draft-model drafts for one model: it cannot be combined with --models or --models-file")
	}
	users, err := loadUsers(c.userEntries, c.usersFile, c.apiKey)
	if err != nil {
		return c, err
	}
	c.users = users
	if c.mcpConfig != "" {
		if c.mcp, err = mcp.LoadConfig(c.mcpConfig, getenv); err != nil {
			return c, fmt.Errorf("--mcp-config: %w", err)
		}
	}
	if c.cacheScope != "user" && c.cacheScope != "client" {
		return c, fmt.Errorf("--cache-scope: want user or client, got %q", c.cacheScope)
	}
	if err := router.CheckMaxTokens(c.maxTokens, c.ctx); err != nil {
		return c, err
	}
	if err := c.engine.check(); err != nil {
		return c, err
	}
	return c, nil
}

func defaultDataDir(getenv func(string) string) string {
	if d := getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "parley")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "share", "parley")
	}
	return "parley-data"
}

func newLogger(format, level string, w io.Writer) (*zap.Logger, error) {
	var lvl zapcore.Level
	if err := lvl.Set(level); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	if format == "" {
		format = "json"
		if f, ok := w.(*os.File); ok && isTerminal(f) {
			format = "console"
		}
	}
	encCfg := zap.NewProductionEncoderConfig()
	encCfg.EncodeTime = zapcore.ISO8601TimeEncoder
	encCfg.EncodeDuration = zapcore.StringDurationEncoder
	var enc zapcore.Encoder
	switch format {
	case "json":
		enc = zapcore.NewJSONEncoder(encCfg)
	case "console":
		encCfg.EncodeLevel = zapcore.CapitalColorLevelEncoder
		enc = zapcore.NewConsoleEncoder(encCfg)
	default:
		return nil, fmt.Errorf("--log-format: want console or json, got %q", format)
	}
	return zap.New(zapcore.NewCore(enc, zapcore.AddSync(w), lvl)), nil
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// run is the whole program: it returns when ctx ends (a signal) or on a fatal error.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	cfg, err := parseFlags(args, getenv, stderr)
	if err != nil {
		return err
	}
	if cfg.version {
		version, binding := web.BuildVersions()
		fmt.Fprintf(stderr, "parley %s\nengines: embedded %s; current llama.cpp ggml %s (its libraries loaded at run time)\n",
			version, binding, llm.CurrentGGMLVersion)
		return flag.ErrHelp // exit 0, as --help
	}
	log, err := newLogger(cfg.logFormat, cfg.logLevel, stderr)
	if err != nil {
		return err
	}
	defer log.Sync()
	llm.SetNativeLogger(log.Named("llama"), cfg.llamaLog)          // escaped, capped, rate-limited; chatter off unless asked
	slog.SetDefault(slog.New(&slogToZap{log: log.Named("llama")})) // the binding's own lines, structured

	if cfg.maxHTTPConns <= cfg.maxConns {
		log.Warn("--max-http-conns is not above --max-conns: when WebSockets reach their cap, /health and the HTTP APIs are refused too",
			zap.Int("max_http_conns", cfg.maxHTTPConns), zap.Int("max_conns", cfg.maxConns))
	}

	defaults, err := defaultParams(cfg)
	if err != nil {
		return err
	}

	// The model's chat template is untrusted code: it renders in a child process under time and memory limits.
	sandbox := chat.NewSandbox()
	defer sandbox.Close()
	// Images decode in child processes too (media), started on the first image.
	imageDecoder := cfg.vision.media.NewDecoder()
	defer imageDecoder.Close()
	cfg.vision.stats = &media.Stats{}
	ropts := []chat.Option{chat.WithLogger(log.Named("chat")), chat.WithJinjaRenderer(sandbox)}
	ropts = append(ropts, imageOptions(cfg.vision, imageDecoder)...)
	if cfg.template != "" {
		opt, err := router.TemplateOption(cfg.template)
		if err != nil {
			return fmt.Errorf("--template: %w", err)
		}
		ropts = append(ropts, opt)
	}

	store, err := openStore(cfg, log)
	if err != nil {
		return err
	}
	defer store.Close()
	// Closed after the engines (below, or in serveSeveral), which flush
	// their states to it when they shut down.
	tier, err := openKVTier(ctx, cfg, log)
	if err != nil {
		return err
	}
	if tier != nil {
		defer tier.Close()
		cfg.kvTier = tier
	}

	// The MCP servers' sessions close, and the servers Parley started die,
	// after the web server has drained (deferred calls run last).
	tools := openMCP(cfg, log)
	defer tools.Close()
	cfg.tools = tools

	var m models
	if cfg.severalModels() {
		if m, err = newSeveralModels(cfg, log, stderr, ropts); err != nil {
			return err
		}
	} else {
		m = newOneModel(cfg, log, stderr, ropts)
	}
	return serve(ctx, cfg, log, store, defaults, m)
}

// newSessions is the session layer over store, its replies from r.
func newSessions(cfg config, store session.Store, defaults parley.Params, r parley.Responder, log *zap.Logger) *session.Service {
	return session.NewService(store, r,
		session.WithSystemPrompt(cfg.systemPrompt),
		session.WithMaxConversationImages(cfg.vision.media.Limits.MaxConversationImages),
		session.WithMaxConversationImageBytes(cfg.vision.media.Limits.WithDefaults().MaxConversationBytes),
		session.WithDefaultParams(defaults),
		session.WithClientLimits(cfg.sessionCreatesPerMinute, cfg.maxUnusedPerClient),
		session.WithLogger(log.Named("session")))
}

// defaultParams is the sampling defaults the flags set, validated.
func defaultParams(cfg config) (parley.Params, error) {
	defaults := parley.DefaultParams()
	defaults.MaxTokens = cfg.maxTokens
	defaults.Temperature = cfg.temperature
	defaults.TopK = cfg.topK
	defaults.TopP = cfg.topP
	defaults.MinP = cfg.minP
	defaults.RepeatPenalty = cfg.repeatPenalty
	defaults.RepeatLastN = cfg.repeatLastN
	defaults.Seed = cfg.seed
	if err := defaults.Validate(cfg.maxTokensLimit); err != nil {
		return defaults, fmt.Errorf("default sampling flags: %s", parley.ErrorMessage(err))
	}
	return defaults, nil
}

// defaultResumeGrace is --resume-grace's default: long enough for a page
// reload or a switch of network, short enough that an abandoned reply does
// not hold its slot for long.
const defaultResumeGrace = 10 * time.Second

// serverConfig is the web server's configuration from the flags.
func serverConfig(cfg config, defaults parley.Params) web.Config {
	return web.Config{
		Addr:             cfg.addr,
		AllowedOrigins:   splitList(cfg.allowedOrigins),
		AllowedHosts:     splitList(cfg.allowedHosts),
		APIKey:           cfg.apiKey,
		Users:            cfg.users,
		CachePerClient:   cfg.cacheScope == "client",
		MaxMessageBytes:  cfg.maxMessageBytes,
		MaxConns:         cfg.maxConns,
		MaxConnsPerIP:    cfg.maxConnsPerIP,
		PromptsPerMinute: cfg.promptsPerMinute,
		MaxPromptTokens:  cfg.maxPromptTokens,
		MaxQueuedPrompts: cfg.maxQueuedPrompts,
		DrainTimeout:     cfg.drainTimeout,
		Defaults:         defaults,
		MaxTokensCap:     cfg.maxTokensLimit,
		BodyTimeout:      cfg.bodyTimeout,
		MaxHTTPConns:     cfg.maxHTTPConns,

		MaxHTTPConnsPerIP:    cfg.maxHTTPConnsPerIP,
		MaxBodyBytesInflight: cfg.maxBodyBytesInflight,
		ResumeGrace:          cfg.resumeGrace,
		ResumeBuffer:         cfg.resumeBuffer,
	}
}

// loadEngine resolves --model (downloading hf:// references) and loads it,
// showing progress on stderr, then logs the model's facts.
func loadEngine(ctx context.Context, cfg config, log *zap.Logger, stderr io.Writer) (*llm.Engine, error) {
	modelPath, err := resolveModel(ctx, cfg, stderr)
	if err != nil {
		return nil, err
	}
	log.Info("loading model", zap.String("model", cfg.model), zap.String("path", modelPath))
	progress := newLoadProgress(stderr)
	lcfg := engineConfig(cfg, modelPath, log.Named("llm"))
	lcfg.Progress = progress.update
	proj, explicit, err := resolveProjector(ctx, cfg, cfg.model, cfg.vision.mmproj, stderr)
	switch {
	case err != nil && explicit:
		return nil, fmt.Errorf("--mmproj: %w", err)
	case err != nil:
		log.Warn("no projector loaded: name one with --mmproj", zap.Error(err))
	}
	lcfg.Projector = proj
	eng, err := llm.Open(lcfg)
	if err != nil && proj != "" && !explicit {
		// A projector found beside the model is a convenience: one that does not load leaves a text model.
		log.Warn("the projector that came with the model did not load; serving without images", zap.String("projector", proj), zap.Error(err))
		lcfg.Projector = ""
		eng, err = llm.Open(lcfg)
	}
	progress.done()
	if err != nil {
		return nil, explainLoadFailure(err, lcfg, cfg)
	}
	info := eng.Info()
	log.Info("model loaded",
		zap.String("engine", eng.EngineName()),
		zap.String("name", info.Name),
		zap.String("architecture", info.Architecture),
		zap.Uint64("parameters", info.Parameters),
		zap.String("quantization", info.Quantization),
		zap.Int("train_context", info.TrainContext),
		zap.Int("context_per_session", info.ContextLength),
		zap.Int("parallel", info.Parallel),
		zap.String("device", info.Device.Name),
		zap.Int("gpu_layers", info.Device.LayersOffloaded),
		zap.Bool("flash_attn", info.Device.FlashAttention),
		zap.Bool("kv_unified", info.Device.KVUnified),
		zap.Uint64("huge_pages_mib", info.Device.HugePagesBytes>>20),
		zap.String("kv_cache_type", cfg.kvCacheType),
		zap.Bool("chat_template", info.ChatTemplate != ""),
		zap.Bool("vision", info.Vision), zap.String("projector", lcfg.Projector),
		zap.Duration("load_time", info.LoadTime))
	return eng, nil
}

// engineConfig is the engine's configuration from the flags, for the model
// file at path.
func engineConfig(cfg config, path string, log *zap.Logger) llm.Config {
	lcfg := llm.Config{
		Path:           path,
		ContextLength:  cfg.ctx,
		Parallel:       cfg.parallel,
		Threads:        cfg.threads,
		BatchSize:      cfg.batch,
		FlashAttention: cfg.flashAttn,
		GPULayers:      int(cfg.gpuLayers),
		KVUnified:      cfg.kvUnified,
		CacheSlots:     cfg.cacheSlots,
		KVCacheType:    cfg.kvCacheType,
		QueueSize:      cfg.queue,
		StepBudget:     cfg.stepBudget,
		Draft:          cfg.draft,
		DraftMax:       cfg.draftMax,
		DraftModel:     cfg.draftModel,
		// Fair sharing between clients (llm/fairqueue.go).
		MaxQueuedPerClient: cfg.queuePerClient,
		MaxSlotsPerClient:  cfg.slotsPerClient,
		KVCache:            kvCacheConfig(cfg),
		Logger:             log,
	}
	cfg.engine.apply(&lcfg)
	return lcfg
}

// resolveModel turns --model into a local GGUF path, downloading hf://
// references (with a progress bar) and finding ollama:// ones in the store.
func resolveModel(ctx context.Context, cfg config, stderr io.Writer) (string, error) {
	opts := sourceOptions(cfg)
	if cfg.modelSHA256 != "" {
		opts = append(opts, source.WithSHA256(cfg.modelSHA256))
	}
	bar := source.NewProgressBar(stderr)
	path, err := source.Resolve(ctx, cfg.model, append(opts, source.WithProgress(bar.Update))...)
	bar.Finish()
	if err != nil {
		return "", fmt.Errorf("model: %w", err)
	}
	return path, nil
}

// sourceOptions are where models are fetched to and found: --model-cache, --ollama-models.
func sourceOptions(cfg config) []source.Option {
	var opts []source.Option
	if cfg.modelCache != "" {
		opts = append(opts, source.WithCacheDir(cfg.modelCache))
	}
	if cfg.ollamaModels != "" {
		opts = append(opts, source.WithOllamaDir(cfg.ollamaModels))
	}
	return opts
}

func openStore(cfg config, log *zap.Logger) (session.Store, error) {
	budget := storeBudget(cfg, log)
	opts := []session.StoreOption{
		session.WithTTL(cfg.sessionTTL),
		session.WithMaxSessions(cfg.maxSessions),
		session.WithMaxBytes(cfg.maxSessionBytes),
		session.WithMaxPerOwner(cfg.maxSessionsPerClient),
		session.WithEvictFloor(cfg.evictIdleFloor),
		session.WithStoreLogger(log.Named("store")),
		session.WithMaxStoreBytes(budget),
		session.WithClientShare(cfg.clientStoreShare),
	}
	switch cfg.store {
	case "memory":
		return session.NewMemoryStore(opts...), nil
	case "bolt":
		if err := os.MkdirAll(cfg.dataDir, 0o700); err != nil {
			return nil, fmt.Errorf("data dir: %w", err)
		}
		path := filepath.Join(cfg.dataDir, "sessions.db")
		st, err := session.OpenBoltStore(path, opts...)
		if err != nil {
			return nil, fmt.Errorf("session store: %w", err)
		}
		log.Info("sessions stored", zap.String("path", path))
		return st, nil
	default:
		if strings.HasPrefix(cfg.store, "redis://") || strings.HasPrefix(cfg.store, "rediss://") {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			redis.SetLogger(session.RedisLogger{L: log.Named("redis")}) // JSON log lines, not the client's own
			st, err := session.OpenRedisStore(ctx, cfg.store, "parley:", opts...)
			if err != nil {
				return nil, err
			}
			log.Info("sessions stored", zap.String("redis", st.Addr()))
			return st, nil
		}
		return nil, fmt.Errorf("--store: want bolt, memory or redis://HOST:PORT/DB, got %q", cfg.store)
	}
}

// storeBudget is the store's byte budget: --max-store-bytes, or by default
// session.DefaultMaxStoreBytes, and for bbolt at most half of the data
// directory's free space at start (the other half leaves room for the
// compaction copy and for the file's growth steps), never under 16 MiB. A
// disk that fills anyway answers writes with store_full.
func storeBudget(cfg config, log *zap.Logger) int64 {
	switch {
	case cfg.maxStoreBytes < 0:
		return 0
	case cfg.maxStoreBytes > 0:
		return cfg.maxStoreBytes
	}
	budget := int64(session.DefaultMaxStoreBytes)
	if cfg.store == "bolt" {
		if free, err := freeBytes(cfg.dataDir); err == nil && free/2 < budget {
			budget = max(free/2, 16<<20)
			log.Info("store budget sized to the data dir's free space", zap.Int64("max_store_bytes", budget), zap.Int64("free_bytes", free))
		}
	}
	return budget
}

// freeBytes is the space an unprivileged process may still use under dir.
func freeBytes(dir string) (int64, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, err
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// storeUsage is what /metrics reads of the store's byte budget.
func storeUsage(st session.Store) func() session.Usage {
	if u, ok := st.(session.UsageReporter); ok {
		return u.Usage
	}
	return func() session.Usage { return session.Usage{} }
}

// storeCommand is `parley store check|repair FILE`: check a session file
// for damage, or move a damaged one aside and write a fresh file holding
// the sessions that can still be read. The server must not be running on
// the file. It returns the exit status.
func storeCommand(args []string, stdout, stderr io.Writer) int {
	if len(args) != 2 || (args[0] != "check" && args[0] != "repair") {
		fmt.Fprintln(stderr, "usage: parley store check FILE | parley store repair FILE (the file is --data-dir/sessions.db)")
		return 2
	}
	path := args[1]
	switch args[0] {
	case "check":
		if err := session.CheckBoltFile(path); err != nil {
			fmt.Fprintln(stderr, "parley:", err)
			return 1
		}
		fmt.Fprintf(stdout, "%s: sound\n", path)
	case "repair":
		if err := session.CheckNotInUse(path); err != nil {
			fmt.Fprintln(stderr, "parley:", err)
			return 1
		}
		moved, kept, err := session.RepairBoltFile(path)
		if err != nil {
			fmt.Fprintln(stderr, "parley:", err)
			return 1
		}
		fmt.Fprintf(stdout, "%s: moved aside to %s; the new file holds the %d sessions that could be read\n", path, moved, kept)
	}
	return 0
}

// defaultThreads is half the logical CPUs (at least one): about the physical
// cores, llama.cpp's own default. ggml's threads spin while they wait for each
// other, so more threads than free cores stalls every decode step whenever
// anything else (the Go side of the server included) wants a core.
func defaultThreads() int { return max(1, runtime.NumCPU()/2) }

// gpuLayersFlag is --gpu-layers: "auto" (offload.Auto) or a count of layers.
type gpuLayersFlag int

func (g *gpuLayersFlag) String() string {
	if int(*g) == offload.Auto {
		return "auto"
	}
	return strconv.Itoa(int(*g))
}

func (g *gpuLayersFlag) Set(v string) error {
	if v == "auto" {
		*g = gpuLayersFlag(offload.Auto)
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return fmt.Errorf("want auto or a number of layers (0 = CPU only), got %q", v)
	}
	*g = gpuLayersFlag(n)
	return nil
}

// healthHost turns a listen address into one to dial: unspecified hosts
// (":8000", "0.0.0.0:8000", "[::]:8000") become loopback.
func healthHost(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// healthcheck is `parley healthcheck [URL]`, for container health checks
// (the runtime image has no curl).
func healthcheck(args []string) int {
	url := "http://127.0.0.1:8000/health"
	if len(args) > 0 {
		url = args[0]
	} else if a := os.Getenv("PARLEY_ADDR"); a != "" {
		url = "http://" + healthHost(a) + "/health"
	}
	client := &http.Client{Timeout: 3 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "unhealthy:", err)
		return 1
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintln(os.Stderr, "unhealthy:", resp.Status)
		return 1
	}
	return 0
}
