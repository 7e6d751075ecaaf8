// Command embedbench measures embeddings per second: short inputs (a
// sentence, about 10 tokens) and long ones (-long tokens, 512 by default, a
// retrieval chunk), in batches of -batch inputs per call from -clients
// clients at once. In-process through the llm engine by default; with -url
// it posts the same inputs to an OpenAI-compatible /v1/embeddings (Parley's
// or llama-server's, started on the same model and threads) instead, for
// the comparison. Each measurement is bounded: -n inputs, or -time, whichever
// ends first.
//
//	go run ./tools/mkgguf -arch bert -pooling mean -layers 12 -dim 384 -heads 12 -kv-heads 12 -ffn 1536 -ctx 512 \
//	    -o ~/.cache/parley/models/synthetic-bge-small-f16.gguf
//	go run ./tools/embedbench -model ~/.cache/parley/models/synthetic-bge-small-f16.gguf -threads 2
//	go run ./tools/embedbench -model ... -url http://127.0.0.1:8080   # llama-server --embeddings -m ... -t 2
//	go run ./tools/embedbench -model ... -url http://127.0.0.1:8080 -name bge -chat http://127.0.0.1:8080 -chat-model stories260K
//	    # Parley serving both (--model stories260K.gguf --models DIR): the chat stream's rate alone and beside each measurement
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/llm"
	"github.com/parley-chat/parley/tools/internal/harness"
)

func main() { harness.Main("embedbench", run) }

type config struct {
	cfg     llm.Config
	url     string
	model   string // the model name sent with -url
	long    int
	batch   int
	longN   int // -n for long inputs
	longB   int // -batch for long inputs
	clients int
	n       int
	limit   time.Duration
	key     string
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	var c config
	fs := flag.NewFlagSet("embedbench", flag.ContinueOnError)
	fs.StringVar(&c.cfg.Path, "model", "", "embedding model GGUF (a pooling type in its metadata)")
	fs.StringVar(&c.cfg.Engine, "engine", llm.EngineAuto, "engine: auto, embedded or current")
	fs.IntVar(&c.cfg.Threads, "threads", 2, "CPU threads")
	fs.IntVar(&c.cfg.BatchSize, "ubatch", 512, "tokens per micro-batch (the longest input)")
	fs.IntVar(&c.cfg.Parallel, "parallel", 4, "calls the engine holds at once")
	fs.IntVar(&c.cfg.CacheSlots, "seqs", 16, "inputs per batch at most (llama.cpp sequences)")
	fs.StringVar(&c.url, "url", "", "post to this server's /v1/embeddings instead of running the engine in-process")
	fs.StringVar(&c.model, "name", "", "model name to send with -url (default: the file's base name)")
	fs.IntVar(&c.long, "long", 512, "tokens of a long input")
	fs.IntVar(&c.batch, "batch", 16, "inputs per call")
	fs.IntVar(&c.clients, "clients", 2, "concurrent callers")
	fs.IntVar(&c.n, "n", 256, "short inputs per measurement at most")
	fs.IntVar(&c.longN, "long-n", 16, "long inputs per measurement at most")
	fs.IntVar(&c.longB, "long-batch", 2, "long inputs per call")
	fs.DurationVar(&c.limit, "time", 30*time.Second, "time per measurement at most")
	fs.StringVar(&c.key, "key", "", "API key for -url and -chat")
	var chat chatter
	fs.StringVar(&chat.url, "chat", "", "also stream chat replies from this server's /v1/chat/completions: its rate alone, then beside each measurement")
	fs.StringVar(&chat.model, "chat-model", "", "the chat model to name with -chat")
	fs.IntVar(&chat.tokens, "chat-tokens", 128, "tokens per chat reply with -chat")
	if err := fs.Parse(args); err != nil {
		return err
	}
	chat.key = c.key
	if c.cfg.Path == "" && c.url == "" {
		return errors.New("-model is required (and names the model for -url)")
	}
	var emb embedder
	if c.url != "" {
		emb = &remote{url: strings.TrimRight(c.url, "/") + "/v1/embeddings", model: c.model, key: c.key}
	} else {
		c.cfg.ContextLength = c.cfg.BatchSize
		e, err := llm.Open(c.cfg)
		if err != nil {
			return err
		}
		defer e.Close()
		info := e.EmbedInfo()
		if info.Pooling == "" {
			return fmt.Errorf("%s is not an embedding model", c.cfg.Path)
		}
		fmt.Fprintf(stdout, "model %s, engine %s, pooling %s, %d dimensions, threads %d, %d inputs per batch at most\n",
			e.Info().Name, e.EngineName(), info.Pooling, info.Dimensions, c.cfg.Threads, c.cfg.CacheSlots)
		emb = local{e}
		if c.long > info.MaxTokens {
			c.long = info.MaxTokens
		}
	}
	short := "The quick brown fox jumps over the lazy dog by the river."
	// A long input: words until the model counts c.long tokens (a sentence
	// about a token a word; the engine's tokenizer decides).
	long := strings.Repeat("Once upon a time there was a little girl who liked to play in the garden. ", c.long/8+1)
	longC := c
	longC.n, longC.batch = c.longN, c.longB
	if chat.url != "" {
		chat.url = strings.TrimRight(chat.url, "/") + "/v1/chat/completions"
		actx, cancel := context.WithTimeout(ctx, c.limit)
		alone, err := chat.rate(actx)
		cancel()
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "chat alone: %.1f tokens/s (replies of %d tokens)\n", alone, chat.tokens)
	}
	for _, tc := range []struct {
		name string
		text string
		c    config
	}{{"short", short, c}, {fmt.Sprintf("%d-token", c.long), long, longC}} {
		var r result
		run := func() (err error) {
			r, err = measure(ctx, emb, tc.text, tc.c)
			return err
		}
		var chatRate float64
		var err error
		if chat.url != "" {
			chatRate, err = chat.beside(ctx, run)
		} else {
			err = run()
		}
		if err != nil {
			return fmt.Errorf("%s: %w", tc.name, err)
		}
		fmt.Fprintf(stdout, "%-10s %6d inputs of %4d tokens in %6.2fs: %8.1f embeddings/s, %8.0f tokens/s",
			tc.name, r.inputs, r.tokens/max(r.inputs, 1), r.elapsed.Seconds(),
			float64(r.inputs)/r.elapsed.Seconds(), float64(r.tokens)/r.elapsed.Seconds())
		if chat.url != "" {
			fmt.Fprintf(stdout, "; chat beside: %.1f tokens/s", chatRate)
		}
		fmt.Fprintln(stdout)
	}
	return nil
}

// embedder embeds n copies of a text (cut to at most maxTokens tokens) and
// returns the tokens evaluated.
type embedder interface {
	embed(ctx context.Context, text string, n, maxTokens int) (int, error)
}

type local struct{ e *llm.Engine }

func (l local) embed(ctx context.Context, text string, n, maxTokens int) (int, error) {
	toks, err := l.e.EmbedTokenize(ctx, text)
	if err != nil {
		return 0, err
	}
	if len(toks) > maxTokens {
		toks = toks[:maxTokens]
	}
	inputs := make([][]int, n)
	for i := range inputs {
		inputs[i] = toks
	}
	_, err = l.e.Embed(ctx, parley.ClientFrom(ctx), inputs)
	return n * len(toks), err
}

type remote struct {
	url, model, key string
	client          http.Client
	mu              sync.Mutex
	fitted          map[string]string // a text the server refused as too long: its cut that fits; guarded by mu
}

func (r *remote) embed(ctx context.Context, text string, n, maxTokens int) (int, error) {
	// /v1/embeddings truncates nothing: cut the text to about maxTokens
	// words' worth, and by a quarter more while the server refuses it as
	// too long (a word is more than one token in a small vocabulary); the
	// text that fits is kept for the next calls.
	words := strings.Fields(text)
	if len(words) > maxTokens-2 {
		text = strings.Join(words[:maxTokens-2], " ")
	}
	orig := text
	r.mu.Lock()
	if t, ok := r.fitted[orig]; ok {
		text = t
	}
	r.mu.Unlock()
	for range 8 {
		tokens, err := r.post(ctx, text, n)
		var long *tooLong
		if !errors.As(err, &long) {
			return tokens, err
		}
		words := strings.Fields(text)
		cut := strings.Join(words[:len(words)*3/4], " ")
		r.mu.Lock()
		if r.fitted == nil {
			r.fitted = map[string]string{}
		}
		r.fitted[orig], text = cut, cut
		r.mu.Unlock()
	}
	return 0, fmt.Errorf("the server refuses the input as too long even cut to %d words", len(strings.Fields(text)))
}

// tooLong is a 400 that says the input is over the model's limit.
type tooLong struct{ msg string }

func (e *tooLong) Error() string { return e.msg }

func (r *remote) post(ctx context.Context, text string, n int) (int, error) {
	inputs := make([]string, n)
	for i := range inputs {
		inputs[i] = text
	}
	body, _ := json.Marshal(map[string]any{"model": r.model, "input": inputs})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if r.key != "" {
		req.Header.Set("Authorization", "Bearer "+r.key)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var out struct {
		Data  []json.RawMessage `json:"data"`
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusBadRequest && bytes.Contains(b, []byte("context_length_exceeded")) ||
		resp.StatusCode == http.StatusBadRequest && bytes.Contains(b, []byte("too large")) {
		return 0, &tooLong{string(b)}
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: %s", resp.Status, b)
	}
	if err := json.Unmarshal(b, &out); err != nil || len(out.Data) != n {
		return 0, fmt.Errorf("reply of %d embeddings for %d inputs: %v", len(out.Data), n, err)
	}
	return out.Usage.PromptTokens, nil
}

type result struct {
	inputs, tokens int
	elapsed        time.Duration
}

// measure runs c.clients callers, each sending calls of c.batch copies of
// text, until c.n inputs are done or c.limit passes; one warm-up call first.
func measure(ctx context.Context, emb embedder, text string, c config) (result, error) {
	if _, err := emb.embed(ctx, text, 1, c.long); err != nil {
		return result{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.limit)
	defer cancel()
	var (
		inputs, tokens atomic.Int64
		claimed        atomic.Int64
		wg             sync.WaitGroup
		firstErr       error
		once           sync.Once
	)
	start := time.Now()
	for i := range c.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx := parley.WithClient(ctx, fmt.Sprintf("bench-%d", i))
			for ctx.Err() == nil {
				n := int(min(int64(c.batch), int64(c.n)-claimed.Add(int64(c.batch))+int64(c.batch)))
				if n <= 0 {
					return
				}
				t, err := emb.embed(cctx, text, n, c.long)
				if err != nil {
					if ctx.Err() == nil {
						once.Do(func() { firstErr = err })
					}
					return
				}
				inputs.Add(int64(n))
				tokens.Add(int64(t))
			}
		}()
	}
	wg.Wait()
	return result{inputs: int(inputs.Load()), tokens: int(tokens.Load()), elapsed: time.Since(start)}, firstErr
}
