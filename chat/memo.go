package chat

import (
	"container/list"
	"strings"
	"sync"
	"unicode"

	"github.com/parley-chat/parley"
)

// ContinuationTokenizer is implemented by a Generator that can tokenize text
// which continues a prompt: no BOS, no leading space a tokenizer adds to the
// start of a text (llm.Engine does). With it, a Responder builds each turn's
// prompt from the exact tokens of the last prompt and of the tokens the model
// generated, tokenizing only the new text, so the KV cache is reused in full
// whatever the model's tokenizer would make of the reply's text. It returns
// an error when text cannot be tokenized on its own; the Responder then
// tokenizes the whole prompt.
type ContinuationTokenizer interface {
	TokenizeContinuation(text string) ([]int, error)
}

// Engine is the whole contract between a Responder and its engine: the
// Generator it needs and every optional interface it looks for on it with a
// type assertion (a Generator without one still works, only colder). A type
// that stands in for the engine, such as a wrapper that forwards to an
// engine loaded later, should implement Engine and say so at compile time
// (var _ chat.Engine = ...): a capability it failed to forward would
// otherwise be dropped silently, and with it the reuse of the KV cache.
// TestEngineListsEveryCapability keeps this list whole.
type Engine interface {
	Generator
	ContinuationTokenizer
	SavedTokenSource
	LimitTokenizer
	ImageTokenizer
	ImageSizer
}

// SavedTokenSource is implemented by a Generator that keeps conversations'
// KV state beyond their slot, across restarts (llm.Engine with its KV cache
// on). SavedTokens returns the tokens of key's saved state, with their text
// (nil when there is none). A Responder with no memo of the conversation
// (after a restart, or once it forgot it) builds the next prompt from them,
// as from a memo, so the prompt continues the saved state token for token
// and the engine evaluates only the new text.
type SavedTokenSource interface {
	SavedTokens(key string) []parley.Token
}

// savedMemo returns a memo made of key's saved KV state, or nil.
func (r *Responder) savedMemo(key string) *memo {
	src, ok := r.gen.(SavedTokenSource)
	if !ok || key == "" {
		return nil
	}
	toks := src.SavedTokens(key)
	if len(toks) < 2 {
		return nil
	}
	m := &memo{minGen: 2, gen: make([]int, len(toks)), pieces: make([]string, len(toks)), special: make([]bool, len(toks))}
	for i, t := range toks {
		m.gen[i], m.pieces[i], m.special[i] = t.ID, t.Text, t.Special
	}
	return m
}

// maxMemos bounds how many conversations a Responder remembers (a few
// kilobytes each: at most a context's worth of tokens). A conversation whose
// memo was evicted costs one full tokenization on its next turn.
const maxMemos = 1024

// memo is what a Responder remembers of a conversation's last turn (by key),
// to build the next prompt from exact tokens and to fit it without looking
// at the turns dropped already. Immutable once stored.
type memo struct {
	msgs    int      // messages in the conversation the prompt was built from
	dropped int      // turns dropped to fit it (the next turn drops at least these)
	prompt  string   // the rendered prompt
	tokens  []int    // its tokens, as evaluated
	gen     []int    // the tokens generated after it, in order
	pieces  []string // their raw text
	special []bool   // whether each is a control token (not reply text)
	// minGen is how many of gen a prompt must keep for extend to succeed:
	// 0 for a turn's memo; for one made of a saved KV state (savedMemo),
	// whose gen is the whole conversation from its BOS, enough that the
	// rest is a continuation and not the start of a text.
	minGen int
}

// extend returns the tokens of rendered, which must start with m.prompt:
// m.tokens, then the generated tokens as far as their text is what rendered
// holds after the prompt, then the rest tokenized as a continuation.
//
// The KV cache holds what the model generated, not what the template makes
// of the reply's text, so the generated tokens are kept where the two differ
// only the way templates change a reply (see matchPiece): a control token the
// reply's text left out, whitespace a template strips off the reply (a
// leading space, a trailing newline), or whitespace it adds (the plain
// transcript's "Assistant: " before a reply that began with no space). Were
// they tokenized again from the text instead, the cache would stop matching
// at the reply's first token and the next turn would evaluate the whole reply
// again.
// ok is false when rendered does not continue m.prompt or the rest cannot be
// tokenized on its own.
func (m *memo) extend(rendered string, tk ContinuationTokenizer) (tokens []int, ok bool) {
	if !strings.HasPrefix(rendered, m.prompt) {
		return nil, false
	}
	pos, n := len(m.prompt), 0
	for ; n < len(m.gen); n++ {
		adv, ok := matchPiece(rendered[pos:], m.pieces[n], m.special[n] && n+1 < len(m.gen))
		if !ok {
			break
		}
		pos += adv
	}
	if n < m.minGen {
		return nil, false
	}
	rest, err := tk.TokenizeContinuation(rendered[pos:])
	if err != nil {
		return nil, false
	}
	tokens = make([]int, 0, len(m.tokens)+n+len(rest))
	tokens = append(append(append(tokens, m.tokens...), m.gen[:n]...), rest...)
	return tokens, true
}

// matchPiece reports whether a generated token whose text is piece can stand
// for the start of text (the rendered prompt from where the tokens before it
// ended), and how many bytes of text it covers:
//   - piece is what text starts with;
//   - skippable (a control token the reply's text left out, with more of
//     the reply after it): it covers nothing;
//   - piece is only whitespace that text does not start with (a template
//     stripped it): it covers nothing;
//   - piece, its leading whitespace left out, is what text starts with after
//     its own leading whitespace (a template stripped or added whitespace
//     before it): it covers both.
//
// Whitespace is never matched against other text, so a reply's words are
// kept only where the text holds them.
func matchPiece(text, piece string, skippable bool) (int, bool) {
	switch {
	case piece != "" && strings.HasPrefix(text, piece):
		return len(piece), true
	case skippable:
		return 0, true
	}
	p := strings.TrimLeftFunc(piece, isSpace)
	if p == piece && (text == "" || !isSpace(rune(text[0]))) {
		return 0, false // no whitespace on either side: a real difference
	}
	if p == "" {
		return 0, piece != ""
	}
	t := strings.TrimLeftFunc(text, isSpace)
	if !strings.HasPrefix(t, p) {
		return 0, false
	}
	return len(text) - len(t) + len(p), true
}

// isSpace is the whitespace templates strip (see pyStrip).
func isSpace(r rune) bool { return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f) }

// memos is a bounded, least-recently-stored map of memos by key.
type memos struct {
	mu    sync.Mutex
	byKey map[string]*list.Element // of *memoEntry
	order list.List                // front: most recently stored
}

type memoEntry struct {
	key string
	m   *memo
}

func (ms *memos) get(key string) *memo {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if el, ok := ms.byKey[key]; ok {
		return el.Value.(*memoEntry).m
	}
	return nil
}

func (ms *memos) put(key string, m *memo) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.byKey == nil {
		ms.byKey = make(map[string]*list.Element)
	}
	if el, ok := ms.byKey[key]; ok {
		el.Value.(*memoEntry).m = m
		ms.order.MoveToFront(el)
		return
	}
	ms.byKey[key] = ms.order.PushFront(&memoEntry{key, m})
	for len(ms.byKey) > maxMemos {
		el := ms.order.Back()
		ms.order.Remove(el)
		delete(ms.byKey, el.Value.(*memoEntry).key)
	}
}

func (ms *memos) drop(key string) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if el, ok := ms.byKey[key]; ok {
		ms.order.Remove(el)
		delete(ms.byKey, key)
	}
}
