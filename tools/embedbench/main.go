// Command embedbench measures embeddings per second: short inputs (a
// sentence, about 10 tokens) and long ones (-long tokens, 512 by default, a
// retrieval chunk), in batches of -batch inputs per call from -clients
// clients at once. In-process through the llm engine by default; with -url
// it posts the same inputs to an OpenAI-compatible /v1/embeddings (Parley's
// or llama-server's, started on the same model and threads) instead, for
// the comparison. A reranker (-model pooling with rank, or -rerank with
// -url) is measured the same way: a query and -batch documents per call,
// in-process or through /v1/rerank. Each measurement is bounded: -n
// inputs, or -time, whichever ends first.
//
// With -llama-server BIN the tool also starts llama.cpp's llama-server on
// the same model (--embedding, or --reranking for a reranker) with the same
// threads, batch and sequences, on a loopback port, first checks that its
// vectors (or scores) equal those of the in-process engine (or -url) on the
// same inputs, then measures it beside each of Parley's measurements, same
// request shape, and prints the ratio of the two from the same run.
//
//	go run ./tools/mkgguf -arch bert -pooling mean -layers 12 -dim 384 -heads 12 -kv-heads 12 -ffn 1536 -ctx 512 \
//	    -o ~/.cache/parley/models/synthetic-bge-small-f16.gguf
//	go run ./tools/embedbench -model ~/.cache/parley/models/synthetic-bge-small-f16.gguf -threads 2
//	go run ./tools/embedbench -model ... -llama-server ~/.cache/parley/llama-server/bin/llama-server
//	go run ./tools/embedbench -model ... -url http://127.0.0.1:8080   # llama-server --embeddings -m ... -t 2
//	go run ./tools/embedbench -model ... -url http://127.0.0.1:8080 -name bge -chat http://127.0.0.1:8080 -chat-model stories260K
//	    # Parley serving both (--model stories260K.gguf --models DIR): the chat stream's rate alone and beside each measurement
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parley-chat/parley/llm"
	"github.com/parley-chat/parley/tools/internal/harness"
)

func main() { harness.Main("embedbench", run) }

type config struct {
	cfg         llm.Config
	url         string
	model       string // the model name sent with -url
	rerank      bool   // -url serves a reranker: post to /v1/rerank
	llamaServer string // a llama-server binary to measure beside Parley
	rounds      int    // measurements of each workload (with llama-server: pairs, in alternating order)
	long        int
	batch       int
	longN       int // -n for long inputs
	longB       int // -batch for long inputs
	clients     int
	n           int
	limit       time.Duration
	key         string
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
	fs.BoolVar(&c.rerank, "rerank", false, "with -url: the model is a reranker; measure /v1/rerank")
	fs.StringVar(&c.llamaServer, "llama-server", "", "also start this llama-server on -model (same threads, batch and sequences), check its outputs against Parley's and measure it beside each measurement")
	fs.IntVar(&c.long, "long", 512, "tokens of a long input")
	fs.IntVar(&c.batch, "batch", 16, "inputs per call")
	fs.IntVar(&c.clients, "clients", 2, "concurrent callers")
	fs.IntVar(&c.n, "n", 256, "short inputs per measurement at most")
	fs.IntVar(&c.longN, "long-n", 16, "long inputs per measurement at most")
	fs.IntVar(&c.longB, "long-batch", 2, "long inputs per call")
	fs.DurationVar(&c.limit, "time", 30*time.Second, "time per measurement at most")
	fs.IntVar(&c.rounds, "rounds", 1, "measurements of each workload; with -llama-server, pairs in alternating order, and the median ratio")
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
	if c.llamaServer != "" && c.cfg.Path == "" {
		return errors.New("-llama-server needs -model: the file llama-server loads")
	}
	if c.model == "" && c.cfg.Path != "" {
		c.model = strings.TrimSuffix(filepath.Base(c.cfg.Path), ".gguf")
	}
	short := "The quick brown fox jumps over the lazy dog by the river."
	// A long input: words until the model counts c.long tokens (a sentence
	// about a token a word; the engine's tokenizer decides).
	long := strings.Repeat("Once upon a time there was a little girl who liked to play in the garden. ", c.long/8+1)
	var emb embedder
	if c.url != "" {
		emb = newRemote(c.url, c.model, c.key, c.rerank, &http.Client{})
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
		c.rerank = info.Pooling == llm.PoolingRank
		emb = local{e: e, rerank: c.rerank}
		if c.long > info.MaxTokens {
			c.long = info.MaxTokens
		}
	}
	// The long input is cut by words to what the model counts as at most
	// c.long tokens (and a server takes), so that every server is sent the
	// same text.
	var err error
	if long, err = fitWords(long, c.long, func(s string) (int, error) { return emb.count(ctx, s) }); err != nil {
		return err
	}
	if long == "" {
		return fmt.Errorf("not one word of the long input fits in %d tokens", c.long)
	}
	var peer embedder
	if c.llamaServer != "" {
		srv, err := startLlamaServer(ctx, c, stdout)
		if err != nil {
			return err
		}
		defer srv.Stop(10 * time.Second)
		// A connection per request: llama-server's HTTP library may close a
		// kept-alive connection between requests without saying so.
		peer = newRemote(srv.URL(), c.model, "", c.rerank, &http.Client{Transport: &http.Transport{DisableKeepAlives: true}})
		if _, err := compare(ctx, stdout, emb, peer, []string{short, long, "hello world", "a"}); err != nil {
			return err
		}
	}
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
	unit := "embeddings/s"
	if c.rerank {
		unit = "documents/s"
	}
	for _, tc := range []struct {
		name string
		text string
		c    config
	}{{"short", short, c}, {fmt.Sprintf("%d-token", c.long), long, longC}} {
		var ratios []float64
		for round := range max(1, c.rounds) {
			var r, pr result
			parley := func() (err error) {
				run := func() (err error) {
					r, err = measure(ctx, emb, tc.text, tc.c)
					return err
				}
				var chatRate float64
				if chat.url != "" {
					chatRate, err = chat.beside(ctx, run)
				} else {
					err = run()
				}
				if err != nil {
					return fmt.Errorf("%s: %w", tc.name, err)
				}
				name := "parley"
				if c.url != "" && c.llamaServer == "" {
					name = "server"
				}
				printRow(stdout, tc.name, name, unit, r)
				if chat.url != "" {
					fmt.Fprintf(stdout, "; chat beside: %.1f tokens/s", chatRate)
				}
				fmt.Fprintln(stdout)
				return nil
			}
			llamaServer := func() (err error) {
				if pr, err = measure(ctx, peer, tc.text, tc.c); err != nil {
					return fmt.Errorf("%s on llama-server: %w", tc.name, err)
				}
				printRow(stdout, tc.name, "llama-server", unit, pr)
				fmt.Fprintln(stdout)
				return nil
			}
			// Parley first in even rounds, llama-server first in odd ones: a
			// load that drifts during the run weighs on both alike.
			order := []func() error{parley, llamaServer}
			if peer == nil {
				order = order[:1]
			} else if round%2 == 1 {
				order[0], order[1] = order[1], order[0]
			}
			for _, f := range order {
				if err := f(); err != nil {
					return err
				}
			}
			if peer != nil {
				ratios = append(ratios, r.rate()/pr.rate())
				fmt.Fprintf(stdout, "%-10s parley/llama-server: %.2fx\n", tc.name, ratios[len(ratios)-1])
			}
		}
		if len(ratios) > 1 {
			slices.Sort(ratios)
			fmt.Fprintf(stdout, "%-10s parley/llama-server over %d rounds: median %.2fx, %.2f-%.2fx\n", tc.name, len(ratios),
				median(ratios), ratios[0], ratios[len(ratios)-1])
		}
	}
	return nil
}

// median is the middle of sorted values (the mean of the two middle ones
// for an even number).
func median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

// rerankQuery is the query a reranker's documents are scored against.
const rerankQuery = "What did the girl like to play?"

// embedder embeds n copies of a text, or with a reranker scores n copies of
// it as documents for rerankQuery, and returns the tokens evaluated. count
// is the tokens of one text as the model counts them (a server: a text it
// refuses as too long counts tooManyTokens). outputs returns what it
// computes for each of texts: the Euclidean-normalized embedding (as
// /v1/embeddings answers it), or a reranker's score as a vector of one.
type embedder interface {
	embed(ctx context.Context, client, text string, n int) (int, error)
	count(ctx context.Context, text string) (int, error)
	outputs(ctx context.Context, texts []string) ([][]float32, error)
}

// local runs the engine in-process.
type local struct {
	e      *llm.Engine
	rerank bool
}

// tokens is text's input: an embedding input, or a document for rerankQuery.
func (l local) tokens(ctx context.Context, text string) ([]int, error) {
	if l.rerank {
		return l.e.RerankTokens(ctx, rerankQuery, text)
	}
	return l.e.EmbedTokenize(ctx, text)
}

func (l local) count(ctx context.Context, text string) (int, error) {
	toks, err := l.tokens(ctx, text)
	return len(toks), err
}

func (l local) embed(ctx context.Context, client, text string, n int) (int, error) {
	toks, err := l.tokens(ctx, text)
	if err != nil {
		return 0, err
	}
	inputs := make([][]int, n)
	for i := range inputs {
		inputs[i] = toks
	}
	_, err = l.e.Embed(ctx, client, inputs)
	return n * len(toks), err
}

func (l local) outputs(ctx context.Context, texts []string) ([][]float32, error) {
	inputs := make([][]int, len(texts))
	for i, t := range texts {
		toks, err := l.tokens(ctx, t)
		if err != nil {
			return nil, err
		}
		inputs[i] = toks
	}
	out, err := l.e.Embed(ctx, "", inputs)
	if err != nil {
		return nil, err
	}
	for i, v := range out {
		if l.rerank {
			out[i] = v[:1]
		} else {
			out[i] = normalize(v)
		}
	}
	return out, nil
}

// normalize scales v to unit length, as /v1/embeddings answers vectors.
func normalize(v []float32) []float32 {
	var sum float64
	for _, x := range v {
		sum += float64(x) * float64(x)
	}
	if sum == 0 {
		return v
	}
	norm := math.Sqrt(sum)
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(float64(x) / norm)
	}
	return out
}

// fitWords returns the longest prefix of text's words that count (the
// model's tokenizer) says is at most maxTokens tokens: text itself when it
// fits, no words when not even one does.
func fitWords(text string, maxTokens int, count func(string) (int, error)) (string, error) {
	n, err := count(text)
	if err != nil || n <= maxTokens {
		return text, err
	}
	words := strings.Fields(text)
	// The first lo words fit and the first hi+1 do not; a token count grows
	// with the words.
	lo, hi := 0, len(words)-1
	for lo < hi {
		mid := (lo + hi + 1) / 2
		n, err := count(strings.Join(words[:mid], " "))
		if err != nil {
			return "", err
		}
		if n <= maxTokens {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return strings.Join(words[:lo], " "), nil
}

type result struct {
	inputs, tokens int
	elapsed        time.Duration
}

func (r result) rate() float64      { return float64(r.inputs) / r.elapsed.Seconds() }
func (r result) tokenRate() float64 { return float64(r.tokens) / r.elapsed.Seconds() }

// printRow prints a measurement, without a newline: the workload, who was
// measured, and the rates.
func printRow(w io.Writer, workload, who, unit string, r result) {
	fmt.Fprintf(w, "%-10s %-12s %6d inputs of %4d tokens in %6.2fs: %8.1f %s, %8.0f tokens/s",
		workload, who, r.inputs, r.tokens/max(r.inputs, 1), r.elapsed.Seconds(), r.rate(), unit, r.tokenRate())
}

// measure runs c.clients callers, each sending calls of c.batch copies of
// text, until c.n inputs are done or c.limit passes; one warm-up call first.
func measure(ctx context.Context, emb embedder, text string, c config) (result, error) {
	if _, err := emb.embed(ctx, "", text, 1); err != nil {
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
			client := fmt.Sprintf("bench-%d", i)
			for ctx.Err() == nil {
				n := int(min(int64(c.batch), int64(c.n)-claimed.Add(int64(c.batch))+int64(c.batch)))
				if n <= 0 {
					return
				}
				t, err := emb.embed(ctx, client, text, n)
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
