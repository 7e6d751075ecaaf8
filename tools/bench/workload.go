package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/llm"
)

// Conversation material. Every session of a run has its own character, so
// no two sessions (in one workload or across workloads) send the same prompt
// and no reply comes from another session's cached prompt; turns are short
// user prompts as in a chat.
var (
	characters  = []string{"Lily", "Tom", "Sam", "Mia", "Ben", "Anna", "Max", "Lucy"}
	turnPrompts = []string{
		"Tell me a story about %s and a red ball.",
		"What did %s do next?",
		"Who did %s meet in the park?",
		"Why was %s happy?",
		"What did %s eat for lunch?",
		"Where did %s go after that?",
		"What did %s say to mom?",
		"How did the day end for %s?",
		"Tell me more about the friend of %s.",
		"What did %s learn that day?",
	}
	streamPrompt = "Once upon a time, there was a little girl named %s. Tell me her story."
)

// character is the name of the n-th session of a run.
func character(n int) string {
	name := characters[n%len(characters)]
	if n >= len(characters) {
		name = fmt.Sprintf("%s %d", name, n/len(characters)+1)
	}
	return name
}

// promptFor is the prompt of a turn of the n-th session of a run.
func promptFor(n, turn int) string {
	return fmt.Sprintf(turnPrompts[turn%len(turnPrompts)], character(n))
}

// streamResult is the single-stream workload: one session, one long reply,
// repeated on fresh sessions.
type streamResult struct {
	Runs []turnResult `json:"runs"`
	Err  string       `json:"error,omitempty"`
}

// concResult is the conversation workload: sessions at once, each sending
// its turns one after another.
type concResult struct {
	Sessions int            `json:"sessions"`
	Turns    [][]turnResult `json:"turns"` // [session][turn]
	Wall     time.Duration  `json:"wall_ns"`
	// Walls is each round's wall time in a -paired run, whose rounds'
	// sessions follow one another in Turns (Sessions per round).
	Walls []time.Duration `json:"round_walls_ns,omitempty"`
	// RoundErrors is how many of Errors each round of a -paired run had: a
	// round with errors is left out of the pairs table.
	RoundErrors []int    `json:"round_errors,omitempty"`
	Errors      []string `json:"errors,omitempty"`
}

// warmup sends one short turn so that model loading (Ollama loads on the
// first request) and first-touch costs stay out of the measurements.
func warmup(ctx context.Context, tgt target, seed int64) error {
	s, err := tgt.Open(ctx)
	if err != nil {
		return err
	}
	defer s.Close()
	_, err = s.Turn(ctx, "Hello.", sampling{maxTokens: 4, seed: seed})
	return err
}

// runStream runs the single-stream workload repeats times, each on a fresh
// session with its own prompt.
func runStream(ctx context.Context, tgt target, tokens, repeats int, seed int64) streamResult {
	var res streamResult
	for i := range repeats {
		r, err := streamOnce(ctx, tgt, fmt.Sprintf(streamPrompt, character(i)), tokens, seed)
		if err != nil {
			res.Err = err.Error()
			return res
		}
		res.Runs = append(res.Runs, r)
	}
	return res
}

// streamOnce is one run of the single-stream workload: prompt on a fresh
// session (a raw prompt where the target takes one).
func streamOnce(ctx context.Context, tgt target, prompt string, tokens int, seed int64) (turnResult, error) {
	sp := sampling{maxTokens: tokens, seed: seed}
	if rp, ok := tgt.(rawPrompter); ok {
		return rp.RawTurn(ctx, prompt, sp)
	}
	s, err := tgt.Open(ctx)
	if err != nil {
		return turnResult{}, err
	}
	defer s.Close()
	return s.Turn(ctx, prompt, sp)
}

// runConversations opens n sessions, then lets all of them run their turns
// at once; every session sends its next prompt as soon as its reply ends.
// The wall time runs from the release of the sessions to the last reply.
// first is the run-wide number of the first session (see character).
func runConversations(ctx context.Context, tgt target, first, n, turns, tokens int, seed int64) concResult {
	res := concResult{Sessions: n, Turns: make([][]turnResult, n)}
	sessions := make([]session, 0, n)
	defer func() {
		for _, s := range sessions {
			s.Close()
		}
	}()
	for range n {
		s, err := tgt.Open(ctx)
		if err != nil {
			res.Errors = append(res.Errors, fmt.Sprintf("open session: %v", err))
			return res
		}
		sessions = append(sessions, s)
	}

	var (
		wg   sync.WaitGroup
		mu   sync.Mutex // guards res.Errors
		gate = make(chan struct{})
	)
	for i, s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			for turn := range turns {
				r, err := s.Turn(ctx, promptFor(first+i, turn), sampling{maxTokens: tokens, seed: seed})
				if err != nil {
					mu.Lock()
					res.Errors = append(res.Errors, fmt.Sprintf("session %d turn %d: %v", i, turn+1, err))
					mu.Unlock()
					return
				}
				r.Turn = turn
				res.Turns[i] = append(res.Turns[i], r) // only this goroutine touches res.Turns[i]
			}
		}()
	}
	start := time.Now()
	close(gate)
	wg.Wait()
	res.Wall = time.Since(start)
	return res
}

// rawResult is the in-process decode rate: the llm package, no server.
type rawResult struct {
	Engine string           `json:"engine"`
	Info   parley.ModelInfo `json:"model"`
	Runs   []turnResult     `json:"runs"`
	Err    string           `json:"error,omitempty"`
}

// runRaw opens the model with the llm package (one slot, the same context
// and threads as the servers) and greedily decodes tokens from the stream
// workload's prompt, rendered as the plain transcript renders it, repeats
// times. This is the limit a server's single stream can approach.
func runRaw(ctx context.Context, path, engine, libDir string, ctxLen, threads int, flashAttn string, gpuLayers, tokens, repeats int, seed int64) rawResult {
	l, res := openRaw(path, engine, libDir, ctxLen, threads, flashAttn, gpuLayers, tokens, seed)
	if l == nil {
		return res
	}
	defer l.eng.Close()
	for range repeats {
		r, err := l.once(ctx, 0)
		if err != nil {
			res.Err = err.Error()
			return res
		}
		res.Runs = append(res.Runs, r)
	}
	return res
}

// rawLoop is an engine opened for the raw decode.
type rawLoop struct {
	eng    *llm.Engine
	params parley.Params
}

// openRaw opens the raw decode's engine; nil and the error in the result
// when it cannot. The caller closes l.eng.
func openRaw(path, engine, libDir string, ctxLen, threads int, flashAttn string, gpuLayers, tokens int, seed int64) (*rawLoop, rawResult) {
	res := rawResult{Engine: engine}
	eng, err := llm.Open(llm.Config{Path: path, Engine: engine, LibDir: libDir, ContextLength: ctxLen, Parallel: 1, Threads: threads, FlashAttention: flashAttn, GPULayers: gpuLayers,
		Progress: func(float32) {}}) // without a callback llama.cpp prints progress dots
	if err != nil {
		res.Err = err.Error()
		return nil, res
	}
	res.Info = eng.Info()
	params := parley.DefaultParams()
	params.MaxTokens, params.Temperature, params.RepeatPenalty, params.Seed = tokens, 0, 1, seed
	return &rawLoop{eng: eng, params: params}, res
}

// warm decodes a few tokens: the first decode allocates the compute buffers.
func (l *rawLoop) warm(ctx context.Context) error {
	prompt, err := l.eng.Tokenize("User: Hello.\n\nAssistant:")
	if err != nil {
		return err
	}
	p := l.params
	p.MaxTokens = 4
	_, err = rawOnce(ctx, l.eng, prompt, p)
	return err
}

// once decodes the stream workload's n-th prompt (the one of character(n)).
func (l *rawLoop) once(ctx context.Context, n int) (turnResult, error) {
	prompt, err := l.eng.Tokenize("User: " + fmt.Sprintf(streamPrompt, character(n)) + "\n\nAssistant:")
	if err != nil {
		return turnResult{}, err
	}
	return rawOnce(ctx, l.eng, prompt, l.params)
}

func rawOnce(ctx context.Context, eng *llm.Engine, prompt []int, params parley.Params) (turnResult, error) {
	var r turnResult
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the sequence if we return early
	start := time.Now()
	events, err := eng.Generate(ctx, parley.GenerateRequest{Tokens: prompt, Params: params})
	if err != nil {
		return r, err
	}
	var first time.Time
	for ev := range events {
		now := time.Now()
		if first.IsZero() {
			first = now
		}
		if !ev.Done {
			r.Messages++
			continue
		}
		if ev.Finish == parley.FinishError || ev.Finish == parley.FinishCancelled {
			return r, fmt.Errorf("raw decode ended with %s: %w", ev.Finish, errors.Join(ev.Err, ctx.Err()))
		}
		r.TTFT, r.Decode, r.Total = first.Sub(start), now.Sub(first), now.Sub(start)
		r.Tokens = ev.Usage.CompletionTokens
		r.PromptTokens = ev.Usage.PromptTokens
		r.CachedTokens = ev.Usage.CachedPromptTokens
		r.Finish = string(ev.Finish)
		r.ServerRate = ev.Timings.TokensPerSecond(ev.Usage.CompletionTokens)
		return r, nil
	}
	return r, errors.New("raw decode: stream closed without a final event")
}
