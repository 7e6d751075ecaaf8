package chatsocket

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// Messages of the structured (JSON) WebSocket mode: server -> client, then
// client -> server (clientMessage) at the end.

type sessionMessage struct {
	Type     string           `json:"type"` // "session"
	ID       string           `json:"id"`
	Resumed  bool             `json:"resumed"`
	Model    string           `json:"model,omitempty"` // the session's model, when the server serves several
	Messages []historyMessage `json:"messages"`
	Reply    *liveReplyJSON   `json:"reply,omitempty"` // a reply in flight, on resume (resume.go)
}

type tokenMessage struct {
	Type    string  `json:"type"` // "token"
	ID      int     `json:"id"`
	Text    string  `json:"text"`
	Logprob float64 `json:"logprob"`
	Special bool    `json:"special"`
	Seq     int     `json:"seq"` // the token's position in its reply, from 1 (see resume_from)
}

type doneMessage struct {
	Type         string          `json:"type"` // "done"
	FinishReason string          `json:"finish_reason"`
	Content      string          `json:"content"`
	Thinking     string          `json:"thinking,omitempty"` // a reasoning model's whole thought, kept apart from content
	Usage        apicore.Usage   `json:"usage"`
	Timings      apicore.Timings `json:"timings"`
	// ToolCalls are the reply's complete tool calls (finish_reason "tool_calls").
	ToolCalls []parley.ToolCall `json:"tool_calls,omitempty"`
}

type errorMessage struct {
	Type    string `json:"type"` // "error"
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
	// RetryAfter is when to try again, in seconds (rate limits, a full
	// store), as HTTP's Retry-After says it.
	RetryAfter int `json:"retry_after,omitempty"`
}

func newDoneMessage(ev parley.Event, content string) doneMessage {
	return doneMessage{
		Type:         "done",
		FinishReason: string(ev.Finish),
		Content:      content,
		Usage:        apicore.NewUsage(ev.Usage),
		Timings:      apicore.NewTimings(ev.Timings, ev.Usage.CompletionTokens),
		ToolCalls:    ev.ToolCalls,
	}
}

// rateLimiter allows n events per window: a token bucket that holds at
// most n tokens (the burst) and refills n per window. Its state is two
// numbers whatever n is, so a high configured rate costs no memory per
// connection (a log of event times would hold up to n of them).
type rateLimiter struct {
	mu     sync.Mutex
	n      float64
	window time.Duration
	tokens float64   // guarded by mu; in [0, n]
	last   time.Time // guarded by mu; when tokens was last brought up to date
}

func newRateLimiter(n int, window time.Duration) *rateLimiter {
	return &rateLimiter{n: float64(n), window: window, tokens: float64(n)}
}

func (r *rateLimiter) allow(now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.last.IsZero() && now.After(r.last) {
		r.tokens = min(r.n, r.tokens+r.n*float64(now.Sub(r.last))/float64(r.window))
	}
	r.last = now
	if r.tokens < 1 {
		return false
	}
	r.tokens--
	return true
}

// clientMessage is what a client sends in JSON mode.
type clientMessage struct {
	Type string `json:"type"`
	// RawContent is content as sent: a string, or (a prompt) an array of
	// text and image_url parts in the order they stand.
	RawContent json.RawMessage `json:"content"`
	Images     []string        `json:"images"` // prompt: images as data: URLs or base64, placed before the text
	Params     *wsParams       `json:"params"`
	ToolCallID string          `json:"tool_call_id"` // tool_result: the call it answers
	// Model (prompt), with several models, picks the session's model
	// before its first turn; a session with a history keeps its own.
	Model string `json:"model"`

	// Content is content's text (its text parts joined); nil when absent.
	Content *string `json:"-"`
	// Placed are the images of content's parts, each with its place in
	// Content (a prompt's images come either here or in Images).
	Placed []placedImage `json:"-"`
}

// imageBytes is the bytes of m's images as it carried them (their data:
// URLs or base64).
func (m *clientMessage) imageBytes() int64 {
	var n int64
	for _, src := range m.Images {
		n += int64(len(src))
	}
	for _, p := range m.Placed {
		n += int64(len(p.src))
	}
	return n
}

// placedImage is an image part of a prompt's content: its source (a data:
// URL, or base64), the part that carried it, and the byte offset in the
// prompt's text before which it stands (parley.ImagePart.Offset).
type placedImage struct {
	src, part string
	offset    int
}

// parseClientMessage decodes and checks one JSON-mode client message: a
// known type, and the content that type needs. Errors are EInvalid *Errors
// naming the field, safe to show the client. (Sampling parameters are
// checked against the server's defaults and cap by resolveParams.)
func parseClientMessage(data []byte) (clientMessage, error) {
	var m clientMessage
	if err := apicore.DecodeJSON(bytes.NewReader(data), &m); err != nil {
		return m, err
	}
	if err := m.parseContent(); err != nil {
		return m, err
	}
	switch m.Type {
	case "prompt", "system":
		if m.Content == nil {
			return m, parley.FieldErrorf("content", "is required")
		}
		if m.Type == "prompt" && *m.Content == "" && len(m.Images) == 0 && len(m.Placed) == 0 {
			return m, parley.FieldErrorf("content", "must not be empty")
		}
		if len(m.Images) > 0 && len(m.Placed) > 0 {
			return m, parley.FieldErrorf("images", "give a prompt's images either as content parts or in images, not both")
		}
		if m.Type == "system" && len(m.Images) > 0 {
			return m, parley.FieldErrorf("images", "a system prompt carries no images")
		}
	case "tool_result":
		if m.ToolCallID == "" {
			return m, parley.FieldErrorf("tool_call_id", "is required")
		}
		if m.Content == nil {
			return m, parley.FieldErrorf("content", "is required")
		}
	case "cancel", "reset", "regenerate", "continue":
	case "":
		return m, parley.FieldErrorf("type", "is required")
	default:
		return m, parley.FieldErrorf("type", "unknown message type %q (want prompt, tool_result, regenerate, continue, cancel, reset or system)", m.Type)
	}
	return m, nil
}

// parseContent reads RawContent into Content: a string, or for a prompt an
// array of parts, {"type":"text","text":...} and {"type":"image_url",
// "image_url":{"url":...}} (or "image_url":"..."), whose text is joined and
// whose images are Placed where they stand among it.
func (m *clientMessage) parseContent() error {
	raw := bytes.TrimSpace(m.RawContent)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil
	}
	if raw[0] != '[' || m.Type != "prompt" {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			if m.Type == "prompt" {
				return parley.FieldErrorf("content", "must be a string or an array of text and image_url parts")
			}
			return parley.FieldErrorf("content", "must be a string")
		}
		m.Content = &s
		return nil
	}
	var parts []struct {
		Type     string          `json:"type"`
		Text     *string         `json:"text"`
		ImageURL json.RawMessage `json:"image_url"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return parley.FieldErrorf("content", "must be a string or an array of text and image_url parts")
	}
	var b strings.Builder
	for i, p := range parts {
		f := fmt.Sprintf("content[%d]", i)
		switch p.Type {
		case "text":
			if p.Text == nil {
				return parley.FieldErrorf(f+".text", "is required")
			}
			b.WriteString(*p.Text)
		case "image_url":
			url, err := apicore.ImageURL(p.ImageURL, f)
			if err != nil {
				return err
			}
			if url == "" {
				return parley.FieldErrorf(f+".image_url", "is required")
			}
			m.Placed = append(m.Placed, placedImage{src: url, part: f, offset: b.Len()})
		default:
			return parley.FieldErrorf(f+".type", "must be text or image_url, got %q", p.Type)
		}
	}
	s := b.String()
	m.Content = &s
	return nil
}

// loadingMessage is the JSON-mode WebSocket message that shows a prompt
// waiting for its model to load.
type loadingMessage struct {
	Type     string  `json:"type"` // "loading"
	Model    string  `json:"model"`
	Progress float64 `json:"progress"` // 0 to 1
}
