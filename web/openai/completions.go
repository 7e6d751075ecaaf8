package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// OpenAI's legacy completions: POST /v1/completions, a raw prompt continued
// without a chat template (what Hugging Face's JS client posts for
// textGeneration and textGenerationStream). Streamed as the chat endpoint's
// server-sent events (streamOpenAI) with "text_completion" chunks, or one
// response.
//
// Supported: prompt (a string, or an array holding one string), max_tokens,
// temperature, top_p, presence/frequency_penalty, seed, stop, n = 1,
// best_of = 1, logprobs (0..5: the sampled token's logprob; the engine
// reports no other candidates), echo false, stream_options.include_usage,
// and Parley's own sampling fields. Token-array prompts, several prompts,
// suffix and logit_bias are refused rather than ignored.

// maxLegacyLogprobs is the largest logprobs the legacy API allows (OpenAI's limit).
const maxLegacyLogprobs = 5

type completionRequest struct {
	openAIRequest
	Prompt   json.RawMessage `json:"prompt"`
	BestOf   *int            `json:"best_of"`
	Logprobs *int            `json:"logprobs"`
	Echo     bool            `json:"echo"`
	Suffix   *string         `json:"suffix"`
}

// completionLogprobs is the legacy logprobs object.
type completionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float64            `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

type completionChoice struct {
	Text         string              `json:"text"`
	Index        int                 `json:"index"`
	Logprobs     *completionLogprobs `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
}

type textCompletion struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"` // "text_completion"
	Created           int64              `json:"created"`
	Model             string             `json:"model"`
	SystemFingerprint string             `json:"system_fingerprint"`
	Choices           []completionChoice `json:"choices"`
	Usage             json.RawMessage    `json:"usage,omitempty"`
	Timings           *apicore.Timings   `json:"timings,omitempty"`
}

type completionCall struct {
	facts        apicore.Facts
	prompt       string
	params       parley.Params
	stream       bool
	includeUsage bool
	logprobs     int // -1: none asked for
}

func (s *API) parseCompletion(c echo.Context) (*completionCall, error) {
	var req completionRequest
	facts, err := s.decodeRequest(c, &req, &req.openAIRequest)
	if err != nil {
		return nil, err
	}
	call := &completionCall{facts: facts, stream: req.Stream, logprobs: -1}
	raw := bytes.TrimSpace(req.Prompt)
	switch {
	case !apicore.IsSet(raw):
		return nil, parley.FieldErrorf("prompt", "is required")
	case raw[0] == '"':
		if err := json.Unmarshal(raw, &call.prompt); err != nil {
			return nil, parley.FieldErrorf("prompt", "invalid string: %v", err)
		}
	default:
		var prompts []string
		if err := json.Unmarshal(raw, &prompts); err != nil {
			return nil, parley.FieldErrorf("prompt", "must be a string or an array of one string (token arrays are not supported)")
		}
		if len(prompts) != 1 {
			return nil, parley.FieldErrorf("prompt", "only one prompt per request is supported, got %d", len(prompts))
		}
		call.prompt = prompts[0]
	}
	if call.prompt == "" {
		return nil, parley.FieldErrorf("prompt", "must not be empty")
	}
	if err := req.unsupported(); err != nil {
		return nil, err
	}
	if req.BestOf != nil && *req.BestOf != 1 {
		return nil, parley.FieldErrorf("best_of", "only 1 is supported, got %d", *req.BestOf)
	}
	if req.Echo {
		return nil, parley.FieldErrorf("echo", "is not supported")
	}
	if req.Suffix != nil && *req.Suffix != "" {
		return nil, parley.FieldErrorf("suffix", "is not supported")
	}
	if req.Logprobs != nil {
		if *req.Logprobs < 0 || *req.Logprobs > maxLegacyLogprobs {
			return nil, parley.FieldErrorf("logprobs", "must be between 0 and %d, got %d", maxLegacyLogprobs, *req.Logprobs)
		}
		call.logprobs = *req.Logprobs
	}
	call.includeUsage = req.includeUsage()
	p, err := s.core.ResolveParams(&req.ParamsPatch)
	if err != nil {
		return nil, err
	}
	apicore.ResolveSeed(&p)
	p.SkipLogprobs = call.logprobs < 0
	call.params = p
	return call, nil
}

// legacyLogprobs converts logprob entries to the legacy form; offset is the
// text offset of the first token.
func legacyLogprobs(lps []tokenLogprob, offset int, top bool) *completionLogprobs {
	out := &completionLogprobs{Tokens: []string{}, TokenLogprobs: []float64{}, TopLogprobs: []map[string]float64{}, TextOffset: []int{}}
	for _, lp := range lps {
		out.Tokens = append(out.Tokens, lp.Token)
		out.TokenLogprobs = append(out.TokenLogprobs, lp.Logprob)
		if top {
			out.TopLogprobs = append(out.TopLogprobs, map[string]float64{lp.Token: lp.Logprob})
		}
		out.TextOffset = append(out.TextOffset, offset)
		offset += len(lp.Token)
	}
	if !top {
		out.TopLogprobs = nil
	}
	return out
}

// Completions is POST /v1/completions.
func (s *API) Completions(c echo.Context) error {
	cc, err := s.parseCompletion(c)
	if err != nil {
		return err
	}
	route := "completions"
	if cc.stream {
		route = "completions-stream"
	}
	call, err := s.core.StartCompletion(c, cc.facts, route, cc.prompt, cc.params)
	if err != nil {
		return err
	}
	call.TopLogprobs = max(cc.logprobs, 0)
	id := fmt.Sprintf("cmpl-%016x%08x", rand.Uint64(), rand.Uint32())
	created, model := time.Now().Unix(), s.core.ModelName(cc.facts.Model)
	top := cc.logprobs > 0
	if !cc.stream {
		toks, ev := call.Collect()
		if rerr := apicore.ReplyError(ev); rerr != nil {
			return rerr
		}
		finish := openAIFinish(ev.Finish)
		choice := completionChoice{Text: call.Rep.Text(), FinishReason: &finish}
		if cc.logprobs >= 0 {
			lps := make([]tokenLogprob, 0, len(toks))
			for _, t := range toks {
				lps = append(lps, tokenLogprobOf(t, call.TopLogprobs))
			}
			choice.Logprobs = legacyLogprobs(lps, 0, top)
		}
		u, err := json.Marshal(newOpenAIUsage(ev.Usage))
		if err != nil {
			return fmt.Errorf("encode usage: %w", err)
		}
		timings := apicore.NewTimings(ev.Timings, ev.Usage.CompletionTokens)
		return c.JSON(http.StatusOK, textCompletion{
			ID: id, Object: "text_completion", Created: created, Model: model, SystemFingerprint: systemFingerprint,
			Choices: []completionChoice{choice}, Usage: u, Timings: &timings,
		})
	}

	chunk := func(choices []completionChoice) textCompletion {
		ch := textCompletion{ID: id, Object: "text_completion", Created: created, Model: model,
			SystemFingerprint: systemFingerprint, Choices: choices}
		if cc.includeUsage {
			ch.Usage = json.RawMessage("null")
		}
		return ch
	}
	offset := 0 // of the next chunk's text in the reply
	s.streamOpenAI(c, call, cc.logprobs >= 0, cc.includeUsage, openAIChunks{
		text: func(text string, lps []tokenLogprob) any {
			choice := completionChoice{Text: text}
			if cc.logprobs >= 0 {
				choice.Logprobs = legacyLogprobs(lps, offset, top)
			}
			offset += len(text)
			return chunk([]completionChoice{choice})
		},
		final: func(finish string, lps []tokenLogprob, timings apicore.Timings) any {
			choice := completionChoice{FinishReason: &finish}
			if cc.logprobs >= 0 && len(lps) > 0 {
				choice.Logprobs = legacyLogprobs(lps, offset, top)
			}
			last := chunk([]completionChoice{choice})
			last.Timings = &timings
			return last
		},
		usage: func(u json.RawMessage) any {
			uc := chunk([]completionChoice{})
			uc.Usage = u
			return uc
		},
	})
	return nil
}
