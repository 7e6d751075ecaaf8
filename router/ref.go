package router

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
	"github.com/parley-chat/parley/llm"
	"github.com/parley-chat/parley/web"
)

// chat finds what it reuses the KV cache with (exact prompt tokens, the
// saved state's tokens after a restart) by type assertions on its
// generator: chat.Engine is every interface it asserts for, so a method
// EngineRef fails to forward is a compile error here instead of
// conversations silently cold after a restart.
var (
	_ chat.Engine = (*llm.Engine)(nil)
	_ chat.Engine = (*EngineRef)(nil)
	_ chat.Engine = (*modelRef)(nil)
)

// EngineRef stands in for an engine until it has loaded (and, with several
// models, while it is unloaded), so the chat responder, the sessions and
// the server can be built, and listening, before a load that may take
// minutes. Without an engine, Generate and Tokenize answer unavailable,
// Info and Stats are zero and there are no saved tokens. The zero value
// holds no engine.
type EngineRef struct{ p atomic.Pointer[llm.Engine] }

// Set makes e the engine (nil: none).
func (r *EngineRef) Set(e *llm.Engine) { r.p.Store(e) }

// Engine is the engine, nil when none is loaded.
func (r *EngineRef) Engine() *llm.Engine { return r.p.Load() }

// Name is the llama.cpp engine that runs the model ("" before it has loaded).
func (r *EngineRef) Name() string {
	if e := r.p.Load(); e != nil {
		return e.EngineName()
	}
	return ""
}

// EngineLabel is how /info and /v1/models name the llama.cpp engine called
// name (an Engine's EngineName): the current engine by its libraries'
// release, the embedded one by the binding module the binary was built
// with; "" for no engine (nothing loaded).
func EngineLabel(name string) string {
	switch name {
	case llm.EngineCurrent:
		return "current llama.cpp (ggml " + llm.CurrentGGMLVersion + ", @node-llama-cpp/linux-x64 libraries, loaded at run time)"
	case llm.EngineEmbedded:
		_, binding := web.BuildVersions()
		return binding
	}
	return name
}

var errLoading = parley.Errorf(parley.EUnavailable, "the model is loading; try again shortly")

func (r *EngineRef) Info() parley.ModelInfo {
	if e := r.p.Load(); e != nil {
		return e.Info()
	}
	return parley.ModelInfo{}
}

func (r *EngineRef) Tokenize(text string) ([]int, error) {
	if e := r.p.Load(); e != nil {
		return e.Tokenize(text)
	}
	return nil, errLoading
}

func (r *EngineRef) TokenizeLimit(ctx context.Context, text string, limit int) ([]int, error) {
	if e := r.p.Load(); e != nil {
		return e.TokenizeLimit(ctx, text, limit)
	}
	return nil, errLoading
}

func (r *EngineRef) TokenizeContinuation(text string) ([]int, error) {
	if e := r.p.Load(); e != nil {
		return e.TokenizeContinuation(text)
	}
	return nil, errLoading
}

func (r *EngineRef) SavedTokens(key string) []parley.Token {
	if e := r.p.Load(); e != nil {
		return e.SavedTokens(key)
	}
	return nil
}

func (r *EngineRef) Generate(ctx context.Context, req parley.GenerateRequest) (<-chan parley.Event, error) {
	if e := r.p.Load(); e != nil {
		return e.Generate(ctx, req)
	}
	return nil, errLoading
}

// TokenText is the text of one token ("" before the model has loaded): the
// server turns the legacy context array of Ollama's /api/generate back into
// text with it.
func (r *EngineRef) TokenText(id int) string {
	if e := r.p.Load(); e != nil {
		return e.TokenText(id)
	}
	return ""
}

// Stats adapts the engine's counters to what web's /metrics reads (web
// must not import llm, which is cgo).
func (r *EngineRef) Stats() web.EngineStats {
	e := r.p.Load()
	if e == nil {
		return web.EngineStats{}
	}
	st := e.Stats()
	return web.EngineStats{
		Slots:             st.Slots,
		SlotsBusy:         st.SlotsBusy,
		Queued:            st.Queued,
		PromptEvaluated:   st.PromptEvaluated,
		PromptReused:      st.PromptReused,
		PromptCopied:      st.PromptCopied,
		Preemptions:       st.Preemptions,
		PreemptSwaps:      st.PreemptSwapOuts,
		TokensGenerated:   st.TokensGenerated,
		Steps:             st.Steps,
		Decoded:           st.Decoded,
		StepTime:          time.Duration(st.StepNanos),
		SlowConsumerDrops: st.SlowConsumerDrop,
		GrammarDeadEnds:   st.GrammarDeadEnds,
		OverStepBudget:    st.OverBudget,
		DeviceMemoryUsed:  st.DeviceMemoryUsed,
		DeviceMemoryTotal: st.DeviceMemoryTotal,
		KVCache:           kvCacheStats(st.KVCache),
		Images:            web.ImageStats{Encoded: st.ImagesEncoded, EncodeTime: time.Duration(st.ImageEncodeNanos), Reused: st.ImagesReused},
	}
}

// kvCacheStats adapts the engine's KV swap counters to web's. The shared
// tier stands in for the disk: its writes, bytes, entries and refusals for
// want of room are reported as the disk's.
func kvCacheStats(s llm.KVCacheStats) web.KVCacheStats {
	if s.SharedWrites+s.SharedWriteErrors+s.SharedFull+s.SharedLoads+s.SharedReadErrors > 0 || s.SharedBytes > 0 {
		s.DiskWrites, s.DiskWriteBytes, s.DiskFull = s.SharedWrites, s.SharedWriteBytes, s.SharedFull
		s.DiskBytes, s.DiskEntries = s.SharedBytes, s.SharedEntries
	}
	return web.KVCacheStats{
		Saves: s.Saves, SavedBytes: s.SavedBytes, Restores: s.Restores, RestoredTokens: s.RestoredTokens,
		RestoreTime: time.Duration(s.RestoreNanos), SaveTime: time.Duration(s.SaveNanos),
		SharedWaits: s.Waits, SharedWaitTime: time.Duration(s.WaitNanos),
		DiskWrites: s.DiskWrites, DiskWriteBytes: s.DiskWriteBytes, Fallbacks: s.Fallbacks,
		FilesRefused: map[string]int64{"corrupt": s.Corrupt, "foreign": s.Foreign}, DiskFull: s.DiskFull, Pruned: s.Pruned,
		RAMBytes: s.RAMBytes, DiskBytes: s.DiskBytes, RAMEntries: s.RAMEntries, DiskEntries: s.DiskEntries,
		Unsaved: s.Unsaved, DiskPending: s.DiskPending,
	}
}

// modelRef is an EngineRef whose Info is the GGUF header's until the model
// loads, so its template and facts are known without loading it.
type modelRef struct {
	EngineRef
	header parley.ModelInfo
}

func (r *modelRef) Info() parley.ModelInfo {
	if e := r.p.Load(); e != nil {
		return e.Info()
	}
	return r.header
}

// TokenizeImages tokenizes a prompt that holds images (llm.Engine.TokenizeImages); chat finds it by its interface.
func (r *EngineRef) TokenizeImages(text string) ([]int, error) {
	if e := r.p.Load(); e != nil {
		return e.TokenizeImages(text)
	}
	return nil, errLoading
}

// ImagePositions is the prompt positions an image takes (llm.Engine.ImagePositions).
func (r *EngineRef) ImagePositions(img parley.Image) (int, error) {
	if e := r.p.Load(); e != nil {
		return e.ImagePositions(img)
	}
	return 0, errLoading
}
