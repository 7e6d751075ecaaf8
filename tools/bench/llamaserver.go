package main

// The llama-server peer: llama.cpp's own server, built by
// scripts/build-llama-server.sh from a current llama.cpp, given the same
// model, threads, slots and per-slot context as Parley and driven over its
// OpenAI-compatible API the way its users drive it: the single stream by a
// streamed POST /v1/completions with the raw prompt, conversations by
// streamed POST /v1/chat/completions with the whole history each turn (its
// prompt cache finds the previous turns in the slot's KV cache).

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/parley-chat/parley/internal/proc"
)

// llamaServerName is the -servers name of the peer.
const llamaServerName = "llama-server"

// llamaPlainTemplate is a Jinja rendering of Parley's plain transcript (as
// ollamaPlainTemplate is Ollama's), given to llama-server with
// --chat-template-file so that /v1/chat/completions sees the same prompt text
// as Parley's WebSocket and Ollama's /api/chat. The benchmark's models have no
// chat template of their own; without this llama-server would fall back to
// ChatML. A test renders it with Parley's Jinja and, when llama-server is
// built, with llama-server's own (POST /apply-template).
const llamaPlainTemplate = `{%- for m in messages -%}
{%- if not loop.first %}{{ '\n\n' }}{% endif -%}
{%- if m.role == 'system' %}System: {% elif m.role == 'assistant' %}Assistant: {% else %}User: {% endif -%}
{{- m.content -}}
{%- endfor -%}
{%- if add_generation_prompt %}{{ '\n\nAssistant:' }}{% endif -%}`

// llamaServerArgs are llama-server's arguments for sc on addr. -c is the
// context of all slots together (llama-server splits it evenly among -np
// slots unless the KV cache is unified), so each slot gets sc.ctx tokens as
// a Parley session does. The rest is llama-server's defaults (batch 2048,
// micro-batch 512, continuous batching, prompt cache on, its host-memory
// prompt cache), which is what a user of it gets.
func llamaServerArgs(sc serverConfig, addr, templatePath string) ([]string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	args := []string{
		"--model", sc.model,
		"--host", host, "--port", port,
		"--threads", strconv.Itoa(sc.threads), "--threads-batch", strconv.Itoa(sc.threads),
		"--parallel", strconv.Itoa(sc.parallel),
		"--ctx-size", strconv.Itoa(sc.ctx * sc.parallel),
		"--flash-attn", sc.flashAttn,
		"--jinja", "--chat-template-file", templatePath,
		"--no-webui",
	}
	switch sc.gpuLayers {
	case "auto": // llama-server's default
	default:
		args = append(args, "--n-gpu-layers", sc.gpuLayers)
	}
	return args, nil
}

// startLlamaServer runs llama-server on a free loopback port and waits for
// /health (which answers 503 while the model loads).
func startLlamaServer(ctx context.Context, bin string, sc serverConfig) (*server, llamaServerTarget, error) {
	var t llamaServerTarget
	addr, err := proc.FreeAddr()
	if err != nil {
		return nil, t, err
	}
	tmpl := filepath.Join(sc.scratch, "llama-server-plain.jinja")
	if err := os.WriteFile(tmpl, []byte(llamaPlainTemplate), 0o644); err != nil {
		return nil, t, err
	}
	args, err := llamaServerArgs(sc, addr, tmpl)
	if err != nil {
		return nil, t, err
	}
	// LLAMA_ARG_* variables would change its settings behind the flags.
	env := filterEnv(os.Environ(), "LLAMA_ARG_", "LLAMA_API_KEY")
	p, err := startServer(llamaServerName, bin, args, env, filepath.Join(sc.scratch, "llama-server-"+filepath.Base(sc.model)+".log"))
	if err != nil {
		return nil, t, err
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := p.waitHTTP(wctx, "http://"+addr+"/health"); err != nil {
		p.stop(5 * time.Second)
		return nil, t, err
	}
	// A connection per request: llama-server's HTTP library closes a kept-alive
	// connection after a streamed reply without saying so, and a POST sent on
	// it meanwhile fails ("server closed idle connection"; Go retries only
	// idempotent requests). A loopback connect costs tens of microseconds.
	t = llamaServerTarget{addr: addr, stops: sc.stops, client: &http.Client{
		Transport: &http.Transport{DisableKeepAlives: true, DisableCompression: true},
	}}
	return p, t, nil
}

// llamaServerVersion is the first line of `llama-server --version`
// ("version: N (commit)").
func llamaServerVersion(ctx context.Context, bin string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "version:") {
			return strings.TrimSpace(strings.TrimPrefix(line, "version:"))
		}
	}
	return ""
}

// llamaServerTarget talks to a running llama-server.
type llamaServerTarget struct {
	addr   string
	stops  []string // Parley's plain-transcript stop strings, sent with every request
	client *http.Client
}

func (l llamaServerTarget) Name() string { return llamaServerName }
func (l llamaServerTarget) Close()       { l.client.CloseIdleConnections() }

func (l llamaServerTarget) Open(context.Context) (session, error) {
	return &llamaServerSession{t: l}, nil
}

// RawTurn streams one completion of prompt, rendered as the plain
// transcript renders a single user message, from POST /v1/completions: the
// single-stream workload's request (see rawPrompter).
func (l llamaServerTarget) RawTurn(ctx context.Context, prompt string, sp sampling) (turnResult, error) {
	body := l.request(sp)
	body["prompt"] = "User: " + prompt + "\n\nAssistant:"
	return l.stream(ctx, "/v1/completions", body)
}

// request is the body every request shares: greedy, penalties off, the
// seed, the stop strings, the prompt cache, and usage in the last chunk.
func (l llamaServerTarget) request(sp sampling) map[string]any {
	return map[string]any{
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
		"max_tokens":     sp.maxTokens,
		"temperature":    0,
		"repeat_penalty": 1,
		"seed":           sp.seed,
		"stop":           l.stops,
		"cache_prompt":   true,
	}
}

// llamaChunk is one "data:" event of llama-server's OpenAI-compatible
// stream, chat or completion: the text is in choices[0].delta.content or
// choices[0].text; the last chunks carry finish_reason, usage and
// llama-server's timings (prompt_n tokens evaluated, cache_n found cached).
type llamaChunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Timings *struct {
		PromptN            int     `json:"prompt_n"`
		CacheN             int     `json:"cache_n"`
		PredictedN         int     `json:"predicted_n"`
		PredictedPerSecond float64 `json:"predicted_per_second"`
		PromptMS           float64 `json:"prompt_ms"`
	} `json:"timings"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// stream posts body to path and reads the server-sent events to the end.
func (l llamaServerTarget) stream(ctx context.Context, path string, body map[string]any) (turnResult, error) {
	var r turnResult
	b, err := json.Marshal(body)
	if err != nil {
		return r, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+l.addr+path, bytes.NewReader(b))
	if err != nil {
		return r, err
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := l.client.Do(req)
	if err != nil {
		return r, fmt.Errorf("post %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var buf bytes.Buffer
		buf.ReadFrom(resp.Body)
		return r, fmt.Errorf("post %s: %s: %s", path, resp.Status, strings.TrimSpace(buf.String()))
	}
	var (
		first, last time.Time
		text        strings.Builder
		done        bool
	)
	r.CachedTokens = -1
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		now := time.Now()
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			if msg, isErr := strings.CutPrefix(sc.Text(), "error: "); isErr {
				return r, fmt.Errorf("%s: %s", path, msg)
			}
			continue // blank separator lines
		}
		if data == "[DONE]" {
			done = true
			break
		}
		var c llamaChunk
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			return r, fmt.Errorf("decode %s event %q: %w", path, data, err)
		}
		if c.Error != nil {
			return r, fmt.Errorf("llama-server error: %s", c.Error.Message)
		}
		for _, ch := range c.Choices {
			if piece := ch.Text + ch.Delta.Content; piece != "" {
				if first.IsZero() {
					first = now
				}
				r.Messages++
				text.WriteString(piece)
				last = now
			}
			if ch.FinishReason != nil {
				r.Finish = *ch.FinishReason
				last = now
			}
		}
		if c.Usage != nil {
			r.Tokens, r.PromptTokens = c.Usage.CompletionTokens, c.Usage.PromptTokens
		}
		if c.Timings != nil {
			r.CachedTokens = c.Timings.CacheN
			r.ServerRate = c.Timings.PredictedPerSecond
			r.ServerPromptMS = c.Timings.PromptMS
			if r.Tokens == 0 {
				r.Tokens, r.PromptTokens = c.Timings.PredictedN, c.Timings.PromptN+c.Timings.CacheN
			}
		}
	}
	if err := sc.Err(); err != nil {
		if ctx.Err() != nil {
			return r, ctx.Err()
		}
		return r, fmt.Errorf("read %s: %w", path, err)
	}
	if !done {
		return r, fmt.Errorf("%s: stream ended without [DONE]", path)
	}
	if first.IsZero() {
		return r, fmt.Errorf("%s: no text in the reply (finish %q)", path, r.Finish)
	}
	if last.IsZero() {
		last = first
	}
	// The reply ends at its last piece or finish_reason; the usage chunk and
	// [DONE] follow at once, as Parley's done message and Ollama's last line do.
	r.TTFT, r.Decode, r.Total = first.Sub(start), last.Sub(first), last.Sub(start)
	r.Text = text.String()
	return r, nil
}

// llamaServerSession is one conversation: the history, sent whole each
// turn to /v1/chat/completions.
type llamaServerSession struct {
	t       llamaServerTarget
	history []ollamaMessage // {role, content}: the same shape as OpenAI's messages
}

func (s *llamaServerSession) Turn(ctx context.Context, prompt string, sp sampling) (turnResult, error) {
	msgs := append(append([]ollamaMessage(nil), s.history...), ollamaMessage{Role: "user", Content: prompt})
	body := s.t.request(sp)
	body["messages"] = msgs
	r, err := s.t.stream(ctx, "/v1/chat/completions", body)
	if err != nil {
		return r, err
	}
	// The next turn carries this one, stripped as Parley's transcript stores it.
	s.history = append(msgs, ollamaMessage{Role: "assistant", Content: strings.TrimSpace(r.Text)})
	return r, nil
}

func (s *llamaServerSession) Close() error { return nil }

// rawPrompter is a target whose single-stream workload is a raw completion
// rather than a conversation's first turn (llama-server's /v1/completions).
type rawPrompter interface {
	RawTurn(ctx context.Context, prompt string, sp sampling) (turnResult, error)
}

// errNoLlamaServer explains how to build the peer.
var errNoLlamaServer = errors.New("build it with scripts/build-llama-server.sh (make bench does), or drop it with -servers")
