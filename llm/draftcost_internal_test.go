package llm

import (
	"testing"
	"time"
)

// Step costs scripted after draftbench's figures at one thread and 8
// streams (each slot its own KV stream): stories260K's steps are bound by
// a pass over its weights, so a second pass doubles a step whatever its
// tokens; a 135M model's are bound by the tokens' arithmetic, which costs
// less per token in a larger pass.
type scriptedModel struct {
	even  func(n int) time.Duration
	split func(n int) time.Duration
}

var (
	stories = scriptedModel{
		even:  func(n int) time.Duration { return time.Duration(1000+20*n) * time.Microsecond },
		split: func(n int) time.Duration { return time.Duration(2300+20*n) * time.Microsecond },
	}
	smol = scriptedModel{ // one token 9.5 ms, 8 tokens 52 ms; 72 tokens over two passes 210 ms
		even:  func(n int) time.Duration { return time.Duration(3400+6070*n) * time.Microsecond },
		split: func(n int) time.Duration { return time.Duration(75000+1880*n) * time.Microsecond },
	}
)

// feed gives c the even steps of a run that started with one stream and
// went on with eight: steps of 1 to 8 tokens, then of 8.
func (m scriptedModel) feed(c *stepCosts) {
	for n := 1; n <= 8; n++ {
		c.observe(shapeEven, n, m.even(n))
	}
	for range 50 {
		c.observe(shapeEven, 8, m.even(8))
	}
}

func cands(n int, p float64, max int) []draftCand {
	c := make([]draftCand, n)
	for i := range c {
		c[i] = draftCand{p: p, max: max}
	}
	return c
}

// run plans steps steps of eight generating sequences offering drafts of
// up to 8 tokens at chance p, times each as m says (split when it drafts),
// and returns how many drafted and the last step's plan.
func (m scriptedModel) run(c *stepCosts, steps int, p float64) (drafted int, lens []int) {
	cs := cands(8, p, 8)
	lens = make([]int, len(cs))
	for range steps {
		if !c.plan(cs, lens, shapeEven, 8, 8, 512, 0) {
			c.observe(shapeEven, 8, m.even(8))
			continue
		}
		drafted++
		n := 8
		for _, l := range lens {
			n += l
		}
		c.observe(shapeSplit, n, m.split(n))
	}
	return drafted, lens
}

// TestDraftPlanLearnsSplitCost: the 135M-shaped model's split steps are
// taken for an even step and a second pass until one is measured (a
// probe); measured, they pay for drafts that mostly hold, and every step
// drafts. Drafts that mostly miss do not pay for them.
func TestDraftPlanLearnsSplitCost(t *testing.T) {
	var c stepCosts
	smol.feed(&c)
	cs, lens := cands(8, 0.9, 8), make([]int, 8)
	// Before any split step: the prior says a draft's pass costs too much,
	// yet the plan drafts, as a probe.
	fixed, per, _ := c.fit(shapeSplit)
	y, t0 := 8.0, fixed+per*72
	for i := 1; i <= 8; i++ {
		y += 8 * pow(0.9, i)
	}
	if y/t0 > 8/smol.even(8).Seconds() {
		t.Fatalf("the prior already favours drafts (%v tokens/s against %v): the test shows nothing", y/t0, 8/smol.even(8).Seconds())
	}
	if !c.plan(cs, lens, shapeEven, 8, 8, 512, 0) || c.probes != 1 {
		t.Fatalf("no probe before any split step was timed (probes %d)", c.probes)
	}
	drafted, lens := smol.run(&c, 200, 0.9)
	if drafted != 200 {
		t.Fatalf("drafted in %d of 200 steps after the probe, want all", drafted)
	}
	for i, l := range lens {
		if l < 6 {
			t.Errorf("sequence %d drafts %d tokens, want most of its 8", i, l)
		}
	}
	if drafted, _ := smol.run(&c, 200, 0.15); drafted > 200/draftProbeFirst {
		t.Errorf("drafts that hold 15%% of the time: drafted in %d of 200 steps, want probes only", drafted)
	}
}

// TestDraftPlanBacksOffStories: on the stories260K-shaped model a split
// step of drafts that hold 60% of the time loses; the plan probes it at
// growing intervals and drafts in few steps. Drafts that hold less often
// than a probe's least chance are not probed; drafts that hold nearly
// always do pay there, and a single sequence's draft does not.
func TestDraftPlanBacksOffStories(t *testing.T) {
	var c stepCosts
	stories.feed(&c)
	if drafted, _ := stories.run(&c, 2000, 0.27); drafted != 0 {
		t.Fatalf("drafts that hold 27%% of the time: drafted in %d of 2000 steps, want none", drafted)
	}
	drafted, _ := stories.run(&c, 2000, 0.6)
	if drafted < 2 || drafted > 12 || drafted != c.probes {
		t.Fatalf("drafts that hold 60%% of the time: drafted in %d of 2000 steps, %d probes; want a few, all probes", drafted, c.probes)
	}
	if c.probeEvery != draftProbeMax {
		t.Errorf("probes every %d declined steps after 2000, want %d", c.probeEvery, draftProbeMax)
	}
	lens := make([]int, 8)
	one := append(cands(1, 0.95, 8), cands(7, 0.5, 0)...)
	probes := c.probes
	if c.plan(one, lens, shapeEven, 8, 8, 512, 0) && c.probes == probes {
		t.Fatalf("one sequence's draft beside seven single tokens: plan %v, want none", lens)
	}
	// Probes so far measured split steps of one draft token each: the
	// next, within draftProbeMax steps, measures long drafts, which pay.
	stories.run(&c, draftProbeMax, 0.97)
	if drafted, _ := stories.run(&c, 100, 0.97); drafted != 100 {
		t.Errorf("drafts that hold 97%% of the time: drafted in %d of 100 steps, want all", drafted)
	}
}

// TestDraftPlanBudget: the plan takes the likeliest tokens first, each
// candidate's in order, and never more than the budget; a step split
// already (a prompt chunk beside the replies) needs no win over an even one.
func TestDraftPlanBudget(t *testing.T) {
	var c stepCosts
	smol.feed(&c)
	for range 20 {
		c.observe(shapeSplit, 72, smol.split(72))
		c.observe(shapeSplit, 16, smol.split(16))
	}
	cs := []draftCand{{p: 0.5, max: 8}, {p: 0.99, max: 3}, {p: 0.9, max: 8}}
	lens := make([]int, len(cs))
	if !c.plan(cs, lens, shapeSplit, 3, 67, 6, 0) {
		t.Fatal("no plan")
	}
	if lens[0]+lens[1]+lens[2] != 6 || lens[1] != 3 || lens[2] != 3 || lens[0] != 0 {
		t.Fatalf("plan %v, want [0 3 3]: the six likeliest tokens", lens)
	}
	// A draft model's time per token comes on top: at 50 ms a token only
	// the likeliest pay.
	if c.plan(cs, lens, shapeSplit, 3, 67, 64, 50*time.Millisecond) && lens[0] != 0 {
		t.Fatalf("plan %v with a draft model's 50 ms a token, want none of the 0.5 candidate's", lens)
	}
	if c.plan(cs, lens, shapeEven, 0, 0, 64, 0) {
		t.Fatal("a plan for a step without generating sequences")
	}
}

func pow(x float64, n int) float64 {
	r := 1.0
	for range n {
		r *= x
	}
	return r
}
