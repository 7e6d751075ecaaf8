package responses

import (
	"bytes"
	"strings"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// A reasoning model's thought on the Responses API: a "reasoning" output item before the message, its text in
// reasoning_text content (streamed as response.reasoning_text.delta events), and its tokens counted in
// usage.output_tokens_details.reasoning_tokens.

type reasoningText struct {
	Type string `json:"type"` // "reasoning_text"
	Text string `json:"text"`
}

type reasoningItem struct {
	Type    string          `json:"type"` // "reasoning"
	ID      string          `json:"id"`
	Status  string          `json:"status"`
	Summary []struct{}      `json:"summary"` // always []: Parley does not summarise thoughts
	Content []reasoningText `json:"content"`
}

// newReasoningItem is the reasoning item of the reply at position end-1 of session sid (written as a reasoningItem;
// see messageItem.MarshalJSON).
func newReasoningItem(sid string, end int, thought string) messageItem {
	return messageItem{Type: "reasoning", ID: reasoningItemID(sid, end), Status: "completed", thought: thought}
}

func reasoningItemID(sid string, end int) string {
	return "rs_" + strings.TrimPrefix(session.ItemID(sid, end-1), session.ItemPrefix)
}

// reasoningInput reads a reasoning input item (a client sending back a response's output): the text of its
// reasoning_text parts, which goes with the assistant message that follows it; "" when it carries none (a summary or
// encrypted content only, which Parley does not produce and ignores).
func reasoningInput(it inputItem, field string) (string, error) {
	if !apicore.IsSet(it.Content) || bytes.Equal(bytes.TrimSpace(it.Content), []byte("[]")) {
		return "", nil
	}
	return apicore.ParseContent(it.Content, field+".content", "reasoning_text")
}

// outputItems opens and closes a streamed response's output items: the reasoning item (index 0) when the thought
// begins, the message (after it) when the answer begins.
type outputItems struct {
	es       *eventStream
	sid      string
	end      int
	msg      messageItem
	msgIndex int
	msgOpen  bool
	rsOpen   bool // the reasoning item is open (added, not done)
	rsID     string
	thought  strings.Builder
}

// openMessage sends the message item's added events, once.
func (o *outputItems) openMessage() error {
	if o.msgOpen {
		return nil
	}
	o.msgOpen = true
	item := o.msg
	item.Status, item.Content = "in_progress", []outputText{}
	return steps(
		func() error {
			return o.es.send("response.output_item.added", map[string]any{"output_index": o.msgIndex, "item": item})
		},
		func() error {
			return o.es.send("response.content_part.added", atPart(item.ID, o.msgIndex, map[string]any{"part": newPart("output_text", "")}))
		},
	)
}

// token streams one token's thought and answer text.
func (o *outputItems) token(t parley.Token) error {
	if t.Reasoning != "" && !o.msgOpen {
		if o.rsID == "" {
			o.rsID, o.rsOpen, o.msgIndex = reasoningItemID(o.sid, o.end), true, 1
			item := reasoningItem{Type: "reasoning", ID: o.rsID, Status: "in_progress", Summary: []struct{}{}, Content: []reasoningText{}}
			if err := o.es.send("response.output_item.added", map[string]any{"output_index": 0, "item": item}); err != nil {
				return err
			}
		}
		o.thought.WriteString(t.Reasoning)
		if err := o.es.send("response.reasoning_text.delta", atPart(o.rsID, 0, map[string]any{"delta": t.Reasoning})); err != nil {
			return err
		}
	}
	if t.Text == "" {
		return nil
	}
	if err := o.closeReasoning(); err != nil {
		return err
	}
	if err := o.openMessage(); err != nil {
		return err
	}
	delta := deltaEvent{Delta: t.Text, ItemID: o.msg.ID, OutputIndex: o.msgIndex, SequenceNumber: o.es.seq, Type: "response.output_text.delta"}
	return o.es.put(delta.Type, delta)
}

// closeReasoning sends the reasoning item's done events, once it is open.
func (o *outputItems) closeReasoning() error {
	if !o.rsOpen {
		return nil
	}
	o.rsOpen = false
	text := o.thought.String()
	item := reasoningItem{Type: "reasoning", ID: o.rsID, Status: session.StatusCompleted, Summary: []struct{}{},
		Content: []reasoningText{{Type: "reasoning_text", Text: text}}}
	return steps(
		func() error {
			return o.es.send("response.reasoning_text.done", atPart(o.rsID, 0, map[string]any{"text": text}))
		},
		func() error {
			return o.es.send("response.output_item.done", map[string]any{"output_index": 0, "item": item})
		},
	)
}
