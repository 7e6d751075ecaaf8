package llm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/llm/kvcache"
)

// maxEventBuffer bounds each sequence's event channel. The loop never
// blocks on a consumer: a consumer that is this many events behind is
// considered stuck and its sequence is ended with an error.
const maxEventBuffer = 512

// ErrClosed is returned by Generate after Close.
var ErrClosed = errors.New("llm: engine closed")

// Stats is a snapshot of the engine's counters, for metrics.
type Stats struct {
	Slots            int   // total slots
	SlotsBusy        int   // slots running a sequence
	Queued           int   // requests waiting for a slot
	PromptEvaluated  int64 // prompt tokens decoded (cumulative)
	PromptReused     int64 // prompt tokens served from the KV cache (cumulative), copied ones included
	PromptCopied     int64 // prompt tokens copied from another slot's KV cache instead of evaluated (cumulative)
	PrefixCopies     int64 // copies of another slot's KV cache (cumulative)
	Preemptions      int64 // sequences that gave their slot to a client without one (cumulative; preempt.go)
	Decoded          int64 // tokens in decode steps: prompts, histories evaluated again, generated tokens and drafts (cumulative)
	PreemptSwapOuts  int64 // of those, the ones whose KV cache was copied out to be put back (cumulative)
	PreemptSwapIns   int64 // states put back into a slot when their sequence came back (cumulative)
	TokensGenerated  int64 // tokens sampled (cumulative)
	DraftTokens      int64 // draft tokens verified (cumulative; speculative decoding)
	DraftAccepted    int64 // draft tokens that held, each a token generated without a step of its own (cumulative)
	Steps            int64 // decode steps (cumulative)
	StepNanos        int64 // time spent in decode steps (cumulative)
	BusyRefusals     int64 // requests refused because the queue was full (cumulative)
	SlowConsumerDrop int64 // sequences ended because their consumer stopped reading (cumulative)
	GrammarDeadEnds  int64 // sequences ended because their grammar admitted no token (cumulative)
	OverBudget       int64 // sequences ended because one step took longer than the step budget (cumulative)
	// SamplersOverrunning is the number of grammar samplers whose sequence
	// ended while they were still inside llama.cpp, and that are still there.
	SamplersOverrunning int
	// DeviceMemoryUsed and DeviceMemoryTotal are the memory of the device
	// the model runs on (Info().Device), read now: used is total less free,
	// so other processes on the same GPU count too. Zero on the CPU (ggml
	// does not track host memory in use).
	DeviceMemoryUsed, DeviceMemoryTotal uint64
	// KVCache counts the swap of sessions' KV state (zero when it is off).
	KVCache KVCacheStats
	// ImagesEncoded and ImageEncodeNanos count the images the projector encoded and its time in them; ImagesReused
	// the image places of prompts found in a slot's KV cache, which are not encoded again (cumulative).
	ImagesEncoded, ImageEncodeNanos, ImagesReused int64
}

// Engine is a loaded model with its decode loop. It is safe for concurrent use.
type Engine struct {
	be    backend // the model and its context (backend.go); the loop owns the context
	dev   device  // where the offloaded layers are (the CPU when none are); its memory is read at each Stats
	info  parley.ModelInfo
	vocab vocabInfo
	// specials finds special-token text for tokenizing in chunks
	// (tokenize.go); addedSuffix is what the backend adds after a text
	// with its special tokens (EOS for some models).
	specials    *specials
	addedSuffix []int
	log         *zap.Logger
	nCtx        int // tokens per slot
	batch       int // micro-batch size
	budget      time.Duration
	queue       *fairQueue // the sequences waiting for a slot (fairqueue.go)
	closing     chan struct{}
	done        chan struct{}
	// wake is signalled (never blocking) by a grammar sampler with a
	// result, so a loop waiting only on samplers resumes.
	wake chan struct{}

	// samplers counts the grammar samplers' goroutines; overruns the
	// abandoned ones still in C.
	samplers sync.WaitGroup
	overruns overruns

	closeOnce sync.Once
	freeOnce  sync.Once
	closeMu   sync.RWMutex // held for reading while enqueueing, for writing when closing
	closed    bool

	slots []*slot // owned by the loop; Config.CacheSlots of them
	// parallel is how many slots generate at once (Config.Parallel).
	parallel int
	// minCopy is how many more shared prompt tokens another slot must hold
	// before copyPrefix copies its KV cache (copyThreshold).
	minCopy int

	// inBatch is the step's list of sequences, kept between steps (owned
	// by the loop).
	inBatch []*sequence

	// pieces is the text of every token, built once at Open: a token's text
	// is then a slice index instead of a cgo call and two allocations per
	// generated token. Immutable.
	pieces []string

	gvOnce sync.Once
	gv     *grammarVocab
	// vocabMu guards gv.shared (read while a grammar compiles, freed at
	// Shutdown); vocabFreed: it was, and is not made again.
	vocabMu    sync.RWMutex
	vocabFreed bool

	// chainOnly makes every sequence sample through the whole llama.cpp
	// sampler chain (no greedySampler or prefilterSampler, and a grammar
	// masks the whole vocabulary, token by token, before every draw): set
	// by tests, before the first Generate.
	chainOnly bool
	// noGroups makes grammar masks ask about every token, not first their
	// prefixes' groups (prefixGroups): for benchmarks and tests.
	noGroups bool
	// ownVocab makes every grammar build its own copy of the vocabulary, as
	// where the shared one cannot be made (parley_vocab_new): for tests.
	ownVocab bool
	// grammarRanked counts grammar-constrained draws decided from the
	// largest logits alone, without masking the vocabulary (grammarRank).
	grammarRanked atomic.Int64

	busy, queued                                          atomic.Int64
	promptEval, promptReused, generated, steps, stepNanos atomic.Int64
	busyRefusals, slowDrops, deadEnds, overBudget         atomic.Int64
	promptCopied, prefixCopies                            atomic.Int64
	preemptions                                           atomic.Int64 // sequences that stepped out for a client without a slot (preempt.go)
	decoded                                               atomic.Int64 // tokens in decode steps, every kind (Stats.Decoded)
	swapOuts, swapIns                                     atomic.Int64 // stepped-out sequences' KV states copied out of a slot, and back in (preempt.go)
	swapped                                               int          // stepped-out sequences holding their state now; the loop's
	imagesEvaluated                                       atomic.Int64 // images decoded into a slot's KV cache
	imagesEncoded, encodeNanos                            atomic.Int64 // images through the encoder, and its time in them
	imagesReused                                          atomic.Int64 // image places of prompts found in a slot's KV cache

	kv *kvSwap // KV swap: sessions' states saved and restored (nil: off)

	// emb is set when the model is an embedding model (embed.go): the
	// engine then runs embedLoop and serves Embed, not Generate.
	emb *embedState
	// Speculative decoding (draft.go), owned by the loop: the mode, the
	// longest draft, the step cost model by shape (draftcost.go) and the
	// buffers of a step's plan; noDraft is set when the KV cache cannot
	// drop a rejected draft (a recurrent model's memory).
	draftMode  string
	draftMax   int
	kvStreams  bool // each slot is its own KV stream (not one unified buffer)
	costs      stepCosts
	noDraft    bool
	draftBuf   []int
	draftCands []draftCand
	draftLens  []int
	draftSeqs  []*sequence
	dm         *draftModel // the draft model (Config.DraftModel); nil: drafts from the conversation
	// onDrafted, set by tests before the first Generate, is called on the
	// loop after each decode with the context of every sequence that
	// drafted in it, before the draft is verified.
	onDrafted func(context.Context)
	// drafted and draftHeld count draft tokens and those that held.
	drafted, draftHeld atomic.Int64
	vision             *vision  // the projector's context (nil: the model takes no images)
	enc                *encoder // encodes images off the loop (imageloop.go); nil without vision
}

// sequence is one request in flight.
type sequence struct {
	ctx context.Context
	req parley.GenerateRequest
	// client is the request's client (GenerateRequest.Client, or Embed's):
	// the fair queue's share and the overrun cap are per client.
	client string
	out    chan parley.Event
	// sampler samples an unconstrained sequence inline, on the loop; gs a
	// grammar-constrained one off it (exactly one is set).
	sampler tokenSampler
	gs      *grammarSampler
	// lazy, when set, is a grammar that takes over from sampler once the
	// reply's text reaches its trigger (a tool call; see lazy.go).
	lazy *lazyGrammar
	// logits is gs's copy of the last step's rows (one per token of the
	// step's input and draft, each NumVocab long), for the logprobs.
	logits []float32
	temp   float64

	slot    *slot
	pending []int // tokens to decode next: the rest of the prompt, or the last sampled token
	iBatch  int   // batch index of the logits to sample from after this step, or -1
	// draft is what the step drafted after pending's token (its rows follow
	// iBatch's); ds estimates how well this sequence's drafts hold.
	draft []int
	ds    draftState
	// plan is the longest draft this step's plan gives the sequence, or
	// -1 when the step has no plan (auto mode decides token by token).
	plan int
	// unverified: draft is in the KV cache and s.cached, not yet verified
	// (the step decoded it; its rows are not drawn yet).
	unverified bool
	// drafted and accepted count the reply's draft tokens and those that
	// held (a token emitted in a draft's place), for its final event; a
	// draft token that ends the reply does not count as held.
	drafted, accepted int

	generated int
	usage     parley.Usage
	submitted time.Time
	started   time.Time // a slot was assigned
	firstTok  time.Time

	restore *kvcache.Entry // KV swap: the key's saved state, fetched before queueing (nil: none)
	// resume, set while a preempted sequence waits for a slot again
	// (preempt.go), is its whole history: the prompt, what it generated, and
	// the sampled token not yet decoded. assign evaluates what of it the
	// slot does not hold, and the reply goes on.
	resume []int
	// swapped is a stepped-out sequence's KV cache, held while it waits
	// (swapOut; nil: its history is evaluated again). The loop's.
	swapped *swappedState

	// scope is the request's cache scope (req.Scope): it reuses,
	// copies and restores only KV caches of its own scope. req.Key is within
	// it (parley.ScopedKey).
	scope string
	// stateless: the request belongs to no stored conversation
	// (parley.GenerateRequest.Stateless); its slot's state is kept in RAM only (KV swap).
	stateless bool
	popped    bool // taken from the queue: its client's share of the slots counts it until finish

	// embed, on an embedding engine, is the Embed call this sequence
	// carries through the fair queue (embed.go); nil on a chat engine.
	embed *embedJob
	// images are the prompt's images, by the pseudo token id of each run's first position (imageIDs); finish
	// frees them.
	images map[int]*imageRun
	// unwatch stops the watch that wakes the loop when ctx ends (a sequence with images: watchImageCancel).
	unwatch func() bool
}

// Open loads the model and starts the decode loop.
func Open(cfg Config) (*Engine, error) {
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	meta, err := readMetadata(cfg.Path)
	if err != nil {
		return nil, err
	}
	if err := cfg.applyDefaults(meta, log); err != nil {
		return nil, err
	}

	start := time.Now()
	be, dp, err := openBackend(cfg, meta, log)
	if err != nil {
		return nil, err
	}
	if cfg.wrapBackend != nil {
		be = cfg.wrapBackend(be)
	}

	info := meta.info
	info.Path = cfg.Path
	info.ContextLength = cfg.ContextLength
	info.Parallel = cfg.Parallel
	info.VocabSize = be.NumVocab()
	info.LoadTime = time.Since(start)
	info.Device = dp.info

	e := &Engine{
		be:      be,
		dev:     dp.dev,
		info:    info,
		vocab:   meta.vocab,
		log:     log,
		nCtx:    cfg.ContextLength,
		batch:   cfg.BatchSize,
		budget:  cfg.StepBudget,
		queue:   newFairQueue(cfg.QueueSize+cfg.Parallel, cfg.MaxQueuedPerClient, cfg.MaxSlotsPerClient),
		closing: make(chan struct{}),
		done:    make(chan struct{}),
		wake:    make(chan struct{}, 1),
	}
	e.overruns.perClient, e.overruns.global = cfg.MaxOverrunsPerClient, cfg.MaxOverruns
	e.parallel = cfg.Parallel
	e.queue.lend = e.lendable
	e.minCopy = copyThreshold(cfg, meta, dp.info)
	e.draftMode, e.draftMax, e.kvStreams = cfg.Draft, cfg.DraftMax, !dp.info.KVUnified
	for i := range cfg.CacheSlots {
		e.slots = append(e.slots, &slot{id: i, draft: newNgramIndex(cfg.ContextLength)})
	}
	e.specials, e.addedSuffix = newSpecials(meta.vocab), addedSuffix(be)
	e.pieces = make([]string, info.VocabSize)
	for i := range e.pieces {
		e.pieces[i] = be.TokenToPiece(i)
	}
	if cfg.embedding {
		if err := e.openEmbed(meta, cfg); err != nil {
			be.Close()
			return nil, err
		}
		go e.embedLoop(newBatch(cfg.BatchSize))
		return e, nil
	}
	if cfg.Projector != "" {
		cur, ok := be.(*current)
		if !ok {
			be.Close()
			return nil, fmt.Errorf("a projector (%s) runs on the current engine only (--engine current)", cfg.Projector)
		}
		if e.vision, err = openVision(cur, cfg); err != nil {
			be.Close()
			return nil, err
		}
		e.info.Vision = true
	}
	if cfg.DraftModel != "" {
		if e.dm, err = openDraftModel(cfg, be, log); err != nil {
			e.closeVision()
			be.Close()
			return nil, err
		}
	}
	// KV swap.
	if e.kv, err = openKVSwap(cfg, e); err != nil {
		if e.dm != nil {
			e.dm.close()
		}
		e.closeVision()
		be.Close()
		return nil, err
	}
	if e.vision != nil {
		e.startEncoder()
	}
	go e.loop(newBatch(cfg.BatchSize * cfg.Parallel))
	return e, nil
}

// Info describes the loaded model.
func (e *Engine) Info() parley.ModelInfo { return e.info }

// EngineName is the llama.cpp engine that runs the model: EngineEmbedded
// or EngineCurrent (Config.Engine "auto" resolved).
func (e *Engine) EngineName() string { return e.be.Name() }

// Tokenize turns text into tokens, adding BOS when the model wants it and
// parsing special-token text (such as a chat template's role markers).
func (e *Engine) Tokenize(text string) ([]int, error) {
	toks, err := e.tokenize(context.Background(), text, true, true, 0)
	if err != nil {
		return nil, fmt.Errorf("tokenize: %w", err)
	}
	return toks, nil
}

// TokenizeContinuation turns text that continues a prompt into tokens: no
// BOS, special-token text parsed. SentencePiece tokenizers prefix the start
// of every text with a space; a continuation is not the start, so a lone
// space token that the text does not begin with is removed. When the space
// merged into the first word instead, ErrContinuation is returned and the
// caller must tokenize the whole prompt.
//
// Callers append the result to tokens they already have (a conversation's
// earlier turns, exactly as evaluated), so only new text is tokenized.
func (e *Engine) TokenizeContinuation(text string) ([]int, error) {
	if text == "" {
		return nil, nil
	}
	toks, err := e.tokenize(context.Background(), text, false, true, 0)
	if err != nil {
		return nil, fmt.Errorf("tokenize: %w", err)
	}
	if len(toks) == 0 || text[0] == ' ' {
		return toks, nil
	}
	first := e.TokenText(toks[0])
	switch {
	case first == " ":
		return toks[1:], nil
	case len(first) > 1 && first[0] == ' ' && !e.vocab.special(toks[0]):
		return nil, ErrContinuation
	}
	return toks, nil
}

// ErrContinuation is returned by TokenizeContinuation when the text cannot be
// tokenized on its own the way it would be after a prompt.
var ErrContinuation = errors.New("llm: continuation does not tokenize on its own")

// TokenText returns the text of one token (raw bytes: may be part of a UTF-8 character).
func (e *Engine) TokenText(id int) string {
	if id < 0 || id >= len(e.pieces) {
		return ""
	}
	return e.pieces[id]
}

// Stats returns a snapshot of the counters.
func (e *Engine) Stats() Stats {
	st := Stats{
		Slots:            len(e.slots),
		SlotsBusy:        int(e.busy.Load()),
		Queued:           int(e.queued.Load()),
		PromptEvaluated:  e.promptEval.Load(),
		PromptReused:     e.promptReused.Load(),
		PromptCopied:     e.promptCopied.Load(),
		PrefixCopies:     e.prefixCopies.Load(),
		Preemptions:      e.preemptions.Load(),
		PreemptSwapOuts:  e.swapOuts.Load(),
		Decoded:          e.decoded.Load(),
		PreemptSwapIns:   e.swapIns.Load(),
		TokensGenerated:  e.generated.Load(),
		DraftTokens:      e.drafted.Load(),
		DraftAccepted:    e.draftHeld.Load(),
		Steps:            e.steps.Load(),
		StepNanos:        e.stepNanos.Load(),
		BusyRefusals:     e.busyRefusals.Load(),
		SlowConsumerDrop: e.slowDrops.Load(),
		GrammarDeadEnds:  e.deadEnds.Load(),
		OverBudget:       e.overBudget.Load(),

		SamplersOverrunning: e.overruns.count(),
		KVCache:             e.kvStats(),
		ImagesEncoded:       e.imagesEncoded.Load(),
		ImageEncodeNanos:    e.encodeNanos.Load(),
		ImagesReused:        e.imagesReused.Load(),
	}
	if free, total := e.dev.memory(); e.dev.gpu && total >= free {
		st.DeviceMemoryUsed, st.DeviceMemoryTotal = total-free, total
	}
	return st
}

// Generate submits a request and returns its event stream at once. The
// channel carries token events, then exactly one event with Done set, and is
// then closed. The final event always fits in the channel's buffer, so a
// consumer that cancels ctx may stop reading. Cancelling ctx ends the
// sequence within one decode step and frees its slot.
//
// Errors (as *parley.Error): EInvalid for a bad request, ETooLarge for a
// prompt that does not fit the context, EBusy when the wait queue is full,
// EUnavailable after Close.
func (e *Engine) Generate(ctx context.Context, req parley.GenerateRequest) (<-chan parley.Event, error) {
	if e.emb != nil {
		return nil, e.errEmbeddingOnly()
	}
	if len(req.Tokens) == 0 {
		return nil, parley.FieldErrorf("prompt", "must not be empty")
	}
	if len(req.Tokens) >= e.nCtx {
		return nil, parley.PromptTooLong(len(req.Tokens), e.nCtx, "prompt is %d tokens; the context holds %d", len(req.Tokens), e.nCtx)
	}
	images := 0
	for _, t := range req.Tokens {
		// llama.cpp rejects bad ids too, but an id check here keeps hostile
		// input away from C entirely.
		if t == parley.ImageToken {
			images++
			continue
		}
		if t < 0 || t >= e.info.VocabSize {
			return nil, parley.FieldErrorf("prompt", "token id %d is outside the vocabulary", t)
		}
	}
	if images != len(req.Images) {
		return nil, parley.FieldErrorf("prompt", "holds %d image places for %d images", images, len(req.Images))
	}
	var runs map[int]*imageRun
	if images > 0 {
		var err error
		if req.Tokens, runs, err = e.expandImages(req); err != nil {
			return nil, err
		}
	}
	queuedRuns := false
	defer func() {
		if !queuedRuns {
			freeRuns(runs)
		}
	}()
	// A guard for callers that never validated (tests, scripts): for
	// parameters validated above, it rechecks the numbers and reuses the
	// grammar their Validate recorded (newSampler samples with it).
	if err := req.Params.Validate(0); err != nil {
		return nil, err
	}
	client := req.Client
	if req.Params.Grammar != "" || len(req.Params.JSONSchema) > 0 || req.Params.ToolsActive() {
		if err := e.overruns.admit(client); err != nil {
			return nil, err
		}
	}
	sampler, gs, err := e.newSampler(req.Params, client)
	if err != nil {
		return nil, err
	}
	lazy, err := e.newLazy(req.Params, client, sampler != nil)
	if err != nil {
		return nil, err
	}
	queued := false
	defer func() {
		if !queued && gs != nil {
			e.stopSampler(gs)
		}
		if !queued && lazy != nil {
			e.stopSampler(lazy.gs)
		}
	}()
	// Every key the caches keep is within the request's scope, whatever
	// the caller passed: a key of another user never reaches this one's
	// slot or saved state.
	req.Key = parley.ScopedKey(req.Scope, req.Key)
	seq := &sequence{
		ctx:       ctx,
		req:       req,
		client:    client,
		scope:     req.Scope,
		stateless: req.Stateless,
		out:       make(chan parley.Event, min(req.Params.MaxTokens, maxEventBuffer)+1),
		sampler:   sampler,
		gs:        gs,
		lazy:      lazy,
		temp:      req.Params.Temperature,
		iBatch:    -1,
		submitted: time.Now(),
		images:    runs,
	}
	seq.restore = e.kv.fetch(req.Key, req.Tokens) // KV swap: a disk read, if any, here rather than on the loop

	e.closeMu.RLock()
	defer e.closeMu.RUnlock()
	if e.closed {
		return nil, parley.Errorf(parley.EUnavailable, "the model is shutting down")
	}
	e.queued.Add(1)
	if err := e.queue.push(seq); err != nil {
		e.queued.Add(-1)
		e.busyRefusals.Add(1)
		return nil, err
	}
	queued, queuedRuns = true, true
	return seq.out, nil
}

// Close stops the loop (ending every sequence as cancelled) and frees the
// model. It waits for the loop's current step; Shutdown bounds that wait.
func (e *Engine) Close() error {
	return e.Shutdown(context.Background())
}

// ErrShutdownTimeout is returned by Shutdown when the loop, or a grammar
// sampler abandoned inside llama.cpp, did not stop before ctx ended. When
// the loop did not, the model is left allocated (the loop may still be
// inside llama.cpp): the caller is expected to exit the process.
var ErrShutdownTimeout = errors.New("llm: the decode loop did not stop in time")

// Shutdown stops the loop like Close, but waits for it (and for the grammar
// samplers' goroutines, which end when their C call returns) only until ctx
// ends, so a step stuck in llama.cpp cannot hold up the process's exit.
func (e *Engine) Shutdown(ctx context.Context) error {
	e.closeOnce.Do(func() {
		e.closeMu.Lock()
		e.closed = true
		close(e.closing)
		e.closeMu.Unlock()
	})
	select {
	case <-e.done:
	case <-ctx.Done():
		return ErrShutdownTimeout
	}
	e.kvClose() // KV swap: the states saved at shutdown reach the disk
	// Grammar samplers use neither the model nor the context.
	e.freeOnce.Do(func() {
		e.closeVision()
		if e.dm != nil {
			e.dm.close()
		}
		e.be.Close()
	})
	samplersDone := make(chan struct{})
	go func() {
		e.samplers.Wait()
		e.freeSharedVocab()
		close(samplersDone)
	}()
	select {
	case <-samplersDone:
		return nil
	case <-ctx.Done():
		// The waiter ends with the last sampler's C call.
		return ErrShutdownTimeout
	}
}
