package llm

/*
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
	// The vocabulary grouped by the characters its tokens begin with
	// (prefixGroups): token i is in first-character group g1[i] and
	// two-character group g2[i] (-1: in none), two-character group h is
	// within first-character group parent[h], and the grammar knows group
	// g's prefix as the pseudo-token n_vocab + g (the n1 first-character
	// groups, then the n2 others). gcur and gok are per group, lbuf a row
	// of logits with the penalties' overrides.
	int32_t n1, n2;
	int32_t *layout; // g1 (n_vocab), g2 (n_vocab), parent (n2)
	parley_token_data *gcur;
	bool *gok;
	float *lbuf;
	// own_vocab: the grammar's own (empty) vocabulary while it reads a
	// shared one (parley_vocab_new), put back before it is freed.
	void *own_vocab;
} parley_cs;

static void parley_cs_free(parley_cs *cs) {
	if (cs == NULL) return;
	if (cs->grammar && cs->own_vocab) ((void **)cs->grammar)[1] = cs->own_vocab;
	if (cs->grammar) grammar_free(cs->grammar);
	if (cs->chain) llama_sampler_free(cs->chain);
	free(cs->cur);
	free(cs->layout);
	free(cs->gcur);
	free(cs->gok);
	free(cs->lbuf);
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

// parley_pieces makes the arrays grammar_init takes: n token ids and their
// pieces (pieces[i] is at blob + offs[i], NUL-terminated). NULL when out of
// memory; *ids is to be freed with the result.
static const char **parley_pieces(char *blob, int64_t *offs, size_t n, uint32_t **ids) {
	const char **pieces = malloc(sizeof(char *) * (n > 0 ? n : 1));
	*ids = malloc(sizeof(uint32_t) * (n > 0 ? n : 1));
	if (pieces == NULL || *ids == NULL) {
		free(pieces);
		free(*ids);
		*ids = NULL;
		return NULL;
	}
	for (size_t i = 0; i < n; i++) {
		pieces[i] = blob + offs[i];
		(*ids)[i] = (uint32_t)i;
	}
	return pieces;
}

// parley_vocab_new makes a grammar whose only use is its vocabulary (the
// binding's ollama_vocab: a std::map from every token id to its text, which
// grammar_init builds for each grammar, 21 ms for Llama 3's 128,256 tokens),
// for parley_cs_new to share. The binding's llama_grammar begins with two
// pointers, vocab (NULL from grammar_init) and o_vocab: NULL unless this
// grammar is laid out so.
static struct llama_grammar *parley_vocab_new(char *blob, int64_t *offs, size_t n, uint32_t *eog, size_t n_eog) {
	static char trivial[] = "root ::= \"a\"";
	uint32_t *ids;
	const char **pieces = parley_pieces(blob, offs, n, &ids);
	if (pieces == NULL) return NULL;
	struct llama_grammar *g = grammar_init(trivial, ids, n, pieces, eog, n_eog);
	free(pieces);
	free(ids);
	if (g != NULL && !(((void **)g)[0] == NULL && ((void **)g)[1] != NULL)) {
		grammar_free(g);
		return NULL;
	}
	return g;
}

// parley_cs_new compiles grammar over the vocabulary and its groups'
// prefixes (pieces[i] is at blob + offs[i], NUL-terminated; the n1 + n2
// prefixes follow the n_vocab tokens; layout as in parley_cs), or with
// shared (parley_vocab_new, which holds them all) over that vocabulary
// instead of a copy of its own, and builds the chain the binding's
// common_sampler builds, minus its grammar and the samplers that are off
// at their defaults (DRY, top-n-sigma, XTC). ranked: the Go side applies
// the penalties (it ranks the candidates, parley_cs_draw_top), so the chain
// starts at top-k. NULL when the grammar fails.
static parley_cs *parley_cs_new(char *grammar, struct llama_grammar *shared, char *blob, int64_t *offs, int32_t n_vocab,
		int32_t n1, int32_t n2, const int32_t *layout, uint32_t *eog, size_t n_eog, parley_sparams sp, bool ranked) {
	parley_cs *cs = calloc(1, sizeof(parley_cs));
	if (cs == NULL) return NULL;
	int32_t n_groups = n1 + n2;
	size_t n_all = shared != NULL ? 0 : (size_t)n_vocab + (size_t)n_groups;
	size_t n_layout = 2 * (size_t)n_vocab + (size_t)n2;
	uint32_t *ids;
	const char **pieces = parley_pieces(blob, offs, n_all, &ids);
	cs->cur = malloc(sizeof(parley_token_data) * (size_t)n_vocab);
	cs->lbuf = malloc(sizeof(float) * (size_t)n_vocab);
	if (n_groups > 0) {
		cs->layout = malloc(sizeof(int32_t) * n_layout);
		cs->gcur = malloc(sizeof(parley_token_data) * (size_t)n_groups);
		cs->gok = malloc(sizeof(bool) * (size_t)n_groups);
	}
	if (pieces == NULL || ids == NULL || cs->cur == NULL || cs->lbuf == NULL ||
			(n_groups > 0 && (cs->layout == NULL || cs->gcur == NULL || cs->gok == NULL))) {
		free(pieces);
		free(ids);
		parley_cs_free(cs);
		return NULL;
	}
	cs->n_vocab = n_vocab;
	cs->n1 = n1;
	cs->n2 = n2;
	if (n_groups > 0) memcpy(cs->layout, layout, sizeof(int32_t) * n_layout);
	cs->grammar = grammar_init(grammar, ids, n_all, pieces, shared != NULL ? NULL : eog, shared != NULL ? 0 : n_eog);
	free(pieces);
	free(ids);
	if (cs->grammar == NULL) {
		parley_cs_free(cs);
		return NULL;
	}
	if (shared != NULL) {
		void **fields = (void **)cs->grammar;
		cs->own_vocab = fields[1];
		fields[1] = ((void **)shared)[1];
	}
	parley_chain_params cp = { true };
	cs->chain = llama_sampler_chain_init(cp);
	if (!ranked) {
		llama_sampler_chain_add(cs->chain, llama_sampler_init_penalties(sp.last_n, sp.repeat, sp.freq, sp.present));
	}
	llama_sampler_chain_add(cs->chain, llama_sampler_init_top_k(sp.top_k));
	parley_add_tail(cs->chain, sp);
	return cs;
}

// parley_cs_pick draws from a (the grammar applied) with the chain: the
// token, or -2 when the chain selected nothing allowed.
static int32_t parley_cs_pick(parley_cs *cs, parley_token_data_array *a) {
	llama_sampler_apply(cs->chain, a);
	if (a->selected < 0 || (size_t)a->selected >= a->size || a->data[a->selected].logit == -INFINITY) return -2;
	return a->data[a->selected].id;
}

// parley_cs_sample masks the candidates (the whole vocabulary) with the
// grammar and, unless probe, draws one with the chain. logits may be NULL
// (all equal: a probe). The n_ov tokens ov_ids take the logits ov_logits
// instead of theirs (a ranked sampler's penalties). With groups (n1 > 0:
// compileGrammar passes none where they do not apply), the grammar is asked
// about the groups' prefixes first (the two-character ones only
// within an allowed first character), and the tokens of a group whose
// prefix it refuses are left out (it would refuse each of them); the rest
// stay in token order, so the chain sees what it would see over the whole
// vocabulary, less refused tokens. Returns the token, -1 when the grammar
// allows none (llama.cpp's own sampler would abort), -2 when the chain
// selected nothing allowed.
static int32_t parley_cs_sample(parley_cs *cs, const float *logits, bool probe,
		const int32_t *ov_ids, const float *ov_logits, size_t n_ov) {
	const float *l = logits;
	if (logits != NULL && n_ov > 0) {
		memcpy(cs->lbuf, logits, sizeof(float) * (size_t)cs->n_vocab);
		for (size_t i = 0; i < n_ov; i++) {
			if (ov_ids[i] >= 0 && ov_ids[i] < cs->n_vocab) cs->lbuf[ov_ids[i]] = ov_logits[i];
		}
		l = cs->lbuf;
	}
	bool groups = cs->n1 > 0;
	const int32_t *g1 = NULL, *g2 = NULL, *parent = NULL;
	if (groups) {
		g1 = cs->layout;
		g2 = g1 + cs->n_vocab;
		parent = g2 + cs->n_vocab;
		for (int32_t g = 0; g < cs->n1; g++) {
			cs->gcur[g] = (parley_token_data){ cs->n_vocab + g, 0.0f, 0.0f };
		}
		parley_token_data_array ga = { cs->gcur, (size_t)cs->n1, -1, false };
		grammar_apply(cs->grammar, &ga);
		for (int32_t g = 0; g < cs->n1; g++) cs->gok[g] = cs->gcur[g].logit != -INFINITY;
		size_t m = 0;
		for (int32_t h = 0; h < cs->n2; h++) {
			cs->gok[cs->n1 + h] = false;
			if (cs->gok[parent[h]]) cs->gcur[cs->n1 + m++] = (parley_token_data){ cs->n_vocab + cs->n1 + h, 0.0f, 0.0f };
		}
		parley_token_data_array gb = { cs->gcur + cs->n1, m, -1, false };
		if (m > 0) grammar_apply(cs->grammar, &gb);
		for (size_t j = 0; j < m; j++) {
			parley_token_data d = cs->gcur[cs->n1 + j];
			cs->gok[d.id - cs->n_vocab] = d.logit != -INFINITY;
		}
	}
	size_t n = 0;
	for (int32_t i = 0; i < cs->n_vocab; i++) {
		if (groups && ((g1[i] >= 0 && !cs->gok[g1[i]]) || (g2[i] >= 0 && !cs->gok[cs->n1 + g2[i]]))) continue;
		cs->cur[n].id = i;
		cs->cur[n].logit = l ? l[i] : 0.0f;
		cs->cur[n].p = 0.0f;
		n++;
	}
	parley_token_data_array a = { cs->cur, n, -1, false };
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
	return parley_cs_pick(cs, &a);
}

// parley_cs_draw_top draws from the top of the vocabulary without masking
// all of it: data[0..n) are the largest logits after the penalties, largest
// first, and no token left out has a logit above bound. The grammar is asked
// about them in chunks that double (the first is need long) and the allowed
// ones move to the front, until need are allowed. When they are, and the
// need-th is at least bound, they are exactly the first need tokens of the
// masked, ranked vocabulary, so the chain's draw over them (greedy: the
// first) is the draw, and *decided is set. Otherwise the caller masks the
// whole vocabulary (parley_cs_sample).
static int32_t parley_cs_draw_top(parley_cs *cs, parley_token_data *data, size_t n, size_t need,
		float bound, bool greedy, bool *decided) {
	*decided = false;
	size_t ok = 0, i = 0, chunk = need > 0 ? need : 1;
	while (i < n && ok < need) {
		size_t m = chunk < n - i ? chunk : n - i;
		parley_token_data_array part = { data + i, m, -1, true };
		grammar_apply(cs->grammar, &part);
		for (size_t j = i; j < i + m; j++) {
			if (data[j].logit != -INFINITY && data[j].logit == data[j].logit) data[ok++] = data[j];
		}
		i += m;
		chunk *= 2;
	}
	if (ok < need || need == 0 || data[need - 1].logit < bound) return -1;
	*decided = true;
	if (greedy) return data[0].id;
	parley_token_data_array a = { data, need, -1, true };
	return parley_cs_pick(cs, &a);
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
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
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

	// groups: the tokens grouped by the characters they begin with, for
	// the grammar's whole-vocabulary mask (parley_cs_sample); blob and offs
	// hold the groups' prefixes after the tokens, as pseudo-tokens.
	groups prefixGroups
	layout []int32 // groups.layout(), built once

	// shared holds all of the above in llama.cpp's form, for every grammar
	// to read instead of building its own (parley_vocab_new); nil when the
	// binding's grammar is not laid out as expected, or once freed
	// (freeSharedVocab). Read under Engine.vocabMu.
	shared *C.struct_llama_grammar
}

// cVocab is gv's vocabulary (tokens, then prefixes) and end-of-generation
// tokens in C memory, freed by the returned function.
func (gv *grammarVocab) cVocab() (blob *C.char, offs *C.int64_t, eog *C.uint32_t, free func()) {
	b := C.CBytes(gv.blob)
	o := C.malloc(C.size_t(8 * len(gv.offs)))
	copy(unsafe.Slice((*int64)(o), len(gv.offs)), gv.offs)
	var m unsafe.Pointer
	if len(gv.eog) > 0 {
		m = C.malloc(C.size_t(4 * len(gv.eog)))
		copy(unsafe.Slice((*uint32)(m), len(gv.eog)), gv.eog)
	}
	return (*C.char)(b), (*C.int64_t)(o), (*C.uint32_t)(m), func() {
		C.free(b)
		C.free(o)
		C.free(m)
	}
}

// freeSharedVocab frees the shared vocabulary once no grammar reads it:
// Shutdown calls it when the samplers' goroutines have ended, and grammars
// compiled after that build their own.
func (e *Engine) freeSharedVocab() {
	e.vocabMu.Lock()
	defer e.vocabMu.Unlock()
	e.vocabFreed = true
	if e.gv != nil && e.gv.shared != nil {
		C.grammar_free(e.gv.shared)
		e.gv.shared = nil
	}
}

// minGroup is the fewest tokens a prefix must begin for a group: asking
// the grammar about it costs as much as about one of its tokens.
const minGroup = 4

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
		gv.groups = groupByPrefix(e.pieces, gv.isEOG)
		gv.layout = gv.groups.layout()
		for _, p := range gv.groups.prefixes {
			gv.offs = append(gv.offs, int64(len(gv.blob)))
			gv.blob = append(gv.blob, p...)
			gv.blob = append(gv.blob, 0)
		}
		e.vocabMu.Lock()
		defer e.vocabMu.Unlock()
		if !e.vocabFreed {
			blob, offs, eog, free := gv.cVocab()
			gv.shared = C.parley_vocab_new(blob, offs, C.size_t(len(gv.offs)), eog, C.size_t(len(gv.eog)))
			free()
			if gv.shared == nil {
				e.log.Warn("grammars build their own copy of the vocabulary: the binding's grammar is not laid out as expected")
			}
		}
		e.gv = gv
	})
	return e.gv
}

// prefixGroups groups the vocabulary by the characters its tokens begin
// with. If llama.cpp's grammar refuses a prefix (as a token of its own), it
// refuses every token that begins with it: it matches a token's characters
// one by one and refuses at the first that no rule allows. So a mask can ask
// about a group's prefix once and skip its tokens, which at a JSON reply's
// structure is most of the vocabulary. That holds in the middle of a
// character too (the last token ended inside one): a group's tokens and its
// prefix begin with a whole character, not the continuation byte the
// grammar then waits for, so it refuses them all. Two levels: a first
// character (most tokens of a BPE vocabulary begin with a space: 45% of
// Llama 3's), and the first two within it.
type prefixGroups struct {
	first, second []int32 // per token: its groups (-1: in none)
	n1, n2        int
	parent        []int32  // per two-character group: its first-character group
	prefixes      []string // the n1 first characters, then the n2 pairs
}

// groupByPrefix groups the tokens that begin with the same character, and
// with the same two, at least minGroup of them. A token is in no group when
// it ends generation, or its piece is empty, begins with a NUL byte or does
// not begin with whole, valid UTF-8 characters (whose code points llama.cpp's
// grammar decodes in its own way).
func groupByPrefix(pieces []string, isEOG []bool) prefixGroups {
	pg := prefixGroups{first: make([]int32, len(pieces)), second: make([]int32, len(pieces))}
	type prefix struct{ one, two string }
	heads := make([]prefix, len(pieces))
	count := map[string]int{}
	for i, p := range pieces {
		if isEOG[i] || p == "" || p[0] == 0 {
			continue
		}
		r, n := utf8.DecodeRuneInString(p)
		if r == utf8.RuneError && n <= 1 {
			continue
		}
		heads[i].one = p[:n]
		count[heads[i].one]++
		if r2, n2 := utf8.DecodeRuneInString(p[n:]); n2 > 0 && !(r2 == utf8.RuneError && n2 <= 1) && r2 != 0 {
			heads[i].two = p[:n+n2]
			count[heads[i].two]++
		}
	}
	ids := map[string]int32{}
	var pairs []string
	for i, h := range heads {
		pg.first[i], pg.second[i] = -1, -1
		if h.one == "" || count[h.one] < minGroup {
			continue
		}
		g, ok := ids[h.one]
		if !ok {
			g = int32(pg.n1)
			ids[h.one] = g
			pg.prefixes = append(pg.prefixes, h.one)
			pg.n1++
		}
		pg.first[i] = g
		if h.two == "" || count[h.two] < minGroup {
			continue
		}
		g2, ok := ids[h.two]
		if !ok {
			g2 = int32(len(pairs))
			ids[h.two] = g2
			pairs = append(pairs, h.two)
			pg.parent = append(pg.parent, g)
		}
		pg.second[i] = g2
	}
	pg.n2 = len(pairs)
	pg.prefixes = append(pg.prefixes, pairs...)
	return pg
}

// layout is the groups as parley_cs takes them: first, second, parent.
func (pg *prefixGroups) layout() []int32 {
	return slices.Concat(pg.first, pg.second, pg.parent)
}

// compileGrammar parses a GBNF grammar with llama.cpp's parser (inside the
// binding's try/catch) and builds the sequence's sampler chain around it.
// llama.cpp's own sampler is not used for grammars: a grammar that fails to
// parse becomes a null sampler (a crash on first use), "%llguidance"
// grammars abort the process, and it reads the logits from the context,
// which the next decode overwrites.
//
// The draws rank the candidates first where they can (a greedy request, or
// a top-k of at most maxPrefilterK): see grammarRank.
func (e *Engine) compileGrammar(grammar string, sp samplerParams) (*compiledGrammar, error) {
	if strings.HasPrefix(strings.TrimSpace(grammar), "%llguidance") {
		return nil, errors.New("llguidance grammars are not supported")
	}
	if strings.IndexByte(grammar, 0) >= 0 {
		return nil, errors.New("must not contain NUL bytes")
	}
	gv := e.grammarVocab()
	cg := C.CString(grammar)
	defer C.free(unsafe.Pointer(cg))
	e.vocabMu.RLock() // gv.shared stays until parley_cs_new has read it
	defer e.vocabMu.RUnlock()
	var blob *C.char
	var offs *C.int64_t
	var eog *C.uint32_t
	shared := gv.shared
	if e.ownVocab {
		shared = nil
	}
	if shared == nil {
		var free func()
		blob, offs, eog, free = gv.cVocab()
		defer free()
	}
	var rank *grammarRank
	switch {
	case e.chainOnly:
	case sp.Temp <= 0 && sp.TypicalP >= 1:
		// The chain takes the largest logit after the penalties: top-k,
		// top-p and min-p always keep it (plainGreedy, with penalties).
		rank = &grammarRank{ranker: newRanker(sp), need: 1, greedy: true}
	case prefilterable(sp, len(gv.isEOG)): // the vocabulary (offs holds the prefixes too)
		rank = &grammarRank{ranker: newRanker(sp), need: sp.TopK}
	}
	// Grouping by first character is exact only where the grammar matches
	// characters: a token element (<[id]>, <text>, !<...>) matches ids.
	byFirst := !e.chainOnly && !e.noGroups && gv.groups.n1 > 0 && !strings.ContainsRune(grammar, '<')
	var layout *C.int32_t
	n1, n2 := 0, 0
	if byFirst {
		// parley_cs_new copies it (cgo lets C read Go memory for the call).
		layout, n1, n2 = (*C.int32_t)(unsafe.Pointer(&gv.layout[0])), gv.groups.n1, gv.groups.n2
	}
	cs := C.parley_cs_new(cg, shared, blob, offs, C.int32_t(len(gv.isEOG)), C.int32_t(n1), C.int32_t(n2), layout,
		eog, C.size_t(len(gv.eog)), cSamplerParams(sp), C.bool(rank != nil))
	if cs == nil {
		return nil, errors.New("does not parse as GBNF with a root rule (or is left-recursive)")
	}
	return &compiledGrammar{cs: cs, rank: rank}, nil
}

// compiledGrammar is a grammar's C sampler and, when its draws rank the
// candidates first, the Go side of that.
type compiledGrammar struct {
	cs   *C.parley_cs
	rank *grammarRank
}

// grouped reports whether cg's whole-vocabulary mask skips the tokens of
// refused prefixes (prefixGroups).
func (cg *compiledGrammar) grouped() bool { return cg.cs.n1 > 0 }

// free frees the C sampler of a grammar that was never started.
func (cg *compiledGrammar) free() { C.parley_cs_free(cg.cs) }

// grammarRank is a grammar sampler's way around masking the whole
// vocabulary before each draw, which costs about 9 ms a token over a
// 49,152-token vocabulary on this machine (docs/notes/2026-11-27-grammar-draws.md): the penalties and
// a ranking of the largest logits happen here (ranker), the grammar is asked
// about those first (parley_cs_draw_top), and only when fewer than need of
// them are allowed is the whole vocabulary masked. need is the top-k (the
// chain draws from the first k allowed tokens), or 1 for a greedy request.
// The draws are the chain's (TestGrammarRankedDraws).
type grammarRank struct {
	ranker
	need   int
	greedy bool

	ovIDs    []int32   // the window's tokens and their penalized logits,
	ovLogits []float32 // for a draw that masks the whole vocabulary
}

// draw is the next token from logits (the sequence's copy), and whether it
// was decided from the ranked candidates alone.
func (g *grammarRank) draw(cs *C.parley_cs, logits []float32) (tok int, ranked bool) {
	td, bound := g.top(logits, max(g.need, maxPrefilterK))
	if len(td) > 0 {
		var decided C.bool
		t := C.parley_cs_draw_top(cs, (*C.parley_token_data)(unsafe.Pointer(&td[0])), C.size_t(len(td)),
			C.size_t(g.need), C.float(bound), C.bool(g.greedy), &decided)
		if decided {
			return int(t), true
		}
	}
	g.ovIDs, g.ovLogits = g.ovIDs[:0], g.ovLogits[:0]
	for _, id := range g.skip { // the window's tokens, as top left them
		g.ovIDs = append(g.ovIDs, id)
		g.ovLogits = append(g.ovLogits, g.win.penalize(id, logits[id]))
	}
	var ids *C.int32_t
	var ls *C.float
	if len(g.ovIDs) > 0 {
		ids, ls = (*C.int32_t)(unsafe.Pointer(&g.ovIDs[0])), (*C.float)(unsafe.Pointer(&g.ovLogits[0]))
	}
	return int(C.parley_cs_sample(cs, (*C.float)(unsafe.Pointer(&logits[0])), false, ids, ls, C.size_t(len(g.ovIDs)))), false
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

// sampleJob asks a grammarSampler for the next tokens. logits is a copy of
// the sequence's rows from its last decode (nil for the admission probe),
// rows of them one after the other, owned by the sampler until its result is
// sent: the row of the step's input, then one per token of draft. The
// sampler draws from each row in turn, the next only while the token it drew
// is the draft's (so a draft token goes no further than the first the
// grammar refuses).
type sampleJob struct {
	logits []float32
	rows   int
	draft  []int
	probe  bool
}

type sampleResult struct {
	// toks are the tokens drawn, in order; tok is the outcome of the last
	// draw: its token (the last of toks), or sampleDeadEnd /
	// sampleLostStep (then not in toks). A probe sets tok only.
	tok  int
	toks []int
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
	rows     int // the job's rows: each draw has the step budget
	client   string
}

// startSampler starts cg's goroutine (which frees its C sampler), unless the
// engine is closing: Shutdown waits for these goroutines, and none may start
// once it does.
func (e *Engine) startSampler(cg *compiledGrammar, field, client string) (*grammarSampler, error) {
	cs := cg.cs
	e.closeMu.RLock()
	defer e.closeMu.RUnlock()
	if e.closed {
		cg.free()
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
			var res sampleResult
			if job.probe || len(job.logits) == 0 {
				res.tok = int(C.parley_cs_sample(cs, nil, C.bool(job.probe), nil, nil, 0))
			}
			nv := len(isEOG)
			for i := 0; !job.probe && i < job.rows && len(job.logits) >= (i+1)*nv; i++ {
				row := job.logits[i*nv : (i+1)*nv]
				var tok int
				if cg.rank != nil {
					var ranked bool
					tok, ranked = cg.rank.draw(cs, row)
					if ranked {
						e.grammarRanked.Add(1)
					}
				} else {
					tok = int(C.parley_cs_sample(cs, (*C.float)(unsafe.Pointer(&row[0])), false, nil, nil, 0))
				}
				res.tok = tok
				if tok < 0 {
					break
				}
				eog := tok < nv && isEOG[tok]
				C.parley_cs_accept(cs, C.int32_t(tok), C.bool(eog))
				if cg.rank != nil {
					cg.rank.win.accept(int32(tok))
				}
				res.toks = append(res.toks, tok)
				if eog || i >= len(job.draft) || tok != job.draft[i] {
					break
				}
			}
			gs.res <- res
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
	gs.inFlight, gs.sentAt, gs.rows = true, time.Now(), max(1, job.rows)
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
