package main

import (
	"context"
	"errors"
	"io"
	"time"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
	"github.com/parley-chat/parley/llm"
	"github.com/parley-chat/parley/router"
	"github.com/parley-chat/parley/session"
	"github.com/parley-chat/parley/web"
)

// models is what serve wires the server over: the one --model, or the
// router of several. serve is the one path for both; they differ in what
// the server is given and in when the models load.
type models interface {
	// responder answers every request (the sessions' turns and the APIs).
	responder() parley.Responder
	// serverOptions are the server's view of the models: tokenizer, facts,
	// counters, /info, and with several the models' list.
	serverOptions() []web.Option
	// load makes the models ready to serve and returns when they are: the
	// one model loads here (its error ends the server); several load on
	// demand, and those marked load at startup in the background until ctx
	// ends.
	load(ctx context.Context) error
	// close unloads the models, bounded by ctx, after the server has
	// drained its replies.
	close(ctx context.Context)
}

// serve runs the server over m until ctx ends (a signal) or the model fails
// to load. The server listens before the models load (minutes for a
// download or a large file), so a port error surfaces at once and /health
// answers 503 "loading" meanwhile; until SetReady the chat and the APIs
// answer 503, so nothing reaches an engine before it exists.
func serve(ctx context.Context, cfg config, log *zap.Logger, store session.Store, defaults parley.Params, m models) error {
	sessions := newSessions(cfg, store, defaults, m.responder(), log)
	opts := append([]web.Option{web.WithLogger(log.Named("web")), web.WithStoreUsage(storeUsage(store)), web.WithImages(cfg.vision.media), web.WithImageStats(cfg.vision.stats)}, m.serverOptions()...)
	if cfg.tools != nil {
		opts = append(opts, web.WithTools(cfg.tools))
	}
	srv := web.New(serverConfig(cfg, defaults), sessions, opts...)
	if err := srv.Open(); err != nil {
		m.close(context.Background())
		return err
	}
	log.Info("listening", zap.String("url", srv.URL()), zap.Bool("api_key", cfg.apiKey != ""), zap.Int("users", len(cfg.users)))

	err := m.load(ctx)
	if err == nil {
		srv.SetReady(true)
		log.Info("serving", zap.String("url", srv.URL()))
		<-ctx.Done()
		log.Info("shutting down", zap.Duration("drain_timeout", cfg.drainTimeout))
	} else if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		err = nil // a signal during the download: a normal stop
	}

	// The server drains its replies before the engines they stream from
	// close; both are bounded, so a step stuck in llama.cpp cannot keep the
	// process up.
	closeCtx, cancel := context.WithTimeout(context.Background(), cfg.drainTimeout+5*time.Second)
	defer cancel()
	if cerr := srv.Close(closeCtx); cerr != nil {
		log.Warn("shutdown", zap.Error(cerr))
	}
	m.close(closeCtx)
	if err != nil {
		return err
	}
	log.Info("stopped")
	return nil
}

// oneModel is --model: a chat responder over a stand-in for the engine,
// which loads before the server is ready.
type oneModel struct {
	cfg    config
	log    *zap.Logger
	stderr io.Writer
	ref    *router.EngineRef
	resp   *chat.Responder
	eng    *llm.Engine // nil until loaded
}

func newOneModel(cfg config, log *zap.Logger, stderr io.Writer, ropts []chat.Option) *oneModel {
	ref := &router.EngineRef{}
	return &oneModel{cfg: cfg, log: log, stderr: stderr, ref: ref, resp: chat.NewResponder(ref, ropts...)}
}

func (m *oneModel) responder() parley.Responder { return m.resp }

func (m *oneModel) serverOptions() []web.Option {
	return []web.Option{
		web.WithTokenizer(m.ref),
		web.WithResponder(m.resp), web.WithModelInfo(m.ref.Info),
		web.WithEmbeddings(m.ref),
		web.WithEngineStats(m.ref.Stats),
		web.WithInfo(func() web.Info {
			t := m.resp.Template()
			return web.Info{ModelInfo: m.ref.Info(), Template: t.Name(), Thinking: chat.ThinkFormatOf(t).String(),
				Engine: router.EngineLabel(m.ref.Name())}
		}),
	}
}

func (m *oneModel) load(ctx context.Context) error {
	eng, err := loadEngine(ctx, m.cfg, m.log, m.stderr)
	if err != nil {
		return err
	}
	m.eng = eng
	// The engine may have capped --ctx at the model's training context (an
	// embedding model writes no replies: the reply cap is not its).
	if err := router.CheckMaxTokens(m.cfg.maxTokens, eng.Info().ContextLength); err != nil && eng.Info().Pooling == "" {
		return err
	}
	m.ref.Set(eng)
	m.log.Info("prompt format", zap.String("template", m.resp.Template().Name()))
	return nil
}

func (m *oneModel) close(ctx context.Context) {
	if m.eng == nil {
		return
	}
	if err := m.eng.Shutdown(ctx); err != nil {
		m.log.Warn("engine shutdown", zap.Error(err))
	}
}

// severalModels is --models and --models-file: the router, whose models
// load on demand, so the server is ready at once.
type severalModels struct {
	cfg     config
	log     *zap.Logger
	r       *router.Router
	startup chan struct{} // closed when the loads at startup have ended; nil before load
}

func newSeveralModels(cfg config, log *zap.Logger, stderr io.Writer, ropts []chat.Option) (*severalModels, error) {
	r, err := newRouter(cfg, log, stderr, ropts)
	if err != nil {
		return nil, err
	}
	return &severalModels{cfg: cfg, log: log, r: r}, nil
}

func (m *severalModels) responder() parley.Responder { return m.r }

func (m *severalModels) serverOptions() []web.Option {
	return []web.Option{
		web.WithTokenizer(m.r),
		web.WithResponder(m.r), web.WithModelInfo(m.r.Info),
		web.WithModels(m.r.View()),
		web.WithEmbeddings(m.r),
		web.WithEngineStats(m.r.Stats),
		web.WithInfo(func() web.Info {
			t := m.r.Template()
			return web.Info{ModelInfo: m.r.Info(), Template: t.Name(), Thinking: chat.ThinkFormatOf(t).String(),
				Engine: m.r.Engine()}
		}),
	}
}

func (m *severalModels) load(ctx context.Context) error {
	mf := m.cfg.models
	m.log.Info("serving several models", zap.Strings("models", m.r.Names()), zap.String("default", m.r.Default()),
		zap.Int("max_loaded_models", mf.maxLoaded), zap.Int64("max_models_memory", mf.memory.bytes()),
		zap.Stringer("client_keep_alive", &mf.clientKeepAlive), zap.Stringer("min_residency", &mf.minResidency))
	m.startup = make(chan struct{})
	go func() {
		defer close(m.startup)
		m.r.Start(ctx)
	}()
	return nil
}

func (m *severalModels) close(ctx context.Context) {
	if m.startup != nil {
		<-m.startup // ends with ctx, which has ended when serve closes
	}
	if err := m.r.Close(ctx); err != nil {
		m.log.Warn("models shutdown", zap.Error(err))
	}
}
