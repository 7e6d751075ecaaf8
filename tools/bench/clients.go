package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-chat/parley/internal/jsonmode"
)

// turnResult is one prompt and its streamed reply, as the client saw it.
type turnResult struct {
	Turn         int           `json:"turn"` // 0-based index within its session
	TTFT         time.Duration `json:"ttft_ns"`
	Decode       time.Duration `json:"decode_ns"` // first token -> end of the reply
	Total        time.Duration `json:"total_ns"`  // prompt sent -> end of the reply
	Tokens       int           `json:"tokens"`    // completion tokens, as the server counts them
	Messages     int           `json:"messages"`  // token-carrying messages received
	PromptTokens int           `json:"prompt_tokens"`
	CachedTokens int           `json:"cached_tokens"` // -1 when the server does not say
	Finish       string        `json:"finish"`
	ServerRate   float64       `json:"server_tokens_per_second"` // the server's own decode-rate figure
	// ServerPromptMS is the server's own figure for the time to the first
	// token: Parley's ttft_ms (from the engine's submission, after the
	// session and template work), llama-server's prompt_ms (the prompt's
	// evaluation alone); 0 when the server gives none. The client's TTFT
	// less it is what the server spends around the engine.
	ServerPromptMS float64 `json:"server_prompt_ms"`
	Text           string  `json:"-"`
}

// rate is the client-side decode rate of a turn in tokens/s: the tokens after
// the first over the time from the first token to the end. 0 when undefined.
func (t turnResult) rate() float64 {
	if t.Tokens < 2 || t.Decode <= 0 {
		return 0
	}
	return float64(t.Tokens-1) / t.Decode.Seconds()
}

// sampling is what every request asks for: greedy decoding of at most
// maxTokens, penalties off and a fixed seed. (The plain transcript's stop
// strings apply too: Parley applies them itself, Ollama is told.)
type sampling struct {
	maxTokens int
	seed      int64
}

// session is one conversation with a server.
type session interface {
	// Turn sends prompt and reads the whole reply.
	Turn(ctx context.Context, prompt string, s sampling) (turnResult, error)
	Close() error
}

// target is a running server that conversations can be opened on.
type target interface {
	Name() string
	Open(ctx context.Context) (session, error)
	// Close releases the client side (idle connections); the server runs on.
	Close()
}

// ---- Parley: WebSocket JSON mode ----

// parleyTarget talks to a Parley server over ws://addr/ws?format=json.
type parleyTarget struct{ addr string }

func (p parleyTarget) Name() string { return "parley" }
func (p parleyTarget) Close()       {}

func (p parleyTarget) Open(ctx context.Context) (session, error) {
	u := url.URL{Scheme: "ws", Host: p.addr, Path: "/ws", RawQuery: "format=json"}
	// The handshake's own bound only catches a server that stopped answering; a loaded machine can take seconds to
	// accept (the workload's deadline, in ctx, bounds the rest).
	d := websocket.Dialer{HandshakeTimeout: time.Minute}
	ws, resp, err := d.DialContext(ctx, u.String(), nil)
	if err != nil {
		if resp != nil {
			return nil, fmt.Errorf("dial %s: %w (HTTP %s)", u.String(), err, resp.Status)
		}
		return nil, fmt.Errorf("dial %s: %w", u.String(), err)
	}
	s := &parleySession{ws: ws}
	var m jsonmode.Message
	if err := s.read(ctx, &m); err != nil {
		ws.Close()
		return nil, fmt.Errorf("read session message: %w", err)
	}
	if m.Type != "session" {
		ws.Close()
		return nil, fmt.Errorf("first message is %q, want session", m.Type)
	}
	return s, nil
}

type parleySession struct {
	ws *websocket.Conn
}

// read reads one message, giving up when ctx ends.
func (s *parleySession) read(ctx context.Context, m *jsonmode.Message) error {
	if dl, ok := ctx.Deadline(); ok {
		s.ws.SetReadDeadline(dl)
	}
	// Closing the socket is the only way to interrupt a blocked read.
	stop := context.AfterFunc(ctx, func() { s.ws.Close() })
	defer stop()
	*m = jsonmode.Message{}
	if err := s.ws.ReadJSON(m); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	return nil
}

func (s *parleySession) Turn(ctx context.Context, prompt string, sp sampling) (turnResult, error) {
	req := map[string]any{
		"type":    "prompt",
		"content": prompt,
		"params": map[string]any{
			"max_tokens":         sp.maxTokens,
			"temperature":        0,
			"repetition_penalty": 1,
			"seed":               sp.seed,
		},
	}
	var r turnResult
	s.ws.SetWriteDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	if err := s.ws.WriteJSON(req); err != nil {
		return r, fmt.Errorf("send prompt: %w", err)
	}
	var first time.Time
	var text strings.Builder
	for {
		var m jsonmode.Message
		if err := s.read(ctx, &m); err != nil {
			return r, fmt.Errorf("read reply: %w", err)
		}
		now := time.Now()
		switch m.Type {
		case "token":
			if first.IsZero() {
				first = now
			}
			r.Messages++
			text.WriteString(m.Text)
		case "done":
			if first.IsZero() {
				first = now
			}
			r.TTFT, r.Decode, r.Total = first.Sub(start), now.Sub(first), now.Sub(start)
			r.Tokens = m.Usage.CompletionTokens
			r.PromptTokens = m.Usage.PromptTokens
			r.CachedTokens = m.Usage.CachedPromptTokens
			r.Finish = m.FinishReason
			r.ServerRate = m.Timings.TokensPerSecond
			r.ServerPromptMS = m.Timings.TTFTMS
			r.Text = text.String()
			return r, nil
		case "error":
			return r, fmt.Errorf("server error %s: %s", m.Code, m.Message)
		}
	}
}

func (s *parleySession) Close() error {
	s.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	return s.ws.Close()
}

// ---- Ollama: streaming POST /api/chat with the whole history ----

// ollamaTarget talks to `ollama serve` the way its users do: every turn
// posts the whole conversation to /api/chat and reads the NDJSON stream.
type ollamaTarget struct {
	addr    string   // host:port
	model   string   // name given to `ollama create`
	ctx     int      // num_ctx: tokens per slot, as Parley's --ctx
	threads int      // num_thread, as Parley's --threads
	stops   []string // the stop strings Parley's plain transcript uses, so both servers check the same
	client  *http.Client
}

func (o ollamaTarget) Name() string { return "ollama" }
func (o ollamaTarget) Close()       { o.client.CloseIdleConnections() }

func (o ollamaTarget) Open(context.Context) (session, error) {
	return &ollamaSession{t: o}, nil
}

type ollamaMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type ollamaSession struct {
	t       ollamaTarget
	history []ollamaMessage
}

// ollamaChunk is one line of /api/chat's stream.
type ollamaChunk struct {
	Message         ollamaMessage `json:"message"`
	Done            bool          `json:"done"`
	DoneReason      string        `json:"done_reason"`
	PromptEvalCount int           `json:"prompt_eval_count"`
	EvalCount       int           `json:"eval_count"`
	EvalDuration    int64         `json:"eval_duration"` // ns
	Error           string        `json:"error"`
}

func (s *ollamaSession) Turn(ctx context.Context, prompt string, sp sampling) (turnResult, error) {
	var r turnResult
	msgs := append(append([]ollamaMessage(nil), s.history...), ollamaMessage{Role: "user", Content: prompt})
	body, err := json.Marshal(map[string]any{
		"model":      s.t.model,
		"messages":   msgs,
		"stream":     true,
		"keep_alive": -1,
		"options": map[string]any{
			"num_predict":    sp.maxTokens,
			"temperature":    0,
			"repeat_penalty": 1,
			"seed":           sp.seed,
			"num_ctx":        s.t.ctx,
			"num_thread":     s.t.threads,
			"stop":           s.t.stops,
		},
	})
	if err != nil {
		return r, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+s.t.addr+"/api/chat", bytes.NewReader(body))
	if err != nil {
		return r, err
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := s.t.client.Do(req)
	if err != nil {
		return r, fmt.Errorf("post /api/chat: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var buf bytes.Buffer
		buf.ReadFrom(resp.Body)
		return r, fmt.Errorf("post /api/chat: %s: %s", resp.Status, strings.TrimSpace(buf.String()))
	}
	var first time.Time
	var text strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		now := time.Now()
		var c ollamaChunk
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			return r, fmt.Errorf("decode /api/chat line %q: %w", sc.Text(), err)
		}
		if c.Error != "" {
			return r, fmt.Errorf("ollama error: %s", c.Error)
		}
		if !c.Done {
			if first.IsZero() {
				first = now
			}
			r.Messages++
			text.WriteString(c.Message.Content)
			continue
		}
		if first.IsZero() {
			first = now
		}
		text.WriteString(c.Message.Content)
		r.TTFT, r.Decode, r.Total = first.Sub(start), now.Sub(first), now.Sub(start)
		r.Tokens = c.EvalCount
		r.PromptTokens = c.PromptEvalCount
		r.CachedTokens = -1 // Ollama does not report cache reuse
		r.Finish = c.DoneReason
		if c.EvalDuration > 0 {
			r.ServerRate = float64(c.EvalCount) / (float64(c.EvalDuration) / 1e9)
		}
		r.Text = text.String()
		// The next turn carries this one, stripped as Parley's transcript
		// stores it, so both servers see the same prompt text.
		s.history = append(msgs, ollamaMessage{Role: "assistant", Content: strings.TrimSpace(r.Text)})
		return r, nil
	}
	if err := sc.Err(); err != nil {
		if ctx.Err() != nil {
			return r, ctx.Err()
		}
		return r, fmt.Errorf("read /api/chat: %w", err)
	}
	// Ollama ends a stream without a final line when it aborts a reply (for
	// example after 30 repeats of one token).
	return r, errors.New("/api/chat stream ended without its final (done) line")
}

func (s *ollamaSession) Close() error { return nil }
