package responses

// item_reference inputs: a client that keeps its own history but lets the
// server store the responses (the AI SDK's OpenAI provider, store: true)
// sends an earlier output item back as {"type": "item_reference", "id":
// ...} instead of its content. Item ids name their session through a
// one-way digest (session.ItemID), so the server remembers which session
// each recent stored response's items belong to, and reads the item from
// that session when a later request refers to it.

import (
	"context"
	"strconv"
	"strings"
	"sync"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
)

// maxItemSessions bounds the sessions itemSessions remembers: the newest
// stored responses' sessions. A reference to an item of an older one is a
// 404, as a reference to an item OpenAI no longer keeps is.
const maxItemSessions = 4096

// itemSessions maps the session digest in item ids (session.ItemID without
// its prefix and position) to the session id, for the newest
// maxItemSessions sessions that stored a response. Safe for concurrent use.
type itemSessions struct {
	mu    sync.Mutex
	sids  map[string]string
	order []string // keys, oldest first
}

// itemKeyOf is the session digest in session sid's item ids.
func itemKeyOf(sid string) string {
	id := session.ItemID(sid, 0)
	return strings.TrimSuffix(strings.TrimPrefix(id, session.ItemPrefix), "0")
}

func (r *itemSessions) remember(sid string) {
	key := itemKeyOf(sid)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sids == nil {
		r.sids = map[string]string{}
	}
	if _, ok := r.sids[key]; ok {
		return
	}
	r.sids[key] = sid
	r.order = append(r.order, key)
	if len(r.order) > maxItemSessions {
		delete(r.sids, r.order[0])
		r.order = r.order[1:]
	}
}

// find returns the session whose digest begins rest (an item id without its
// prefix), and what follows the digest. Every digest has one length.
func (r *itemSessions) find(rest string) (sid, tail string, ok bool) {
	n := len(itemKeyOf(""))
	if len(rest) <= n {
		return "", "", false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	sid, ok = r.sids[rest[:n]]
	return sid, rest[n:], ok
}

// respond runs a Responses turn and remembers its session for later
// item_reference inputs when the response is stored. Every Responses turn
// (HTTP, background, WebSocket) starts here.
func (s *API) respond(ctx context.Context, req session.ResponseRequest) (*session.Response, error) {
	if strings.HasPrefix(req.Previous, warmupPrefix) {
		// A warm-up is kept by its socket alone (warmup.chain took those it knows).
		return nil, parley.Errorf(parley.ENotFound, "no such response: a warm-up (generate: false) continues only on its own WebSocket")
	}
	resp, err := s.convs.Respond(ctx, req)
	if err == nil && resp.Stored {
		s.items.remember(resp.SessionID())
	}
	return resp, err
}

// itemRef is a resolved item_reference: a message (a message item's text,
// or a function_call item's call) or a reasoning item's thought.
type itemRef struct {
	msg     parley.Message
	thought string
	isMsg   bool
}

// resolveItem reads the item an item_reference names (field names the
// reference): a message item (msg_), a function call (fc_) or a reasoning
// item (rs_) of a stored response.
func (s *API) resolveItem(ctx context.Context, id, field string) (itemRef, error) {
	notFound := parley.FieldErrorf(field+".id", "no stored item %q (an item_reference names an output item of a stored response this server still keeps)", id)
	if s.convs == nil {
		return itemRef{}, notFound
	}
	prefix, rest, ok := strings.Cut(id, "_")
	if !ok {
		return itemRef{}, notFound
	}
	sid, tail, ok := s.items.find(rest)
	if !ok {
		return itemRef{}, notFound
	}
	call := -1
	if prefix == "fc" {
		pos, j, ok := strings.Cut(tail, "_")
		n, err := strconv.Atoi(j)
		if !ok || err != nil || n < 0 {
			return itemRef{}, notFound
		}
		tail, call = pos, n
	}
	abs, err := strconv.Atoi(tail)
	if err != nil || abs < 0 || strconv.Itoa(abs) != tail {
		return itemRef{}, notFound
	}
	sess, err := s.convs.Conversation(ctx, sid)
	if err != nil {
		return itemRef{}, notFound
	}
	span := sess.Span(abs, abs+1)
	if len(span) != 1 {
		return itemRef{}, notFound
	}
	m := span[0]
	switch prefix {
	case "msg":
		return itemRef{msg: parley.Message{Role: m.Role, Content: m.Content, ToolCallID: m.ToolCallID}, isMsg: true}, nil
	case "rs":
		return itemRef{thought: m.Reasoning}, nil
	case "fc":
		if call < len(m.ToolCalls) {
			return itemRef{msg: parley.Message{Role: parley.RoleAssistant, ToolCalls: []parley.ToolCall{m.ToolCalls[call]}}, isMsg: true}, nil
		}
	}
	return itemRef{}, notFound
}
