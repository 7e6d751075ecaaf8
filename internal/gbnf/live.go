package gbnf

import (
	"fmt"
	"sort"
)

// This file bounds the parse stacks llama.cpp's grammar matcher keeps alive
// while it matches text, as opposed to checkPaths, which bounds the stacks
// one position fans out to.
//
// llama.cpp rewrites x{m,n} into m copies of x and a chain of n-m nested
// optional rules (x' ::= x x'' | ""), and x* into a right-recursive one.
// After each character it keeps one stack per distinct way the text so far
// can be parsed (identical stacks are merged), and every sampled token is
// matched against every live stack, character by character. When a
// repetition's item can end at several places on the same text (it matches
// strings of several lengths over characters it can also continue with,
// like [a-z]{0,1000} or [a-z]+), the repetition around it can be in any
// of its iterations: the live stacks multiply, level by level. 32 bytes of
// ([a-z ]{0,1000}){0,500} keep about 500,000 stacks alive, seconds of
// work per token.
//
// For every rule and group the bound computes, with text read from one
// starting point:
//   - live: the most stacks inside it at once;
//   - distinct: the stacks it can have at all (whatever the text): a cap on
//     live however many starting points there are;
//   - ends: the most places where it can end on one text;
//   - first, cont: the characters it can start with, and those it can go
//     on with at a place where it could also end.
//
// In a sequence, an item's starting points are the previous items' ends,
// unless its first characters are disjoint from what the items before it
// can go on with: then the next character decides, and at most one parse
// survives it. Items whose starts are unique never coexist with the items
// before them. Alternatives with disjoint first characters never coexist.
// A recursive component is computed in rounds, each using the previous
// round's shapes for its references back into itself.
// The result is an upper bound, loose where characters overlap in ways it
// does not track, exact enough for the shapes that matter.

// satCount saturates at satCap like pathCount.
func satAdd(a, b uint64) uint64 { return min(a+b, satCap) }
func satMul(a, b uint64) uint64 {
	if a != 0 && b > satCap/a {
		return satCap
	}
	return a * b
}

// charSet is a set of code points as sorted, disjoint, inclusive ranges.
// Sets with many ranges are widened to their hull: an over-approximation,
// which only makes the bound more cautious.
type charSet []rng

type rng struct{ lo, hi uint32 }

const maxSetRanges = 64

// tokenLo is where token elements (<[id]>) live in charSet: above Unicode,
// so they overlap each other but no character.
const tokenLo = 0x110000

var universe = charSet{{0, 1<<32 - 1}}

func (s charSet) union(t charSet) charSet {
	if len(t) == 0 {
		return s
	}
	if len(s) == 0 {
		return t
	}
	all := make(charSet, 0, len(s)+len(t))
	all = append(append(all, s...), t...)
	sort.Slice(all, func(i, j int) bool { return all[i].lo < all[j].lo })
	out := all[:1]
	for _, r := range all[1:] {
		last := &out[len(out)-1]
		if r.lo <= last.hi || r.lo == last.hi+1 {
			last.hi = max(last.hi, r.hi)
			continue
		}
		out = append(out, r)
	}
	if len(out) > maxSetRanges {
		return charSet{{out[0].lo, out[len(out)-1].hi}}
	}
	return append(charSet(nil), out...)
}

func (s charSet) overlaps(t charSet) bool {
	i, j := 0, 0
	for i < len(s) && j < len(t) {
		if s[i].hi < t[j].lo {
			i++
		} else if t[j].hi < s[i].lo {
			j++
		} else {
			return true
		}
	}
	return false
}

// complement of s within the code points (a negated class).
func (s charSet) complement() charSet {
	var out charSet
	next := uint32(0)
	for _, r := range s {
		if r.lo > next {
			out = append(out, rng{next, r.lo - 1})
		}
		if r.hi >= 0x10FFFF {
			return out
		}
		next = r.hi + 1
	}
	return append(out, rng{next, 0x10FFFF})
}

// pathLen is how many characters of a token the path count follows:
// llama.cpp follows every parse of a token's characters, one stack at a
// time, without merging them.
const pathLen = 12

// paths counts parse paths by the characters they consumed: in[l] end at
// a terminal inside the item, out[l] past its end.
type paths struct{ in, out [pathLen + 1]uint64 }

// shape is what the bound knows about a rule, group or terminal.
type shape struct {
	live, distinct, ends uint64
	nullable             bool
	first, cont          charSet
	p                    paths
}

// seqPaths combines the paths of x followed by y. When y's first
// character tells it from x's going on (unique), a text has one split.
func seqPaths(x, y paths, unique bool) paths {
	var r paths
	r.in = x.in
	for a := 0; a <= pathLen; a++ {
		if x.out[a] == 0 {
			continue
		}
		for b := 0; a+b <= pathLen; b++ {
			in, out := satMul(x.out[a], y.in[b]), satMul(x.out[a], y.out[b])
			if unique && b > 0 {
				r.in[a+b], r.out[a+b] = max(r.in[a+b], in), max(r.out[a+b], out)
			} else {
				r.in[a+b], r.out[a+b] = satAdd(r.in[a+b], in), satAdd(r.out[a+b], out)
			}
		}
	}
	return r
}

// work is the paths matched per stack for a token of up to pathLen characters.
func (p paths) work() uint64 {
	var w uint64
	for _, n := range p.in {
		w = satAdd(w, n)
	}
	return w
}

// liveAt is the most stacks inside x at once when it starts at n places.
func (x shape) liveAt(n uint64) uint64 { return min(satMul(n, x.live), x.distinct) }

type liveBound struct {
	p        *parser
	nullable []bool
	first    []charSet
	memo     []shape
	state    []uint8 // 0 new, 1 in progress, 2 done
	scc      []int   // strongly connected component of each rule
	cyclic   []bool  // per component: it has a cycle
	sccStack map[int]uint64
	members  map[int][]int // rules of each cyclic component
	guess    []*shape      // a recursive reference's shape from the previous round
	rounds   map[int]bool  // components being iterated
}

// liveStacks returns the bounds for the root rule: the stacks alive at once,
// and the parse paths one stack may follow through a token.
func (p *parser) liveStacks() (live, work uint64) {
	b := &liveBound{
		p:        p,
		memo:     make([]shape, len(p.rules)),
		state:    make([]uint8, len(p.rules)),
		sccStack: map[int]uint64{},
	}
	b.scc, b.cyclic = p.components()
	b.nullable = b.nullables()
	b.first = b.firsts()
	b.members, b.guess, b.rounds = map[int][]int{}, make([]*shape, len(p.rules)), map[int]bool{}
	for id, c := range b.scc {
		if b.cyclic[c] {
			b.members[c] = append(b.members[c], id)
		}
	}
	x := b.rule(p.ids["root"])
	return x.live, x.p.work()
}

// components returns the strongly connected component of each rule in the
// reference graph (Tarjan's algorithm) and, per component, whether it has
// a cycle.
func (p *parser) components() ([]int, []bool) {
	n := len(p.rules)
	index, low, comp := make([]int, n), make([]int, n), make([]int, n)
	onStack := make([]bool, n)
	for i := range index {
		index[i], comp[i] = -1, -1
	}
	var stack []int
	var cyclic []bool
	next := 0
	var visit func(v int)
	visit = func(v int) {
		index[v], low[v] = next, next
		next++
		stack = append(stack, v)
		onStack[v] = true
		self := false
		for _, e := range p.rules[v] {
			if e.t != tRef {
				continue
			}
			w := int(e.v)
			if w == v {
				self = true
			}
			if index[w] < 0 {
				visit(w)
				low[v] = min(low[v], low[w])
			} else if onStack[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] != index[v] {
			return
		}
		c := len(cyclic)
		size := 0
		for {
			w := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			onStack[w] = false
			comp[w] = c
			size++
			if w == v {
				break
			}
		}
		cyclic = append(cyclic, size > 1 || self)
	}
	for v := range n {
		if index[v] < 0 {
			visit(v)
		}
	}
	return comp, cyclic
}

// sccDistinct is the number of stacks a recursive component can have: its
// terminals and the stacks of the rules outside it that it references.
func (b *liveBound) sccDistinct(c int) uint64 {
	if d, ok := b.sccStack[c]; ok {
		return d
	}
	b.sccStack[c] = 0 // guards re-entry; external rules cannot lead back here
	var d uint64
	for _, id := range b.members[c] {
		for _, e := range b.p.rules[id] {
			switch e.t {
			case tEnd, tAlt, tRngUpper, tCharAlt:
			case tRef:
				if b.scc[e.v] != c {
					d = satAdd(d, b.rule(int(e.v)).distinct)
				}
			default:
				d = satAdd(d, 1)
			}
		}
	}
	b.sccStack[c] = d
	return d
}

// byComponent calls f on the rules of each component, components in the
// order Tarjan's algorithm completes them (every rule a component refers
// to outside itself is in an earlier one), until f reports no change
// within the component: a fixpoint per component, linear in the grammar
// whatever order its rules are written in.
func (b *liveBound) byComponent(f func(id int) bool) {
	order := make([][]int, len(b.cyclic))
	for id, c := range b.scc {
		order[c] = append(order[c], id)
	}
	for _, ids := range order {
		for changed := true; changed; {
			changed = false
			for _, id := range ids {
				if f(id) {
					changed = true
				}
			}
			if len(ids) == 1 && !b.cyclic[b.scc[ids[0]]] {
				break
			}
		}
	}
}

// nullables works out which rules can match the empty string.
func (b *liveBound) nullables() []bool {
	n := make([]bool, len(b.p.rules))
	b.byComponent(func(id int) bool {
		if n[id] {
			return false
		}
		ok := true // the current alternative is nullable so far
		for _, e := range b.p.rules[id] {
			switch e.t {
			case tEnd, tAlt:
				if ok {
					n[id] = true
					return true
				}
				ok = true
			case tRef:
				ok = ok && n[e.v]
			case tRngUpper, tCharAlt:
			default:
				ok = false
			}
		}
		return false
	})
	return n
}

// firsts works out the characters each rule can start with.
func (b *liveBound) firsts() []charSet {
	f := make([]charSet, len(b.p.rules))
	b.byComponent(func(id int) bool {
		r := b.p.rules[id]
		set := f[id]
		lead := true // at the start of an alternative, or after nullable items only
		for i := 0; i < len(r); {
			e := r[i]
			if e.t == tEnd || e.t == tAlt {
				lead = true
				i++
				continue
			}
			if !lead {
				i++
				continue
			}
			if e.t == tRef {
				set = set.union(f[e.v])
				lead = b.nullable[e.v]
				i++
				continue
			}
			var it shape
			it, i = b.item(r, i)
			set = set.union(it.first)
			lead = false
		}
		if sameSet(set, f[id]) {
			return false
		}
		f[id] = set
		return true
	})
	return f
}

func sameSet(a, b charSet) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func (b *liveBound) rule(id int) shape {
	switch b.state[id] {
	case 2:
		return b.memo[id]
	case 1:
		// A recursive reference: the previous round's shape, at first
		// an unambiguous guess (one stack, one end, one path per length).
		if g := b.guess[id]; g != nil {
			return *g
		}
		x := shape{live: 1, distinct: 1, ends: 1, nullable: b.nullable[id], first: b.first[id]}
		for l := range x.p.in {
			x.p.in[l], x.p.out[l] = 1, 1
		}
		if !x.nullable {
			x.p.out[0] = 0
		}
		return x
	}
	c := b.scc[id]
	if !b.cyclic[c] || b.rounds[c] {
		return b.compute(id)
	}
	// A recursive component is computed again with each round's shapes
	// for its references back into itself, until paths of every length
	// up to pathLen went round its cycles.
	b.rounds[c] = true
	var x shape
	for range pathLen + 2 {
		for _, m := range b.members[c] {
			b.state[m] = 0
		}
		x = b.compute(id)
		for _, m := range b.members[c] {
			if b.state[m] == 2 {
				g := b.memo[m]
				b.guess[m] = &g
			}
		}
	}
	b.rounds[c] = false
	return x
}

// compute works out rule id's shape from its alternatives.
func (b *liveBound) compute(id int) shape {
	b.state[id] = 1
	r := b.p.rules[id]
	var alts []shape
	for i := 0; i < len(r); i++ {
		j := i
		for r[j].t != tAlt && r[j].t != tEnd {
			j++
		}
		alts = append(alts, b.sequence(r[i:j]))
		i = j
	}
	x := b.alternatives(alts)
	if c := b.scc[id]; b.cyclic[c] {
		// Recursive: what it can have at all is its whole component,
		// and it may end anywhere (x* is a cycle).
		x.distinct, x.ends = b.sccDistinct(c), satCap
		x.live = min(x.live, x.distinct)
	}
	b.memo[id], b.state[id] = x, 2
	return x
}

// alternatives combines the shapes of a rule's alternatives.
func (b *liveBound) alternatives(alts []shape) shape {
	var x shape
	var seen charSet
	disjoint := true
	for _, a := range alts {
		if a.nullable || seen.overlaps(a.first) {
			disjoint = false
		}
		seen = seen.union(a.first)
		x.distinct = satAdd(x.distinct, a.distinct)
		x.live = satAdd(x.live, a.live)
		x.ends = satAdd(x.ends, a.ends)
		x.nullable = x.nullable || a.nullable
		x.first = x.first.union(a.first)
		x.cont = x.cont.union(a.cont)
		for l := range x.p.in {
			x.p.in[l], x.p.out[l] = satAdd(x.p.in[l], a.p.in[l]), satAdd(x.p.out[l], a.p.out[l])
		}
	}
	if disjoint {
		// The first character picks one alternative.
		x.live, x.ends, x.p = 0, 0, paths{}
		for _, a := range alts {
			x.live, x.ends = max(x.live, a.live), max(x.ends, a.ends)
			for l := range x.p.in {
				x.p.in[l], x.p.out[l] = max(x.p.in[l], a.p.in[l]), max(x.p.out[l], a.p.out[l])
			}
		}
	}
	if x.nullable {
		x.cont = x.cont.union(x.first)
	}
	return x
}

// sequence computes the shape of one alternative's items.
func (b *liveBound) sequence(es []elem) shape {
	x := shape{ends: 1, nullable: true}
	x.p.out[0] = 1
	window := uint64(0) // live stacks of the items that can coexist with the current one
	for i := 0; i < len(es); {
		var it shape
		it, i = b.item(es, i)
		// Two splits of one text between the items before and this one
		// need a character the items before can go on with and this one
		// can start with. Without one, the item's stacks that consumed a
		// character exclude the stacks before it: only its first stacks
		// coexist with them.
		resolved := !x.cont.overlaps(it.first)
		x.p = seqPaths(x.p, it.p, resolved)
		switch {
		case x.ends == 1:
			window = it.live
		case resolved:
			window = max(satAdd(window, min(it.p.in[0], it.distinct)), it.live)
		default:
			window = satAdd(window, it.liveAt(x.ends))
		}
		x.live = max(x.live, window)
		x.distinct = satAdd(x.distinct, it.distinct)
		if x.nullable {
			x.first = x.first.union(it.first)
		}
		if it.nullable {
			x.cont = x.cont.union(it.cont).union(it.first)
		} else {
			x.cont = it.cont
		}
		if resolved {
			if it.nullable {
				// Its empty end is the items' before.
				x.ends = satAdd(x.ends, it.ends-1)
			} else {
				x.ends = it.ends
			}
		} else {
			x.ends = satMul(x.ends, it.ends)
		}
		x.nullable = x.nullable && it.nullable
	}
	return x
}

// item reads one item of a sequence at es[i]: a reference or a terminal
// with its alternate characters. It returns its shape and the next index.
func (b *liveBound) item(es []elem, i int) (shape, int) {
	e := es[i]
	switch e.t {
	case tRef:
		return b.rule(int(e.v)), i + 1
	case tCharAny:
		return terminal(universe), i + 1
	case tToken:
		return terminal(charSet{{tokenLo, 1<<32 - 1}}), i + 1
	case tTokenNot:
		return terminal(universe), i + 1
	}
	// tChar or tCharNot, then its alternates and range ends.
	var set charSet
	j := i + 1
	lo := e.v
	hi := e.v
	for ; j < len(es) && (es[j].t == tRngUpper || es[j].t == tCharAlt); j++ {
		if es[j].t == tRngUpper {
			hi = es[j].v
			continue
		}
		set = set.union(charSet{{lo, max(lo, hi)}})
		lo, hi = es[j].v, es[j].v
	}
	set = set.union(charSet{{lo, max(lo, hi)}})
	if e.t == tCharNot {
		set = set.complement()
	}
	return terminal(set), j
}

func terminal(first charSet) shape {
	x := shape{live: 1, distinct: 1, ends: 1, first: first}
	x.p.in[0], x.p.out[1] = 1, 1
	return x
}

// checkLive refuses a grammar whose live stacks, or whose parse paths per
// token, exceed the limits. The static bound is an upper bound: a grammar
// over it is refused only when a text that keeps that many stacks alive is
// found (see witness.go), and the work is counted with the stacks found.
func (p *parser) checkLive() error {
	live, work := p.liveStacks()
	if live <= uint64(p.lim.MaxLiveStacks) && satMul(live, work) <= uint64(p.lim.MaxMatchWork) {
		return nil
	}
	f, broad := p.witnessLive(p.lim.MaxLiveStacks)
	found := uint64(f)
	const fix = "nested repetitions over characters they share multiply them: " +
		"give inner repetitions a fixed length or a delimiter the outer one does not match, or lower their bounds"
	if found > uint64(p.lim.MaxLiveStacks) {
		return &Error{Msg: fmt.Sprintf("is too costly to match: llama.cpp keeps more than %d parse stacks alive at once while matching it "+
			"(%d on a text of at most %d characters; bound %s) (%s)",
			p.lim.MaxLiveStacks, found, witnessChars, countText(live), fix)}
	}
	if w := satMul(uint64(max(broad, 1)), work); w > uint64(p.lim.MaxMatchWork) {
		return &Error{Msg: fmt.Sprintf("is too costly to match: llama.cpp may follow %s parse paths to check one token against it, over the limit of %d (%s)",
			countText(w), p.lim.MaxMatchWork, fix)}
	}
	return nil
}

func countText(n uint64) string {
	if n >= satCap {
		return "more than a trillion"
	}
	return fmt.Sprintf("%d", n)
}
