package llm

// KV positions of a slot's token list. Every entry of the list (a token, or one of an image's embeddings) is one
// cell of the slot's KV cache, so the list's length is what the context holds. Positions are what RoPE rotates by,
// and what llama.cpp's seq_rm drops from: a token takes one, and so does an image's embedding under most
// projectors, so that entry i sits at position i. A projector with M-RoPE positions (vision.mrope) places an image
// of n embeddings over nPos < n positions: its n cells all carry the image's first position p (with a height and
// width beside it), and the entry after the image sits at p + nPos.
//
// The list itself says which entries take a position: an image's first nPos pseudo ids (imageIDs) are in
// [-2-(positionIDs-1), -2], the ids of the others below that, down to the least int32 (the KV swap's files hold
// ids as int32). So the position of entry i is i less the entries before it that take none, whether the list is
// a slot's, a preempted sequence's or a saved state's, and a state restored from the KV swap knows its positions
// from its tokens alone. Images of projectors without M-RoPE have only ids of the first range: their lists are
// what they were before M-RoPE was placed.
//
// With M-RoPE an image's cells all carry its first position, so dropping from the position of an entry at an
// image's start or after it drops exactly that entry and what follows (imageBoundary keeps cuts out of an
// image), and llama.cpp's rule for such models (text after the KV cache's last position, embeddings from it on)
// holds for every decode the loop makes.

const (
	// positionIDs is how many pseudo ids take a position: those from -2 down.
	positionIDs = 1 << 30
	// heldIDs is the first pseudo id of an image's entries that take no position; the range goes down from it by
	// positionIDs-1, to the least int32.
	heldIDs = -2 - positionIDs
)

// takesPosition reports whether tok, an entry of a token list, advances the sequence's position.
func takesPosition(tok int) bool { return tok > heldIDs }

// posAt is the KV position of entry i of toks (i == len(toks): the position after them, where the next entry
// goes). Only a model with M-RoPE images has entries that take no position; for every other it is i.
func (e *Engine) posAt(toks []int, i int) int {
	if e.vision == nil || !e.vision.mrope {
		return i
	}
	pos := i
	for _, t := range toks[:i] {
		if !takesPosition(t) {
			pos--
		}
	}
	return pos
}

// seqRmFrom drops the entries of slot s's KV cache from entry keep of its token list on (their positions and
// what follows), as llama.cpp's seq_rm does, and reports whether it could. The caller trims s.cached.
func (e *Engine) seqRmFrom(s *slot, keep int) bool {
	return e.be.SeqRm(s.id, e.posAt(s.cached, keep), -1)
}
