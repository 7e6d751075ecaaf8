package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/parley-chat/parley/tools/internal/harness"
)

// llamaServerName names llama-server's rows.
const llamaServerName = "llama-server"

// llamaModes are the speculative settings of llama-server that -llama-modes
// names, as its flags.
//
//   - off: none.
//   - ngram-simple: llama-server's lookup in the slot's own tokens (prompt and
//     reply) with Parley's lengths: the last 3 tokens (Parley tries 4 down to
//     2) and up to -draft-max tokens of what followed them.
//   - ngram-mod: llama-server's --spec-default, its own default n-gram
//     setting (a 24-token match, drafts of 48 to 64 tokens).
//   - draft: the draft model (-draft-model or -draft-synth), up to
//     -draft-max tokens a step, on the same threads.
func llamaModeArgs(mode string, c *config, threads int) ([]string, error) {
	switch mode {
	case "off":
		return nil, nil
	case "ngram-simple":
		return []string{"--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3",
			"--spec-ngram-simple-size-m", strconv.Itoa(c.draftMax)}, nil
	case "ngram-mod":
		return []string{"--spec-default"}, nil
	case "draft":
		if c.draftModel == "" {
			return nil, errors.New("llama-server mode draft needs -draft-model or -draft-synth")
		}
		th := strconv.Itoa(threads)
		return []string{"--spec-type", "draft-simple", "--spec-draft-model", c.draftModel,
			"--spec-draft-n-max", strconv.Itoa(c.draftMax), "--spec-draft-threads", th, "--spec-draft-threads-batch", th}, nil
	}
	return nil, fmt.Errorf("no llama-server mode %q (want off, ngram-simple, ngram-mod or draft)", mode)
}

// llamaServerArgs are llama-server's arguments for model at th threads and
// n conversations, as Parley's engine is opened in measure: n slots of 1024
// tokens each, flash attention off (Parley's default on a CPU).
func llamaServerArgs(model string, th, n int) []string {
	return []string{"--model", model, "--threads", strconv.Itoa(th), "--threads-batch", strconv.Itoa(th),
		"--parallel", strconv.Itoa(n), "--ctx-size", strconv.Itoa(1024 * n), "--flash-attn", "off", "--no-webui"}
}

// llamaRun runs prompts on a llama-server started for the run on model with
// mode's settings, th threads and n slots. A server a run: llama-server's
// ngram-mod keeps one n-gram pool for all its requests, so a second run of
// the same prompts would draft from the first run's replies, and a
// workload from another's; Parley's engines draft from each
// conversation's own history alone.
func (c *config) llamaRun(ctx context.Context, model, mode string, th, n int, prompts [][]int) (result, error) {
	srv, log, err := c.startLlamaServer(ctx, model, mode, th, n)
	if err != nil {
		return result{}, err
	}
	r, err := llamaGenerate(ctx, srv.URL(), prompts, c.tokens)
	srv.Stop(10 * time.Second)
	if err != nil {
		return r, fmt.Errorf("llama-server %s (log %s): %w", mode, log, err)
	}
	os.Remove(log) // a run that went well leaves no log behind
	return r, nil
}

// startLlamaServer starts c.llamaServer on model with mode's settings and
// returns it and the path of its log, a temporary file that an error names.
func (c *config) startLlamaServer(ctx context.Context, model, mode string, th, n int) (*harness.Server, string, error) {
	spec, err := llamaModeArgs(mode, c, th)
	if err != nil {
		return nil, "", err
	}
	log, err := os.CreateTemp("", "draftbench-llama-server-*.log")
	if err != nil {
		return nil, "", err
	}
	defer log.Close() // the child holds its own copy of the descriptor
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	s, err := harness.StartLlamaServer(sctx, c.llamaServer, append(llamaServerArgs(model, th, n), spec...), log)
	if err != nil {
		return nil, "", fmt.Errorf("llama-server %s (log %s): %w", mode, log.Name(), err)
	}
	return s, log.Name(), nil
}

// llamaGenerate runs every prompt at once on llama-server's /completion,
// greedy, maxTokens each, the prompt evaluated each time (no prompt cache),
// as generate does on Parley's engine: the same rate (the tokens after each
// reply's first over the time from the first reply's first token to the
// end), and the draft tokens and those that held from the replies'
// timings.
func llamaGenerate(ctx context.Context, base string, prompts [][]int, maxTokens int) (result, error) {
	// A connection per request: llama-server's HTTP library closes a
	// kept-alive connection after a streamed reply without saying so.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	r := result{ids: make([][]int, len(prompts))}
	errs := make([]error, len(prompts))
	var mu sync.Mutex
	var first time.Time
	var wg sync.WaitGroup
	for i, toks := range prompts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			onToken := func() {
				mu.Lock()
				if first.IsZero() {
					first = time.Now()
				}
				mu.Unlock()
			}
			ids, t, err := llamaStream(ctx, client, base, toks, maxTokens, onToken)
			mu.Lock()
			r.ids[i], errs[i] = ids, err
			r.drafted += int64(t.DraftN)
			r.held += int64(t.DraftAccepted)
			mu.Unlock()
		}()
	}
	wg.Wait()
	r.took = time.Since(first)
	for i := range prompts {
		r.tokens += max(0, len(r.ids[i])-1) // the first token's time is the prompt's
	}
	return r, errors.Join(errs...)
}

// llamaTimings is the part of a reply's timings that the table shows.
type llamaTimings struct {
	DraftN        int `json:"draft_n"`
	DraftAccepted int `json:"draft_n_accepted"`
}

// llamaStream streams one greedy completion of prompt (token ids, used as
// they are) and returns its token ids and timings; onToken is called as
// each chunk with tokens arrives.
func llamaStream(ctx context.Context, client *http.Client, base string, prompt []int, maxTokens int, onToken func()) ([]int, llamaTimings, error) {
	var t llamaTimings
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "n_predict": maxTokens, "temperature": 0, "seed": 1,
		"stream": true, "return_tokens": true, "cache_prompt": false})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/completion", bytes.NewReader(body))
	if err != nil {
		return nil, t, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, t, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return nil, t, fmt.Errorf("llama-server: %s: %s", resp.Status, b)
	}
	var ids []int
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 4<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var chunk struct {
			Tokens  []int         `json:"tokens"`
			Stop    bool          `json:"stop"`
			Timings *llamaTimings `json:"timings"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			return nil, t, fmt.Errorf("llama-server chunk %q: %w", data, err)
		}
		if len(chunk.Tokens) > 0 {
			onToken()
			ids = append(ids, chunk.Tokens...)
		}
		if chunk.Stop && chunk.Timings != nil {
			t = *chunk.Timings
		}
	}
	return ids, t, sc.Err()
}
