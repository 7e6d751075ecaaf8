package llm

import (
	"context"
	"fmt"
	"slices"
	"unicode/utf8"
)

// Tokenizing in chunks.
//
// llama.cpp finds special-token text (role markers) in a prompt by searching,
// for each special token, every piece of text left between the tokens found
// so far, and each search runs to the end of the whole text, not of its
// piece: the cost is (special tokens in the vocabulary) x (markers in the
// text) x (length of the text). A prompt of 6,000 empty messages (12,000
// markers, 216 KB) took 48 s. The engine therefore cuts a prompt into
// chunks of at most chunkSpecials markers and hands llama.cpp one chunk at a
// time: the cost is then linear in the prompt, a cancelled request stops
// between chunks, and a caller that needs only to know whether a prompt is
// over a limit stops as soon as it is.
//
// A cut is made only where llama.cpp's own result cannot change: right after
// a special token that is followed by a byte other than whitespace (so no
// whitespace is stripped around a token at the cut, and SentencePiece's
// space prefix, added after every special token, is added to the next chunk
// as it is to the whole text), where no other special token's text spans the
// cut. Each chunk but the last must end with the special token it was cut
// after; when one does not (a vocabulary whose special tokens overlap in a
// way the scan did not foresee) the whole text is tokenized in one call.

// chunkSpecials bounds the special tokens in one chunk: llama.cpp's cost per
// chunk grows with their number times the chunk's length.
const chunkSpecials = 64

// chunkBytes is the length past which a chunk is cut at the next possible
// place even with fewer special tokens (so the check between chunks comes
// often enough to stop a cancelled request early).
const chunkBytes = 32 << 10

// specials indexes the texts of the special tokens llama.cpp looks for in a
// text (control, user-defined and unknown tokens).
type specials struct {
	ids    map[string]int
	lens   []int // the distinct lengths of the texts, longest first
	first  [256]bool
	maxLen int
}

func newSpecials(v vocabInfo) *specials {
	sp := &specials{ids: make(map[string]int)}
	for i, typ := range v.types {
		if i >= len(v.tokens) || v.tokens[i] == "" {
			continue
		}
		if typ != tokenTypeControl && typ != tokenTypeUserDefined && typ != tokenTypeUnknown {
			continue
		}
		t := v.tokens[i]
		if _, ok := sp.ids[t]; ok {
			continue
		}
		sp.ids[t] = i
		sp.first[t[0]] = true
		if !slices.Contains(sp.lens, len(t)) {
			sp.lens = append(sp.lens, len(t))
		}
		sp.maxLen = max(sp.maxLen, len(t))
	}
	slices.Sort(sp.lens)
	slices.Reverse(sp.lens)
	return sp
}

// at returns the special token whose text starts text[i:], the longest
// when several do, or -1.
func (sp *specials) at(text string, i int) (id, n int) {
	if !sp.first[text[i]] {
		return -1, 0
	}
	for _, l := range sp.lens {
		if i+l > len(text) {
			continue
		}
		if id, ok := sp.ids[text[i:i+l]]; ok {
			return id, l
		}
	}
	return -1, 0
}

// spans reports whether some special token's text starts before cut and
// ends after it.
func (sp *specials) spans(text string, cut int) bool {
	for q := max(0, cut-sp.maxLen+1); q < cut; q++ {
		if !sp.first[text[q]] {
			continue
		}
		for _, l := range sp.lens {
			if q+l > cut && q+l <= len(text) {
				if _, ok := sp.ids[text[q:q+l]]; ok {
					return true
				}
			}
		}
	}
	return false
}

// chunk is a piece of a text cut for tokenizing: text[start:end], ending
// with special token last (-1 for the final chunk).
type chunk struct {
	start, end int
	last       int
}

// cuts splits text into chunks (see the comment at the top of the file).
func (sp *specials) cuts(text string) []chunk {
	var out []chunk
	start, n := 0, 0
	for i := 0; i < len(text); {
		id, l := sp.at(text, i)
		if id < 0 {
			i++
			continue
		}
		n++
		i += l
		if (n >= chunkSpecials || i-start >= chunkBytes) && i < len(text) && !isSpace(text[i]) && !sp.spans(text, i) {
			out = append(out, chunk{start: start, end: i, last: id})
			start, n = i, 0
		}
	}
	return append(out, chunk{start: start, end: len(text), last: -1})
}

func isSpace(b byte) bool {
	switch b {
	case ' ', '\t', '\n', '\r', '\v', '\f':
		return true
	}
	return false
}

// tokenize is the backend's Tokenize in chunks: it stops with ctx's error
// when ctx ends, and, when limit > 0, as soon as it has more than limit
// tokens (returning more than limit tokens, which only count: see
// TokenizeLimit, and no error).
// addSpecial adds BOS (and EOS, for models that end every text with it)
// as one call would.
func (e *Engine) tokenize(ctx context.Context, text string, addSpecial, parseSpecial bool, limit int) ([]int, error) {
	if !parseSpecial || e.specials == nil {
		return e.be.Tokenize(text, addSpecial, parseSpecial)
	}
	cs := e.specials.cuts(text)
	if len(cs) == 1 && (limit <= 0 || len(text) <= chunkBytes) {
		return e.be.Tokenize(text, addSpecial, parseSpecial)
	}
	var out []int
	for i, c := range cs {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("tokenize: %w", err)
		}
		if limit > 0 && c.end-c.start > chunkBytes {
			// A long stretch with no place to cut exactly: count it in
			// pieces first, and stop if it is surely over.
			approx, over, err := e.countPieces(ctx, text[c.start:c.end], limit-len(out))
			if err != nil {
				return nil, err
			}
			if over {
				return append(out, approx...), nil
			}
		}
		toks, err := e.be.Tokenize(text[c.start:c.end], addSpecial && i == 0, true)
		if err != nil {
			return nil, err
		}
		if i == 0 && addSpecial && len(e.addedSuffix) > 0 {
			// The suffix (EOS) goes after the last chunk, not the first.
			if len(toks) < len(e.addedSuffix) || !slices.Equal(toks[len(toks)-len(e.addedSuffix):], e.addedSuffix) {
				return e.be.Tokenize(text, addSpecial, true)
			}
			toks = toks[:len(toks)-len(e.addedSuffix)]
		}
		if c.last >= 0 && (len(toks) == 0 || toks[len(toks)-1] != c.last) {
			// llama.cpp did not end the chunk with the special token
			// it was cut after: cutting changed the result.
			return e.be.Tokenize(text, addSpecial, true)
		}
		out = append(out, toks...)
		if limit > 0 && len(out) > limit {
			return out, nil
		}
	}
	if addSpecial {
		out = append(out, e.addedSuffix...)
	}
	return out, nil
}

// pieceSlack bounds how many more tokens a text cut in two may have than
// the whole (a SentencePiece space prefix, a pair a tokenizer would have
// merged across the cut).
const pieceSlack = 2

// countPieces tokenizes text in pieces of about chunkBytes, each cut before
// whitespace where there is some, until it is sure that text has more than
// limit tokens (over; approx holds the pieces' tokens then), or has seen
// all of it (approx is then not the text's tokens: tokenize it whole).
func (e *Engine) countPieces(ctx context.Context, text string, limit int) (approx []int, over bool, err error) {
	cuts := 0
	for start := 0; start < len(text); cuts++ {
		if err := ctx.Err(); err != nil {
			return nil, false, fmt.Errorf("tokenize: %w", err)
		}
		end := pieceEnd(text, start)
		toks, err := e.be.Tokenize(text[start:end], false, true)
		if err != nil {
			return nil, false, err
		}
		approx = append(approx, toks...)
		if len(approx)-pieceSlack*cuts > limit {
			return approx, true, nil
		}
		start = end
	}
	return approx, false, nil
}

// pieceEnd is where the piece of text that starts at start ends: at most
// chunkBytes on, before the last whitespace there, else at the start of a
// UTF-8 character.
func pieceEnd(text string, start int) int {
	end := start + chunkBytes
	if end >= len(text) {
		return len(text)
	}
	for i := end; i > start+chunkBytes/2; i-- {
		if isSpace(text[i]) {
			return i
		}
	}
	for end > start+1 && !utf8.RuneStart(text[end]) {
		end--
	}
	return end
}

// TokenizeLimit is Tokenize that stops early: with ctx's error when ctx
// ends (between chunks of the text), and, when limit > 0, as soon as the
// text is known to need more than limit tokens. Then it returns more than
// limit tokens, which only count (a long stretch without special tokens is
// counted in pieces, whose tokens may differ from the whole's at the cuts),
// and no error.
func (e *Engine) TokenizeLimit(ctx context.Context, text string, limit int) ([]int, error) {
	toks, err := e.tokenize(ctx, text, true, true, limit)
	if err != nil {
		return nil, fmt.Errorf("tokenize: %w", err)
	}
	return toks, nil
}

// addedSuffix returns the tokens the backend adds after a text when asked
// to add special tokens (EOS for models that want it; usually none).
func addedSuffix(be backend) []int {
	with, err1 := be.Tokenize("a", true, false)
	without, err2 := be.Tokenize("a", false, false)
	if err1 != nil || err2 != nil {
		return nil
	}
	for i := 0; i+len(without) <= len(with); i++ {
		if slices.Equal(with[i:i+len(without)], without) {
			return slices.Clone(with[i+len(without):])
		}
	}
	return nil
}
