package wsock

// Messages that carry images. A socket message may pass its endpoint's cap
// by the room its images may take (the image limits), so a pasted photo
// goes through while the rest of the message keeps the cap; the bytes a
// message holds past Caps.Free are held from the server's budget of
// request bodies in flight, as an HTTP body's are, so many large messages
// at once are refused rather than held in memory. Every socket endpoint
// that takes images (the chat's JSON mode, the Responses API's socket)
// reads with ReadMessage and checks the rest of what it parsed with
// CheckRest.

import (
	"errors"

	"github.com/parley-chat/parley"
)

// Budget is the server's budget of the bytes of request bodies in flight
// (HTTP bodies and socket messages alike), in all and per client. Take
// reserves n bytes for client; its error is the refusal to tell the client
// (busy, or rate_limited for one client's share, with a retry time). Give
// returns bytes Take reserved. Safe for concurrent use.
type Budget interface {
	Take(client string, n int64) error
	Give(client string, n int64)
}

// Hold is bytes of a Budget held for one client. The zero Hold holds
// nothing. One goroutine owns a Hold at a time: handing it on (to a queued
// job, say) hands on the duty to release it.
type Hold struct {
	budget Budget
	client string
	n      int64
}

// NewHold is an empty hold on budget for client; a nil budget holds
// nothing and refuses nothing.
func NewHold(budget Budget, client string) Hold { return Hold{budget: budget, client: client} }

// Bytes is what h holds.
func (h *Hold) Bytes() int64 { return h.n }

// Grow takes n more bytes from the budget; on a refusal h holds what it
// held.
func (h *Hold) Grow(n int64) error {
	if n <= 0 || h.budget == nil {
		return nil
	}
	if err := h.budget.Take(h.client, n); err != nil {
		return err
	}
	h.n += n
	return nil
}

// Release gives back every byte h holds.
func (h *Hold) Release() {
	if h.n > 0 && h.budget != nil {
		h.budget.Give(h.client, h.n)
	}
	h.n = 0
}

// Split is a hold of n bytes: up to n of h's bytes move to it, and what h
// lacks is taken from the budget. On a refusal nothing moves.
func (h *Hold) Split(n int64) (Hold, error) {
	moved := min(max(n, 0), h.n)
	out := Hold{budget: h.budget, client: h.client, n: moved}
	if err := out.Grow(n - moved); err != nil {
		return Hold{}, err
	}
	h.n -= moved
	return out, nil
}

// Caps are the sizes of one endpoint's messages.
type Caps struct {
	// Plain is the most a message may be without its images.
	Plain int64
	// Max is the most a message with images may be: Plain and the most
	// the image limits let its images take as data: URLs
	// (media.Limits.MaxSourceBytes). <= Plain: images get no more room
	// than text.
	Max int64
	// Free is what a message may hold without the budget: the bytes past
	// it are held from the budget while the message is read.
	Free int64
}

// limit is the most a message may be read as.
func (c Caps) limit() int64 { return max(c.Plain, c.Max) }

// ReadLimit is the read limit to set at the upgrade: a message past twice
// its cap closes the connection with 1009 (one past its cap is read to its
// end and refused, so the connection lives on), and one past the cap of a
// socket read whole (nothing past Free) does too.
func (c Caps) ReadLimit() int64 {
	if c.limit() <= c.Free {
		return c.limit()
	}
	return 2 * c.limit()
}

// ReadMessage reads the next message under caps. The bytes it holds past
// caps.Free are held from budget for client (hold: the caller releases it,
// or hands it on, when done with the message). A message over its cap, or
// one the budget has no room for, is read to its end and dropped (data is
// nil), and refusal says what to tell the client: too_large, or the
// budget's refusal; it is counted under its cause, and hold is empty. ok
// is false when the read failed (as Read's).
func (c *Pump) ReadMessage(caps Caps, budget Budget, client string) (mt int, data []byte, hold Hold, refusal error, ok bool) {
	hold = NewHold(budget, client)
	limit := caps.limit()
	if limit <= caps.Free {
		mt, data, ok = c.Read()
		return mt, data, hold, nil, ok
	}
	mt, data, dropped, ok := c.readCapped(limit, caps.Free, &hold)
	if !ok || dropped != nil {
		hold.Release()
	}
	switch {
	case !ok:
		return 0, nil, hold, nil, false
	case errors.Is(dropped, errMessageTooLarge):
		c.refused(RefusedMessageSize)
		return mt, nil, hold, parley.Errorf(parley.ETooLarge,
			"the message is over %d bytes, the most one with images may be (%d without them; --image-max-bytes and --image-max-per-request set the difference)",
			limit, caps.Plain), true
	case dropped != nil:
		if c.set.CountRefusal != nil {
			c.set.CountRefusal(dropped) // the budget's cause
		}
		return mt, nil, hold, dropped, true
	}
	return mt, data, hold, nil, true
}

// CheckRest refuses a message of size bytes whose imageBytes (its images
// as it carried them) leave more than caps.Plain: past Plain only by its
// images, the rest keeps the cap of a message without them. The refusal is
// counted.
func (c *Pump) CheckRest(caps Caps, size, imageBytes int64) error {
	if rest := size - imageBytes; rest > caps.Plain {
		c.refused(RefusedMessageSize)
		return parley.Errorf(parley.ETooLarge, "the message is over %d bytes without its images (%d bytes)", caps.Plain, rest)
	}
	return nil
}
