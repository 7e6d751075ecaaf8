package synth

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/ollama/ollama/fs/ggml"
)

// Script makes a synthetic model behave like a chat model with a known reply: it adds the special tokens a chat
// template needs, writes the template into tokenizer.chat_template, and sets the output weights so that greedy
// decoding of any prompt whose last token is After writes Reply and then ends.
//
// How: a model made by Write predicts σ(x) after token x (see tensors). Script extends σ with the chain
// After -> r1 -> r2 -> ... -> rn -> end, where r1..rn are vocabulary pieces that spell Reply. σ depends on the current
// token alone, so no piece may appear twice in the chain: Reply is segmented so that every piece is used at most once
// (a repeated word is spelled with other pieces, down to byte tokens; a repeated added token is spelled out in
// ordinary pieces, so the reply's text is the same though its tokens differ). A reply with more repeats than the
// vocabulary can spell is refused.
type Script struct {
	// Template is written as tokenizer.chat_template (Jinja).
	Template string `json:"template,omitempty"`
	// Control are tokens added as control tokens (llama.cpp's type 3, e.g. <|im_start|>, <|im_end|>): matched in
	// prompts, rendered as text only when special tokens are shown. <|im_end|>, <|end|>, <|return|>, <|eot_id|> and
	// the like are end-of-generation tokens by llama.cpp's own rules.
	Control []string `json:"control,omitempty"`
	// Text are tokens added as user-defined tokens (type 4, e.g. <think>, </think>, <tool_call>): matched in prompts and
	// always rendered as their text.
	Text []string `json:"text,omitempty"`
	// After is the text of the token whose successor begins the reply: the last token of the template's generation
	// prompt as llama.cpp tokenizes it (an added token, a vocabulary piece with spaces written as spaces, or one byte
	// such as "\n"). It must not appear in Reply's segmentation.
	After string `json:"after"`
	// Reply is what the model writes. Its text may contain added tokens.
	Reply string `json:"reply"`
	// End is the text of the token that follows the reply (an end-of-generation token); empty means the donor's EOS.
	// When Reply already ends with an end-of-generation token, End is never reached.
	End string `json:"end,omitempty"`
	// Then are more replies, each after a token of its own: a template that ends its generation prompt with another
	// token in another state of the conversation (say, after a tool's result) gets another reply there. A piece of
	// vocabulary is used once across every reply, as in one (σ depends on the current token alone); each ends with
	// End, which does not count as a use.
	Then []Branch `json:"then,omitempty"`
}

// Branch is one more reply of a Script: greedy decoding after the token After writes Reply.
type Branch struct {
	After string `json:"after"`
	Reply string `json:"reply"`
}

// Token types of the GGUF tokenizer (llama.cpp's llama_token_type) that Script adds.
const (
	tokenTypeControl     = 3
	tokenTypeUserDefined = 4
	tokenTypeByte        = 6
)

// hash identifies the script in the model's description, so Matches tells scripted models apart.
func (s *Script) hash() string {
	b, _ := json.Marshal(s)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// scripted is a vocabulary with a script's tokens added, and the chains its replies follow.
type scripted struct {
	voc    vocabulary
	chains [][]int // After, r1..rn, end: the reply's, then each of Then's
}

// apply adds the script's tokens to voc and returns the chain of token ids that greedy decoding follows.
func (s *Script) apply(voc vocabulary, eos int) (scripted, error) {
	out := vocabulary{tokens: append([]string(nil), voc.tokens...), types: append([]int32(nil), voc.types...)}
	index := make(map[string]int, len(out.tokens))
	for i, t := range out.tokens {
		index[t] = i
	}
	add := func(texts []string, typ int32) error {
		for _, t := range texts {
			if t == "" {
				return errors.New("script: an added token is empty")
			}
			if _, ok := index[t]; ok {
				return fmt.Errorf("script: token %q is already in the vocabulary", t)
			}
			index[t] = len(out.tokens)
			out.tokens = append(out.tokens, t)
			out.types = append(out.types, typ)
		}
		return nil
	}
	if err := add(s.Control, tokenTypeControl); err != nil {
		return scripted{}, err
	}
	if err := add(s.Text, tokenTypeUserDefined); err != nil {
		return scripted{}, err
	}
	pieces := newPieceSet(out)
	after, ok := pieces.lookup(s.After)
	if !ok {
		return scripted{}, fmt.Errorf("script: after %q is no single token of the vocabulary", s.After)
	}
	end := eos
	if s.End != "" {
		if end, ok = pieces.lookup(s.End); !ok {
			return scripted{}, fmt.Errorf("script: end %q is no single token of the vocabulary", s.End)
		}
	}
	used := map[int]bool{after: true}
	afters := []int{after}
	for i, b := range s.Then {
		a, ok := pieces.lookup(b.After)
		if !ok {
			return scripted{}, fmt.Errorf("script: then[%d].after %q is no single token of the vocabulary", i, b.After)
		}
		if used[a] {
			return scripted{}, fmt.Errorf("script: then[%d].after %q is another reply's after", i, b.After)
		}
		used[a] = true
		afters = append(afters, a)
	}
	var chains [][]int
	for i, reply := range append([]string{s.Reply}, branchReplies(s.Then)...) {
		ids, err := pieces.segment(reply, used, &out)
		if err != nil {
			return scripted{}, err
		}
		chains = append(chains, append(append([]int{afters[i]}, ids...), end))
	}
	return scripted{voc: out, chains: chains}, nil
}

func branchReplies(bs []Branch) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = b.Reply
	}
	return out
}

// pieceSet is every token with the text it stands for: added tokens as themselves, ordinary pieces with "▁" read
// as a space, byte tokens as their byte.
type pieceSet struct {
	byText map[string][]int // surface text -> token ids, added tokens first
	lens   []int            // distinct surface lengths, longest first
}

func newPieceSet(voc vocabulary) *pieceSet {
	ps := &pieceSet{byText: map[string][]int{}}
	put := ps.put
	for pass := 0; pass < 2; pass++ { // added tokens first: a script means them where it writes them
		for id, t := range voc.tokens {
			added := voc.types[id] == tokenTypeControl || voc.types[id] == tokenTypeUserDefined
			if added != (pass == 0) {
				continue
			}
			switch voc.types[id] {
			case tokenTypeControl, tokenTypeUserDefined:
				put(t, id)
			case tokenTypeByte:
				var b byte
				if _, err := fmt.Sscanf(t, "<0x%02X>", &b); err == nil {
					put(string([]byte{b}), id)
				}
			case tokenTypeNormal:
				put(strings.ReplaceAll(t, wordStart, " "), id)
			}
		}
	}
	return ps
}

// put records that token id stands for text, keeping lens sorted longest first.
func (ps *pieceSet) put(text string, id int) {
	if text == "" {
		return
	}
	ps.byText[text] = append(ps.byText[text], id)
	if !slices.Contains(ps.lens, len(text)) {
		ps.lens = append(ps.lens, len(text))
		sort.Sort(sort.Reverse(sort.IntSlice(ps.lens)))
	}
}

// lookup is the token that stands for text, preferring an added token, then an ordinary piece, then a byte.
func (ps *pieceSet) lookup(text string) (int, bool) {
	ids := ps.byText[text]
	if len(ids) == 0 {
		return 0, false
	}
	return ids[0], true
}

// segment spells text with pieces not in used, longest first, and marks the ones it takes. Where every piece that
// fits is taken, it invents one: the shortest prefix of the rest of text that is no token yet becomes a new ordinary
// token of voc (spaces written as "▁", as SentencePiece does), so any reply can be spelled, repeats included.
func (ps *pieceSet) segment(text string, used map[int]bool, voc *vocabulary) ([]int, error) {
	var out []int
	for pos := 0; pos < len(text); {
		id, n, ok := ps.unused(text[pos:], used)
		if !ok {
			if id, n, ok = ps.invent(text[pos:], voc); !ok {
				return nil, fmt.Errorf("script: the reply's tail %q cannot be spelled once more (every spelling is a token used already); end the reply with an added token", text[pos:])
			}
		}
		used[id] = true
		out = append(out, id)
		pos += n
	}
	return out, nil
}

// unused is the longest unused piece that begins rest.
func (ps *pieceSet) unused(rest string, used map[int]bool) (id, n int, ok bool) {
	for _, n := range ps.lens {
		if n > len(rest) {
			continue
		}
		for _, id := range ps.byText[rest[:n]] {
			if !used[id] {
				return id, n, true
			}
		}
	}
	return 0, 0, false
}

// invent adds the shortest prefix of rest (whole runes) that is no token's text yet as an ordinary token.
func (ps *pieceSet) invent(rest string, voc *vocabulary) (id, n int, ok bool) {
	exists := make(map[string]bool, len(voc.tokens))
	for _, t := range voc.tokens {
		exists[t] = true
	}
	for n = 1; n <= len(rest); n++ {
		if n < len(rest) && !utf8.RuneStart(rest[n]) {
			continue
		}
		text := strings.ReplaceAll(rest[:n], " ", wordStart)
		if exists[text] {
			continue
		}
		id = len(voc.tokens)
		voc.tokens = append(voc.tokens, text)
		voc.types = append(voc.types, tokenTypeNormal)
		ps.put(rest[:n], id)
		return id, n, true
	}
	return 0, 0, false
}

// scriptTokenizer writes the scripted vocabulary (added tokens score 0) and the template into the tokenizer metadata.
func scriptTokenizer(kv ggml.KV, voc vocabulary, template string) {
	scores := make([]float32, len(voc.tokens))
	copy(scores, kv.Floats("tokenizer.ggml.scores"))
	kv["tokenizer.ggml.tokens"] = voc.tokens
	kv["tokenizer.ggml.token_type"] = voc.types
	kv["tokenizer.ggml.scores"] = scores
	if template != "" {
		kv["tokenizer.chat_template"] = template
	}
}
