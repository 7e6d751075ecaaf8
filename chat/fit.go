package chat

import (
	"fmt"

	"github.com/parley-chat/parley"
)

// Fit returns msgs without their oldest turns, as few as needed for count
// (the number of tokens of the rendered prompt) to be at most budget.
//
// A turn is a user message and the assistant messages that answer it, and is
// dropped whole. System messages always stay, wherever they are, and so does
// everything from the newest user message on. dropped is the number of
// messages removed (0 when msgs fit as they are; callers log it). When even
// the system messages and the newest user turn exceed budget, Fit returns a
// parley ETooLarge *Error.
//
// count must not grow when messages are removed (true of every template
// here); Fit relies on it to search instead of trying every cut. It calls
// count O(log turns) times, once when msgs already fit.
func Fit(msgs []parley.Message, budget int, count func(msgs []parley.Message) (int, error)) (kept []parley.Message, dropped int, err error) {
	kept, dropped, _, err = fit(msgs, budget, 1, 0, count)
	return kept, dropped, err
}

// FitStable is Fit, but it drops turns in multiples of block. The KV cache
// reuses a prompt's longest common prefix with the last one, and every cut
// point changes the prefix: Fit's minimal cut moves forward on almost every
// turn once the window is full, so each turn would be read again in full.
// Dropping in blocks keeps the cut, and so the cache, for several turns, at
// the cost of up to block-1 turns of history that would have fitted.
func FitStable(msgs []parley.Message, budget, block int, count func(msgs []parley.Message) (int, error)) (kept []parley.Message, dropped int, err error) {
	kept, dropped, _, err = fit(msgs, budget, max(block, 1), 0, count)
	return kept, dropped, err
}

// withoutBefore returns msgs without the non-system messages before cut. It
// copies only what it keeps, so it costs the window, not the history.
func withoutBefore(msgs []parley.Message, cut int) []parley.Message {
	var out []parley.Message
	for i := range cut {
		if msgs[i].Role == parley.RoleSystem {
			out = append(out, msgs[i])
		}
	}
	if out == nil {
		return msgs[cut:len(msgs):len(msgs)] // full slice: appending never writes into msgs
	}
	return append(out, msgs[cut:]...)
}

// turnsOf returns turnEnd: turnEnd[i] is the index just past the i-th
// droppable turn (those before the newest user message), so dropping the
// first k turns removes every non-system message before turnEnd[k-1].
func turnsOf(msgs []parley.Message) (turnEnd []int) {
	last := len(msgs)
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == parley.RoleUser {
			last = i
			break
		}
	}
	for i := 0; i < last; i++ {
		if msgs[i].Role == parley.RoleSystem {
			continue
		}
		if msgs[i].Role == parley.RoleUser || len(turnEnd) == 0 {
			turnEnd = append(turnEnd, i+1)
		} else {
			turnEnd[len(turnEnd)-1] = i + 1
		}
	}
	return turnEnd
}

// fit is FitStable (block >= 1) for a conversation known to need at least
// from turns dropped (the last turn of the same conversation dropped them,
// and the conversation has only grown since): it never counts a prompt with
// more history than that, so its cost does not depend on how much history
// was dropped before. It also reports the number of turns dropped.
func fit(msgs []parley.Message, budget, block, from int, count func(msgs []parley.Message) (int, error)) (kept []parley.Message, dropped, turns int, err error) {
	turnEnd := turnsOf(msgs)
	from = min(max(from, 0), len(turnEnd))
	var n int
	if from == 0 {
		n, err = count(msgs)
		if err != nil {
			return nil, 0, 0, fmt.Errorf("count prompt tokens: %w", err)
		}
		if n <= budget {
			return msgs, 0, 0, nil
		}
	}

	without := func(k int) ([]parley.Message, int) {
		out := withoutBefore(msgs, turnEnd[k-1])
		return out, len(msgs) - len(out)
	}
	// fits reports whether dropping k turns fits; it leaves the count in n
	// for the error message.
	fits := func(k int) (bool, error) {
		m, _ := without(k)
		c, err := count(m)
		if err != nil {
			return false, fmt.Errorf("count prompt tokens: %w", err)
		}
		n = c
		return c <= budget, nil
	}

	// Gallop (1, 2, 4, ... turns) so that the usual case, a conversation
	// just past the limit, costs one or two counts; then bisect.
	if len(turnEnd) == 0 {
		return nil, 0, 0, tooLarge(n, budget)
	}
	lo, hi := 0, 0 // dropping lo turns does not fit; dropping hi does
	if from > 0 {
		// Dropping fewer than from turns did not fit last time, and the
		// conversation has only grown: start there.
		ok, err := fits(from)
		if err != nil {
			return nil, 0, 0, err
		}
		if ok {
			kept, dropped = without(from)
			return kept, dropped, from, nil
		}
		if from == len(turnEnd) {
			return nil, 0, 0, tooLarge(n, budget)
		}
		lo = from
	}
	for step := 1; hi == 0; step *= 2 {
		k := min(from+step, len(turnEnd))
		ok, err := fits(k)
		if err != nil {
			return nil, 0, 0, err
		}
		switch {
		case ok:
			hi = k
		case k == len(turnEnd):
			return nil, 0, 0, tooLarge(n, budget)
		default:
			lo = k
		}
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		ok, err := fits(mid)
		if err != nil {
			return nil, 0, 0, err
		}
		if ok {
			hi = mid
		} else {
			lo = mid
		}
	}
	// Round up to the block: dropping more turns still fits (count does not grow).
	hi = min((hi+block-1)/block*block, len(turnEnd))
	kept, dropped = without(hi)
	return kept, dropped, hi, nil
}

// tooLarge reports a prompt that cannot fit however much history is dropped.
func tooLarge(tokens, budget int) error {
	return parley.PromptTooLong(tokens, budget, "the message is too long: the prompt needs %d tokens or more even without earlier turns, but only %d fit", tokens, budget)
}
