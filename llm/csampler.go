package llm

/*
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

// llama.h and the binding's sampling_ext.h are not included here (their
// include paths belong to the binding); these declarations match them:
// llama_token_data, llama_token_data_array and llama_sampler_chain_params
// have these layouts, llama_token is an int32_t, and grammar_* are the
// binding's extern "C" wrappers over llama.cpp's grammar (with its own copy
// of the token pieces).
struct llama_grammar;
struct llama_sampler;
typedef struct { int32_t id; float logit; float p; } parley_token_data;
typedef struct { parley_token_data *data; size_t size; int64_t selected; bool sorted; } parley_token_data_array;
typedef struct { bool no_perf; } parley_chain_params;

extern struct llama_grammar *grammar_init(char *grammar, uint32_t *tokens, size_t n_tokens, const char **pieces, uint32_t *eog_tokens, size_t n_eog_tokens);
extern void grammar_free(struct llama_grammar *g);
extern void grammar_apply(struct llama_grammar *g, parley_token_data_array *tokens);
extern void grammar_accept(struct llama_grammar *g, int32_t id);

extern struct llama_sampler *llama_sampler_chain_init(parley_chain_params params);
extern void llama_sampler_chain_add(struct llama_sampler *chain, struct llama_sampler *smpl);
extern struct llama_sampler *llama_sampler_init_penalties(int32_t last_n, float repeat, float freq, float present);
extern struct llama_sampler *llama_sampler_init_top_k(int32_t k);
extern struct llama_sampler *llama_sampler_init_typical(float p, size_t min_keep);
extern struct llama_sampler *llama_sampler_init_top_p(float p, size_t min_keep);
extern struct llama_sampler *llama_sampler_init_min_p(float p, size_t min_keep);
extern struct llama_sampler *llama_sampler_init_temp_ext(float t, float delta, float exponent);
extern struct llama_sampler *llama_sampler_init_dist(uint32_t seed);
extern void llama_sampler_apply(struct llama_sampler *smpl, parley_token_data_array *cur);
extern void llama_sampler_accept(struct llama_sampler *smpl, int32_t token);
extern void llama_sampler_free(struct llama_sampler *smpl);

typedef struct {
	int32_t top_k, last_n;
	float top_p, min_p, typical_p, temp, repeat, freq, present;
	uint32_t seed;
} parley_sparams;

// parley_cs is one grammar-constrained sequence's sampler: its grammar, the
// rest of the sampler chain, and a candidate array it owns (so sampling
// reads a copy of the logits, never the llama.cpp context).
typedef struct {
	struct llama_grammar *grammar;
	struct llama_sampler *chain;
	parley_token_data *cur;
	int32_t n_vocab;
	// greedy: the chain takes the largest allowed logit (temperature 0, no
	// penalty, typical-p off), so the largest logit, when the grammar
	// allows it, is the draw (set and read by the Go side).
	bool greedy;
} parley_cs;

static void parley_cs_free(parley_cs *cs) {
	if (cs == NULL) return;
	if (cs->grammar) grammar_free(cs->grammar);
	if (cs->chain) llama_sampler_free(cs->chain);
	free(cs->cur);
	free(cs);
}

// parley_add_tail adds the chain's links after the penalties and top-k:
// typical, top-p, min-p, temperature and the seeded draw.
static void parley_add_tail(struct llama_sampler *chain, parley_sparams sp) {
	llama_sampler_chain_add(chain, llama_sampler_init_typical(sp.typical_p, 0));
	llama_sampler_chain_add(chain, llama_sampler_init_top_p(sp.top_p, 0));
	llama_sampler_chain_add(chain, llama_sampler_init_min_p(sp.min_p, 0));
	llama_sampler_chain_add(chain, llama_sampler_init_temp_ext(sp.temp, 0.0f, 1.0f));
	llama_sampler_chain_add(chain, llama_sampler_init_dist(sp.seed));
}

// parley_cs_new compiles grammar over the vocabulary (pieces[i] is at
// blob + offs[i], NUL-terminated) and builds the chain the binding's
// common_sampler builds, minus its grammar and the samplers that are off
// at their defaults (DRY, top-n-sigma, XTC). NULL when the grammar fails.
static parley_cs *parley_cs_new(char *grammar, char *blob, int64_t *offs, int32_t n_vocab,
		uint32_t *eog, size_t n_eog, parley_sparams sp) {
	parley_cs *cs = calloc(1, sizeof(parley_cs));
	if (cs == NULL) return NULL;
	const char **pieces = malloc(sizeof(char *) * (size_t)n_vocab);
	uint32_t *ids = malloc(sizeof(uint32_t) * (size_t)n_vocab);
	cs->cur = malloc(sizeof(parley_token_data) * (size_t)n_vocab);
	if (pieces == NULL || ids == NULL || cs->cur == NULL) {
		free(pieces);
		free(ids);
		parley_cs_free(cs);
		return NULL;
	}
	for (int32_t i = 0; i < n_vocab; i++) {
		pieces[i] = blob + offs[i];
		ids[i] = (uint32_t)i;
	}
	cs->n_vocab = n_vocab;
	cs->grammar = grammar_init(grammar, ids, (size_t)n_vocab, pieces, eog, n_eog);
	free(pieces);
	free(ids);
	if (cs->grammar == NULL) {
		parley_cs_free(cs);
		return NULL;
	}
	parley_chain_params cp = { true };
	cs->chain = llama_sampler_chain_init(cp);
	llama_sampler_chain_add(cs->chain, llama_sampler_init_penalties(sp.last_n, sp.repeat, sp.freq, sp.present));
	llama_sampler_chain_add(cs->chain, llama_sampler_init_top_k(sp.top_k));
	parley_add_tail(cs->chain, sp);
	return cs;
}

// parley_cs_sample masks the candidates with the grammar and, unless
// probe, draws one with the chain. logits may be NULL (all equal: a probe).
// Returns the token, -1 when the grammar allows none (llama.cpp's own
// sampler would abort), -2 when the chain selected nothing allowed.
// With best >= 0 (cs->greedy: the largest logit, which the Go side found),
// the grammar is first asked about that one token, not the vocabulary: it is
// the draw when allowed, as masking everything first would leave it the
// largest (*shortcut then says so).
static int32_t parley_cs_sample(parley_cs *cs, const float *logits, bool probe, int32_t best, bool *shortcut) {
	*shortcut = false;
	if (best >= 0 && best < cs->n_vocab && logits != NULL && !probe) {
		parley_token_data one = { best, logits[best], 0.0f };
		parley_token_data_array a1 = { &one, 1, -1, false };
		grammar_apply(cs->grammar, &a1);
		if (a1.size == 1 && one.logit != -INFINITY && one.logit == one.logit) {
			*shortcut = true;
			return best;
		}
	}
	for (int32_t i = 0; i < cs->n_vocab; i++) {
		cs->cur[i].id = i;
		cs->cur[i].logit = logits ? logits[i] : 0.0f;
		cs->cur[i].p = 0.0f;
	}
	parley_token_data_array a = { cs->cur, (size_t)cs->n_vocab, -1, false };
	grammar_apply(cs->grammar, &a);
	bool any = false;
	for (size_t i = 0; i < a.size; i++) {
		if (a.data[i].logit != -INFINITY) {
			any = true;
			break;
		}
	}
	if (!any) return -1;
	if (probe) return 0;
	llama_sampler_apply(cs->chain, &a);
	if (a.selected < 0 || (size_t)a.selected >= a.size || a.data[a.selected].logit == -INFINITY) return -2;
	return a.data[a.selected].id;
}

// parley_cs_accept advances the grammar (not over an end-of-generation
// token, which ends the sequence) and the chain's history.
static void parley_cs_accept(parley_cs *cs, int32_t tok, bool eog) {
	if (!eog) grammar_accept(cs->grammar, tok);
	llama_sampler_accept(cs->chain, tok);
}

// parley_tail_new builds a chain of the tail alone, for a sampler that
// applies the penalties and top-k itself (prefilter.go).
static struct llama_sampler *parley_tail_new(parley_sparams sp) {
	parley_chain_params cp = { true };
	struct llama_sampler *chain = llama_sampler_chain_init(cp);
	parley_add_tail(chain, sp);
	return chain;
}

// parley_tail_draw applies the tail to data[0..n), the top-k candidates
// sorted as top-k leaves them (largest first), and returns the chosen
// token, or -1 when it chose none.
static int32_t parley_tail_draw(struct llama_sampler *chain, parley_token_data *data, size_t n) {
	parley_token_data_array a = { data, n, -1, true };
	llama_sampler_apply(chain, &a);
	if (a.selected < 0 || (size_t)a.selected >= a.size) return -1;
	return a.data[a.selected].id;
}
*/
import "C"

import (
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/parley-chat/parley"
)

// grammarVocab is the vocabulary as llama.cpp's grammar needs it, built once:
// every token's text in one NUL-separated blob (copied to C per grammar,
// which keeps its own copy), and which tokens end generation.
type grammarVocab struct {
	blob  []byte
	offs  []int64
	eog   []uint32
	isEOG []bool
}

func (e *Engine) grammarVocab() *grammarVocab {
	e.gvOnce.Do(func() {
		n := e.info.VocabSize
		// The token texts are the table Open built.
		gv := &grammarVocab{offs: make([]int64, n), isEOG: make([]bool, n)}
		for i, p := range e.pieces {
			gv.offs[i] = int64(len(gv.blob))
			gv.blob = append(gv.blob, p...)
			gv.blob = append(gv.blob, 0)
			if e.be.TokenIsEog(i) {
				gv.eog = append(gv.eog, uint32(i))
				gv.isEOG[i] = true
			}
		}
		e.gv = gv
	})
	return e.gv
}

// compileGrammar parses a GBNF grammar with llama.cpp's parser (inside the
// binding's try/catch) and builds the sequence's sampler chain around it.
// llama.cpp's own sampler is not used for grammars: a grammar that fails to
// parse becomes a null sampler (a crash on first use), "%llguidance"
// grammars abort the process, and it reads the logits from the context,
// which the next decode overwrites.
func (e *Engine) compileGrammar(grammar string, sp samplerParams) (*C.parley_cs, error) {
	if strings.HasPrefix(strings.TrimSpace(grammar), "%llguidance") {
		return nil, errors.New("llguidance grammars are not supported")
	}
	if strings.IndexByte(grammar, 0) >= 0 {
		return nil, errors.New("must not contain NUL bytes")
	}
	gv := e.grammarVocab()
	cg := C.CString(grammar)
	defer C.free(unsafe.Pointer(cg))
	blob := C.CBytes(gv.blob)
	defer C.free(blob)
	offs := C.malloc(C.size_t(8 * len(gv.offs)))
	defer C.free(offs)
	copy(unsafe.Slice((*int64)(offs), len(gv.offs)), gv.offs)
	var eog *C.uint32_t
	if len(gv.eog) > 0 {
		m := C.malloc(C.size_t(4 * len(gv.eog)))
		defer C.free(m)
		copy(unsafe.Slice((*uint32)(m), len(gv.eog)), gv.eog)
		eog = (*C.uint32_t)(m)
	}
	cs := C.parley_cs_new(cg, (*C.char)(blob), (*C.int64_t)(offs), C.int32_t(len(gv.offs)), eog, C.size_t(len(gv.eog)), cSamplerParams(sp))
	if cs == nil {
		return nil, errors.New("does not parse as GBNF with a root rule (or is left-recursive)")
	}
	cs.greedy = C.bool(!e.chainOnly && plainGreedy(sp))
	return cs, nil
}

// cSamplerParams is sp for the C side's chains.
func cSamplerParams(sp samplerParams) C.parley_sparams {
	return C.parley_sparams{
		top_k:     C.int32_t(sp.TopK),
		last_n:    C.int32_t(sp.RepeatLastN),
		top_p:     C.float(sp.TopP),
		min_p:     C.float(sp.MinP),
		typical_p: C.float(sp.TypicalP),
		temp:      C.float(sp.Temp),
		repeat:    C.float(sp.PenaltyRepeat),
		freq:      C.float(sp.PenaltyFreq),
		present:   C.float(sp.PenaltyPre),
		seed:      C.uint32_t(sp.Seed),
	}
}

// Results of one off-loop sample.
const (
	sampleDeadEnd  = -1 // the grammar allows no token
	sampleLostStep = -2 // the chain picked nothing the grammar allows
)

// sampleJob asks a grammarSampler for the next token. logits is a copy of
// the sequence's row from its last decode (nil for the admission probe),
// owned by the sampler until its result is sent.
type sampleJob struct {
	logits []float32
	probe  bool
}

type sampleResult struct {
	tok int // a token id, or sampleDeadEnd / sampleLostStep
}

// grammarSampler samples one grammar-constrained sequence on its own
// goroutine, so that matching the grammar (which can cost seconds a token
// inside llama.cpp and cannot be interrupted) never holds the decode loop.
// The goroutine owns the C sampler and frees it when it stops: when the
// loop (or Generate) closes jobs and any C call in progress has returned.
// A sequence that ends while its sample is still in C is abandoned: it
// counts against the overrun caps (see overruns) until C returns.
type grammarSampler struct {
	jobs chan sampleJob    // cap 1; closed by the sequence's owner when it ends
	res  chan sampleResult // cap 1; at most one job is in flight
	// field is what the client sent ("grammar" or "json_schema"), for errors.
	field string

	abandoned atomic.Bool

	// Owned by whoever owns the sequence (Generate, then the loop).
	inFlight bool
	sentAt   time.Time
	client   string
}

// startSampler starts cs's goroutine (which frees cs), unless the engine
// is closing: Shutdown waits for these goroutines, and none may start once
// it does.
func (e *Engine) startSampler(cs *C.parley_cs, field, client string) (*grammarSampler, error) {
	e.closeMu.RLock()
	defer e.closeMu.RUnlock()
	if e.closed {
		C.parley_cs_free(cs)
		return nil, parley.Errorf(parley.EUnavailable, "the model is shutting down")
	}
	gs := &grammarSampler{
		jobs:   make(chan sampleJob, 1),
		res:    make(chan sampleResult, 1),
		field:  field,
		client: client,
	}
	isEOG := e.grammarVocab().isEOG
	e.samplers.Add(1)
	go func() {
		defer e.samplers.Done()
		defer func() {
			C.parley_cs_free(cs)
			if gs.abandoned.Load() {
				e.overruns.release(gs.client)
			}
		}()
		for job := range gs.jobs {
			var lp *C.float
			if len(job.logits) > 0 {
				lp = (*C.float)(unsafe.Pointer(&job.logits[0]))
			}
			best := -1
			if bool(cs.greedy) && !job.probe && len(job.logits) > 0 {
				best = argmax(job.logits)
			}
			var shortcut C.bool
			tok := int(C.parley_cs_sample(cs, lp, C.bool(job.probe), C.int32_t(best), &shortcut))
			if shortcut {
				e.grammarShortcuts.Add(1)
			}
			if tok >= 0 && !job.probe {
				C.parley_cs_accept(cs, C.int32_t(tok), C.bool(tok < len(isEOG) && isEOG[tok]))
			}
			gs.res <- sampleResult{tok: tok}
			select {
			case e.wake <- struct{}{}:
			default:
			}
		}
	}()
	return gs, nil
}

// send hands the sampler its next job and starts its clock.
func (gs *grammarSampler) send(job sampleJob) {
	gs.inFlight, gs.sentAt = true, time.Now()
	gs.jobs <- job
}

// stop ends the sampler's goroutine once C returns. A job still in flight
// is abandoned and counted against the caps until then.
func (e *Engine) stopSampler(gs *grammarSampler) {
	if gs.inFlight {
		e.overruns.hold(gs.client)
		gs.abandoned.Store(true)
	}
	close(gs.jobs)
}

// overruns counts abandoned samplers still inside llama.cpp, per client and
// in all: each holds a CPU thread until its C call returns, so new
// grammar-constrained requests are refused while a cap is reached.
type overruns struct {
	perClient, global int // caps

	mu    sync.Mutex
	total int
	by    map[string]int
}

func (o *overruns) hold(client string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.total++
	if o.by == nil {
		o.by = map[string]int{}
	}
	o.by[client]++
}

func (o *overruns) release(client string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.total--
	if o.by[client]--; o.by[client] <= 0 {
		delete(o.by, client)
	}
}

func (o *overruns) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.total
}

// admit returns an error when client may not start another
// grammar-constrained request now.
func (o *overruns) admit(client string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if n := o.by[client]; n >= o.perClient {
		return parley.Errorf(parley.ERateLimited,
			"grammar-constrained requests from this client are refused for now: %d of its earlier grammars are still being matched past the step budget; simplify the grammar or try again later", n)
	}
	if o.total >= o.global {
		return parley.Errorf(parley.EBusy,
			"grammar-constrained requests are refused for now: %d grammars are still being matched past the step budget; try again later", o.total)
	}
	return nil
}

// grammarError is the error a sequence ends with for its grammar: the
// client's request, not the server, is at fault.
func grammarError(field, format string, args ...any) *parley.Error {
	if field == "" {
		field = "grammar"
	}
	return parley.FieldErrorf(field, format, args...)
}

// tailChain is llama.cpp's sampler chain after the penalties and top-k (the
// binding's llama.cpp, which both engines link for grammars too), freed
// with its last reference.
type tailChain struct{ c *C.struct_llama_sampler }

func newTailChain(p samplerParams) *tailChain {
	t := &tailChain{c: C.parley_tail_new(cSamplerParams(p))}
	runtime.SetFinalizer(t, func(t *tailChain) { C.llama_sampler_free(t.c) })
	return t
}

// draw applies the chain to cands (the top-k, largest first; rewritten in
// place) and returns the chosen token, -1 for none.
func (t *tailChain) draw(cands []tokenData) int {
	if len(cands) == 0 {
		return -1
	}
	tok := C.parley_tail_draw(t.c, (*C.parley_token_data)(unsafe.Pointer(&cands[0])), C.size_t(len(cands)))
	runtime.KeepAlive(t)
	return int(tok)
}
