package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// chatter streams chat replies from an OpenAI-compatible
// /v1/chat/completions (-chat) and counts their tokens, to show what
// embeddings beside it cost a chat stream: its rate alone, then while each
// measurement runs.
type chatter struct {
	url, model, key string
	tokens          int // max_tokens of one reply
	client          http.Client
}

// reply streams one greedy reply and returns its content chunks (a token
// each, on Parley and llama-server).
func (c *chatter) reply(ctx context.Context) (int, error) {
	body, _ := json.Marshal(map[string]any{"model": c.model, "stream": true, "max_tokens": c.tokens, "temperature": 0,
		"messages": []map[string]string{{"role": "user", "content": "Once upon a time"}}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("chat: %s", resp.Status)
	}
	n := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(data), &chunk) == nil && len(chunk.Choices) > 0 && chunk.Choices[0].Delta.Content != "" {
			n++
		}
	}
	return n, sc.Err()
}

// rate streams replies one after another until ctx ends (at least one
// whole reply) and returns the tokens per second of the replies that ended.
func (c *chatter) rate(ctx context.Context) (float64, error) {
	var tokens int
	var busy time.Duration
	for {
		start := time.Now()
		n, err := c.reply(context.WithoutCancel(ctx))
		if err != nil {
			return 0, err
		}
		tokens, busy = tokens+n, busy+time.Since(start)
		if ctx.Err() != nil {
			return float64(tokens) / busy.Seconds(), nil
		}
	}
}

// beside runs f while streaming chat replies and returns f's error and the
// chat's rate meanwhile.
func (c *chatter) beside(ctx context.Context, f func() error) (float64, error) {
	fctx, done := context.WithCancel(ctx)
	type res struct {
		rate float64
		err  error
	}
	ch := make(chan res, 1)
	go func() {
		r, err := c.rate(fctx)
		ch <- res{r, err}
	}()
	err := f()
	done()
	r := <-ch
	if err == nil {
		err = r.err
	}
	return r.rate, err
}
