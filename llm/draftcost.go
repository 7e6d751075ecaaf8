package llm

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// Auto mode's cost model: what a decode step costs, by its shape, and the
// plan of a step's drafts that it gives.
//
// A step's time depends on its tokens and on how llama.cpp evaluates them.
// With one KV buffer for every slot, or one sequence in the step, the step
// is one pass over the weights (an even step). With a KV stream per slot
// llama.cpp splits a step into micro-batches that take as many tokens from
// each sequence, so a step whose sequences bring different numbers of
// tokens (a draft beside other sequences' single tokens, a prompt chunk
// beside replies) takes a pass for each layer of that difference (a split
// step). What the further passes cost depends on the model and the device:
// on stories260K at 8 streams a draft's pass doubles a step that the
// weights' reading bounds, and drafts that hold a quarter of the time do
// not pay for it; on a 135M model at one thread the tokens' arithmetic
// bounds a step, a pass of 64 tokens costs less per token than one of 8,
// and drafts that hold double the replies' rate. So no fixed rule
// fits both: the loop keeps a cost model of each shape, fitted to the
// steps of that shape it timed, and a step whose drafts would split it
// drafts when the split step's expected tokens per second beat the even
// step's. While that says no, a step drafts now and then anyway (a probe,
// at growing intervals) so that the split steps' cost is measured and
// followed.

// stepShape is how llama.cpp evaluates a step (above).
type stepShape int

const (
	shapeEven  stepShape = iota // one pass over the weights
	shapeSplit                  // a KV stream per slot and sequences with different token counts: a pass for each
	numShapes
)

// Probes of split steps while the plan declines them: the first at once
// while no split step was timed, else after draftProbeFirst declined
// plans, then at doubling intervals up to draftProbeMax, back to the first
// once a plan wins. A probe costs about one step's time (a model whose
// split steps lose: one step in 256 once settled); the cap bounds how long
// a split cost measured in a moment of load keeps drafts off.
const (
	draftProbeFirst = 16
	draftProbeMax   = 256
	// draftProbeChance is the least chance of holding of a probe's tokens.
	draftProbeChance = 0.5
)

// stepCosts is the engine's step cost model by shape and the state of its
// probes. Owned by the loop.
type stepCosts struct {
	by         [numShapes]draftCost
	declined   int // plans declined since the last probe or win
	probeEvery int // declined plans before the next probe (0: draftProbeFirst)
	probes     int // probes made
	toks       []draftTok
}

// draftCand is a generating sequence's offer to a step's plan: the chance
// that a draft token holds given that the ones before it did, and the most
// draft tokens it has.
type draftCand struct {
	p   float64
	max int
}

// draftTok is one candidate draft token: its chance of holding (the
// candidate's chance to the power of its place) and its candidate.
type draftTok struct {
	v float64
	i int
}

// observe adds a step of n tokens and shape s that took d.
func (c *stepCosts) observe(s stepShape, n int, d time.Duration) { c.by[s].observe(n, d) }

// fit returns the fixed and per-token cost, in seconds, of a step of shape
// s, and false while no step says anything about it. Split steps that were
// never timed are taken to cost an even step and a second pass, the even
// step's fixed cost again.
func (c *stepCosts) fit(s stepShape) (fixed, perToken float64, ok bool) {
	if m := &c.by[s]; m.w > 0 {
		return m.fixed, m.perToken, true
	}
	e := &c.by[shapeEven]
	if s != shapeSplit || e.w == 0 {
		return 0, 0, false
	}
	return 2 * e.fixed, e.perToken, true
}

// plan decides the drafts of a step of n tokens (the drafts aside), g of
// them generating sequences' inputs, when drafts make the step split: lens
// (as long as cands) gets each candidate's draft length, together at most
// budget tokens. base is the step's shape without drafts; extra is what
// each draft token costs besides its place in the step (a draft model's
// decode of it). It reports whether any draft goes in.
//
// Draft tokens go in by their chance of holding, likeliest first (a
// candidate's tokens in order, since each is at most as likely as the one
// before it), while each raises the expected tokens per second of the
// split step: (y + v) / (t + perToken) > y / t. An even base step then
// takes the plan only if its rate beats the step's without drafts, g over
// the even step's time; otherwise the plan is declined, but for a probe.
func (c *stepCosts) plan(cands []draftCand, lens []int, base stepShape, g, n, budget int, extra time.Duration) bool {
	clear(lens)
	fixed, per, ok := c.fit(shapeSplit)
	if !ok || g <= 0 {
		return false
	}
	c.toks = c.toks[:0]
	for i, d := range cands {
		v := 1.0
		for range d.max {
			v *= d.p
			c.toks = append(c.toks, draftTok{v, i})
		}
	}
	// Stable: equal chances keep each candidate's tokens in order.
	slices.SortStableFunc(c.toks, func(a, b draftTok) int { return cmp.Compare(b.v, a.v) })
	y, t := float64(g), fixed+per*float64(n)
	per += extra.Seconds()
	m := 0
	for _, d := range c.toks {
		if m == budget || d.v*t <= y*per {
			break
		}
		y, t = y+d.v, t+per
		lens[d.i]++
		m++
	}
	if base == shapeSplit {
		return m > 0 // each token raised the split step's rate
	}
	ef, ep, _ := c.fit(shapeEven)
	if even := ef + ep*float64(n); m > 0 && even > 0 && y/t > float64(g)/even {
		c.declined, c.probeEvery = 0, 0
		return true
	}
	c.declined++
	if c.probeEvery == 0 {
		c.probeEvery = draftProbeFirst
	}
	clear(lens)
	if c.by[shapeSplit].w > 0 && c.declined < c.probeEvery {
		return false
	}
	// A probe: every token likelier than draftProbeChance to hold, so that
	// the split step is measured with as many tokens as drafts that pay
	// would bring (a step of a few draft tokens tells little of the cost
	// of many: a larger pass can cost less per token).
	m = 0
	for _, d := range c.toks {
		if m == budget || d.v < draftProbeChance {
			break
		}
		lens[d.i]++
		m++
	}
	if m == 0 {
		return false
	}
	c.declined = 0
	c.probeEvery = min(2*c.probeEvery, draftProbeMax)
	c.probes++
	return true
}

// draftCost models a decode step's time as fixed + perToken x tokens,
// fitted by least squares over the recent steps (exponentially forgotten),
// from a prior until the steps have told it apart.
//
// A draft token is worth its place when, with g sequences generating in a
// step of T (estimated) seconds, its chance p of holding gives more tokens
// per second than the step without it: (g + p) / (T + perToken) > g / T,
// that is p > g x perToken / T. Where the fixed cost dominates (a model
// whose weights' reading bounds a step, a GPU, one stream) the bar is low;
// where the tokens' own cost dominates (many sequences in the step on the
// CPU) it is high, and drafts back off. A prompt chunk in the step
// lengthens T without adding to g: it lowers the bar a little.
type draftCost struct {
	w, sn, st, snn, snt float64 // forgotten sums: weight, n, t, n*n, n*t
	fixed, perToken     float64 // the fit, seconds
}

const (
	draftCostForget = 0.98 // weight of the earlier steps at each step (a memory of about 50 steps)
	// draftCostPrior is perToken/fixed until the steps tell them apart: on
	// the CPU a 135M F16 model's decode step of one token takes about 5
	// times what each further token in the batch adds (BENCHMARKS.md).
	draftCostPrior = 0.2
)

// observe adds a step of n tokens that took d.
func (c *draftCost) observe(n int, d time.Duration) {
	x, t := float64(n), d.Seconds()
	c.w = c.w*draftCostForget + 1
	c.sn = c.sn*draftCostForget + x
	c.st = c.st*draftCostForget + t
	c.snn = c.snn*draftCostForget + x*x
	c.snt = c.snt*draftCostForget + x*t
	mean := c.st / c.w
	varN := c.snn/c.w - (c.sn/c.w)*(c.sn/c.w)
	if varN > 0.25 { // the token counts differ enough to tell the costs apart
		b := (c.snt/c.w - (c.sn/c.w)*mean) / varN
		a := mean - b*c.sn/c.w
		if b >= 0 && a >= 0 && !math.IsNaN(a+b) {
			c.fixed, c.perToken = a, b
			return
		}
	}
	// From the prior: the mean step as fixed + prior x fixed x mean n.
	c.fixed = mean / (1 + draftCostPrior*c.sn/c.w)
	c.perToken = draftCostPrior * c.fixed
}

// bar is the least chance of holding for which a draft token pays, in a
// step of n tokens of which g are generating sequences' inputs.
func (c *draftCost) bar(g, n int) float64 {
	if c.w == 0 {
		return float64(g) * draftCostPrior / (1 + draftCostPrior*float64(n))
	}
	t := c.fixed + c.perToken*float64(n)
	if t <= 0 {
		return 0
	}
	return float64(g) * c.perToken / t
}

// barWith is bar for draft tokens that cost extra each besides their
// place in the step (a draft model's decode of each): the chance of
// holding for which (g + p) / (T + perToken + extra) > g / T.
func (c *draftCost) barWith(g, n int, extra time.Duration) float64 {
	if extra <= 0 || c.w == 0 {
		return c.bar(g, n)
	}
	t := c.fixed + c.perToken*float64(n)
	if t <= 0 {
		return 0
	}
	return float64(g) * (c.perToken + extra.Seconds()) / t
}

// shape is the shape of a step of seqs sequences whose token counts range
// from minN to maxN.
func (e *Engine) shape(seqs, minN, maxN int) stepShape {
	if e.kvStreams && seqs > 1 && minN != maxN {
		return shapeSplit
	}
	return shapeEven
}

// planDrafts sets each generating sequence's plan for the step being
// built: g of them, n tokens without drafts over seqs sequences, base its
// shape without drafts, budget tokens left for drafts. Only auto mode
// with a KV stream per slot and more than one sequence in the step plans
// (a draft there splits the step, or the step is split already); every
// other step drafts token by token against the even step's cost.
func (e *Engine) planDrafts(g, n, budget int, base stepShape, seqs int) {
	plan := e.draftMode == DraftAuto && !e.noDraft && e.kvStreams && seqs > 1 && g > 0
	cands, order := e.draftCands[:0], e.draftSeqs[:0]
	defer func() {
		clear(order) // no sequence kept alive by the reused slice
		e.draftCands, e.draftSeqs = cands[:0], order[:0]
	}()
	for _, s := range e.slots {
		seq := s.seq
		if seq == nil {
			continue
		}
		seq.plan = -1
		if !plan || !(len(seq.pending) == 1 && seq.generated > 0) {
			continue
		}
		seq.plan = 0
		// As addDraft will cap it, with the input token in the cache.
		k := min(e.draftMax, seq.req.Params.MaxTokens-seq.generated-1, e.nCtx-3-len(s.cached))
		if k > 0 && e.dm == nil {
			e.draftBuf = s.draft.lookup(e.draftBuf, k)
			k = len(e.draftBuf)
		}
		if k > 0 {
			cands = append(cands, draftCand{p: seq.ds.chance(), max: k})
			order = append(order, seq)
		}
	}
	if len(cands) == 0 {
		return
	}
	var extra time.Duration
	if e.dm != nil {
		extra = e.dm.perToken
	}
	e.draftLens = slices.Grow(e.draftLens[:0], len(cands))[:len(cands)]
	if e.costs.plan(cands, e.draftLens, base, g, n, budget, extra) {
		for i, seq := range order {
			seq.plan = e.draftLens[i]
		}
	}
}

// promptTokens is how many of pending's tokens a step can evaluate: up to
// the next image, which the next step's stepImages evaluates.
func promptTokens(pending []int) int {
	if i := slices.IndexFunc(pending, func(t int) bool { return t < 0 }); i >= 0 {
		return i
	}
	return len(pending)
}
