package gbnf

import (
	"encoding/binary"
	"sort"
)

// The static bound of live.go is an upper bound, loose where the items of a
// sequence share a first character but differ later (the optional
// properties of a JSON schema object all start with a quote). Before a
// grammar is refused for its live stacks, it is run the way llama.cpp runs
// it, over a text chosen one character at a time to keep the most stacks
// alive: the stacks counted then exist, and a grammar is refused only on
// such a witness.

// witness bounds: characters of text, characters tried at each one, and
// stack expansions in all (the search gives up, admitting, past it).
const (
	witnessChars    = 320
	witnessTries    = 24
	witnessMaxSteps = 4_000_000
)

// gpos is a position in a rule: llama.cpp's stacks hold pointers to these.
type gpos struct{ rule, i int32 }

type stack []gpos

// appendKey appends the stack's identity (its positions) to b.
func (s stack) appendKey(b []byte) []byte {
	for _, p := range s {
		b = binary.LittleEndian.AppendUint32(b, uint32(p.rule))
		b = binary.LittleEndian.AppendUint32(b, uint32(p.i))
	}
	return b
}

type simulator struct {
	p     *parser
	steps int
	key   []byte // scratch for a stack's key: a lookup in seen allocates nothing
}

// firstSeen reports whether s is new to seen, and records it. Only a new
// stack's key is copied into the map.
func (m *simulator) firstSeen(s stack, seen map[string]bool) bool {
	m.key = s.appendKey(m.key[:0])
	if seen[string(m.key)] {
		return false
	}
	seen[string(m.key)] = true
	return true
}

// pop returns a copy of s without its top, with room for the two positions
// advance and accept push.
func pop(s stack) stack {
	ns := make(stack, len(s)-1, len(s)+1)
	copy(ns, s)
	return ns
}

func (m *simulator) endOfSeq(p gpos) bool {
	t := m.p.rules[p.rule][p.i].t
	return t == tEnd || t == tAlt
}

// advance is llama_grammar_advance_stack: expand references until every
// stack's top is a terminal (or the stack is empty), merging identical ones.
func (m *simulator) advance(s stack, out *[]stack, seen map[string]bool) bool {
	if m.steps++; m.steps > witnessMaxSteps {
		return false
	}
	var top gpos
	var e elem
	if len(s) > 0 {
		top = s[len(s)-1]
		e = m.p.rules[top.rule][top.i]
	}
	if len(s) == 0 || e.t != tRef {
		if m.firstSeen(s, seen) {
			*out = append(*out, s)
		}
		return true
	}
	r := m.p.rules[e.v]
	sub := int32(0)
	for {
		ns := pop(s)
		if next := (gpos{top.rule, top.i + 1}); !m.endOfSeq(next) {
			ns = append(ns, next)
		}
		if sp := (gpos{int32(e.v), sub}); !m.endOfSeq(sp) {
			ns = append(ns, sp)
		}
		if !m.advance(ns, out, seen) {
			return false
		}
		for r[sub].t != tEnd && r[sub].t != tAlt {
			sub++
		}
		if r[sub].t != tAlt {
			return true
		}
		sub++
	}
}

// matches reports whether the terminal at p matches c, and the position
// after it (past its alternate characters).
func (m *simulator) matches(p gpos, c uint32) (bool, gpos) {
	r := m.p.rules[p.rule]
	e := r[p.i]
	switch e.t {
	case tCharAny:
		return true, gpos{p.rule, p.i + 1}
	case tToken, tTokenNot:
		return false, p
	}
	in := false
	i := p.i
	for {
		lo := r[i].v
		hi := lo
		if r[i+1].t == tRngUpper {
			hi = r[i+1].v
			i++
		}
		if lo <= c && c <= hi {
			in = true
		}
		i++
		if r[i].t != tCharAlt {
			break
		}
	}
	return in == (e.t == tChar), gpos{p.rule, i}
}

// accept is llama_grammar_accept for one character.
func (m *simulator) accept(stacks []stack, c uint32) ([]stack, bool) {
	var out []stack
	seen := map[string]bool{}
	for _, s := range stacks {
		if len(s) == 0 {
			continue
		}
		ok, after := m.matches(s[len(s)-1], c)
		if !ok {
			continue
		}
		ns := pop(s)
		if !m.endOfSeq(after) {
			ns = append(ns, after)
		}
		if !m.advance(ns, &out, seen) {
			return nil, false
		}
	}
	return out, true
}

// candidates are characters worth trying next: the ends of the ranges at
// the stacks' tops, and one character outside each negated class.
func (m *simulator) candidates(stacks []stack) []uint32 {
	set := map[uint32]bool{}
	for _, s := range stacks {
		if len(s) == 0 {
			continue
		}
		top := s[len(s)-1]
		r := m.p.rules[top.rule]
		e := r[top.i]
		switch e.t {
		case tCharAny, tCharNot:
			set['a'], set[' '] = true, true
			if e.t == tCharAny {
				continue
			}
		case tToken, tTokenNot:
			continue
		}
		for i := top.i; ; {
			set[r[i].v] = true
			if r[i+1].t == tRngUpper {
				set[r[i+1].v] = true
				i++
			}
			i++
			if r[i].t != tCharAlt {
				break
			}
		}
	}
	out := make([]uint32, 0, len(set))
	for c := range set {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	if len(out) > witnessTries {
		// Spread the tries over the candidates.
		step := float64(len(out)) / witnessTries
		picked := out[:0:0]
		for k := range witnessTries {
			picked = append(picked, out[int(float64(k)*step)])
		}
		out = picked
	}
	return out
}

// narrowWeight is how many stacks whose top matches few characters (a
// literal's next character, as in the keys of a schema's optional
// properties) count as one live stack. llama.cpp rejects a candidate token
// for such a stack at its first character, so a thousand of them cost what
// a few dozen stacks over a broad class ([a-z], any character) cost, whose
// candidates each go on matching: the measured cost of 500 optional
// properties is about 1 ms a token on stories260K, of 900 broad stacks 1.7 s.
const narrowWeight = 16

// narrowChars is the most characters a stack's top may match and still be
// narrow.
const narrowChars = 4

// weight is the live stacks counted for stacks, times narrowWeight, and
// how many of them are broad.
func (m *simulator) weight(stacks []stack) (w, broad int) {
	for _, s := range stacks {
		if len(s) == 0 || m.narrow(s[len(s)-1]) {
			w++
		} else {
			w += narrowWeight
			broad++
		}
	}
	return w, broad
}

// narrow reports whether the terminal at p matches at most narrowChars characters.
func (m *simulator) narrow(p gpos) bool {
	r := m.p.rules[p.rule]
	if e := r[p.i]; e.t != tChar {
		return e.t == tToken // any character, a negated class: broad
	}
	n := uint32(0)
	for i := p.i; ; {
		lo, hi := r[i].v, r[i].v
		if r[i+1].t == tRngUpper {
			hi = r[i+1].v
			i++
		}
		if n += hi - lo + 1; n > narrowChars {
			return false
		}
		i++
		if r[i].t != tCharAlt {
			return true
		}
	}
}

// witnessLive runs the grammar over a text chosen to keep the most stacks
// alive and returns the most it saw at once (stopping once over limit),
// weighed: narrowWeight stacks with a narrow top count as one.
// broad is how many of the stacks at that point have a broad top: the work
// per token grows with those alone.
func (p *parser) witnessLive(limit int) (live, broad int) {
	n, broad := p.witnessWeight(limit * narrowWeight)
	return (n + narrowWeight - 1) / narrowWeight, broad
}

// witnessWeight is witnessLive's search, in weight units.
func (p *parser) witnessWeight(limit int) (most, mostBroad int) {
	m := &simulator{p: p}
	var stacks []stack
	seen := map[string]bool{}
	root := int32(p.ids["root"])
	r := p.rules[root]
	for i := int32(0); ; {
		s := stack{}
		if !m.endOfSeq(gpos{root, i}) {
			s = stack{{root, i}}
		}
		if !m.advance(s, &stacks, seen) {
			return m.weight(stacks)
		}
		for r[i].t != tEnd && r[i].t != tAlt {
			i++
		}
		if r[i].t != tAlt {
			break
		}
		i++
	}
	most, mostBroad = m.weight(stacks)
	for range witnessChars {
		if most > limit {
			break
		}
		var best []stack
		bestW, bestBroad := 0, 0
		for _, c := range m.candidates(stacks) {
			next, ok := m.accept(stacks, c)
			if !ok {
				return most, mostBroad
			}
			if w, b := m.weight(next); w > bestW || best == nil && len(next) > 0 {
				best, bestW, bestBroad = next, w, b
			}
		}
		if len(best) == 0 {
			break
		}
		stacks = best
		most, mostBroad = max(most, bestW), max(mostBroad, bestBroad)
	}
	return most, mostBroad
}
