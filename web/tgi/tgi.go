// Package tgi serves the text-completion wires of serving stacks: Hugging
// Face TGI (/generate, /generate_stream), SageMaker (/invocations), DJL's
// JSON lines (/generate?format=jsonlines) and Ray Serve's plain text
// (POST /). Each decodes its request into the shared core's parameters and
// answers in its own shape; TGI's routes answer errors with ErrorBody, the
// JSON-lines and plain ones with Parley's.
package tgi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// Hugging Face Text Generation Inference's wire (router/src/lib.rs in TGI):
// a request {"inputs": "...", "parameters": {...}}, a response
// {"generated_text", "details"}, and stream events
//
//	data:{"index":1,"token":{"id":..,"text":..,"logprob":..,"special":false},"generated_text":null,"details":null}
//
// one per token, a blank line after each (SSE), the last with
// generated_text and details {finish_reason, generated_tokens, seed}. TGI's
// finish reasons are length, eos_token and stop_sequence; a reply that ends
// any other way ends with an error event {"error","error_type"} as TGI's do.
//
// Where Parley differs, and why:
//   - the last event carries the last generated token when the reply ended on
//     its token cap; otherwise (end of generation, stop string) the engine
//     learns the reply is over only after its last token went out, and the
//     last event carries an end marker: a special token with id 0 and no text
//     (TGI puts the end-of-sequence token there, which Parley's engine does
//     not surface). Clients that skip special tokens, as TGI's do, see the
//     same text;
//   - the last event also carries Parley's usage and timings (extra fields;
//     TGI's clients ignore unknown fields);
//   - prefill details are always empty (the engine does not score prompt
//     tokens), top_n_tokens returns only the sampled token, truncate is
//     ignored, and best_of > 1 and watermark are refused.

// tgiParameters is TGI's "parameters" object. The sampling fields are
// apicore.ParamsPatch's (one decoder for every wire); the rest are TGI's own.
type tgiParameters struct {
	apicore.ParamsPatch
	// Grammar shadows apicore.ParamsPatch.Grammar: a GBNF string, or TGI's
	// {"type": "json", "value": SCHEMA} ("regex" is refused).
	Grammar             json.RawMessage `json:"grammar"`
	Details             bool            `json:"details"`
	DecoderInputDetails bool            `json:"decoder_input_details"`
	ReturnFullText      *bool           `json:"return_full_text"`
	BestOf              *int            `json:"best_of"`
	TopNTokens          *int            `json:"top_n_tokens"`
	Truncate            *int            `json:"truncate"`
	Watermark           bool            `json:"watermark"`
}

// tgiRequest is the body of /generate, /generate_stream and /invocations.
type tgiRequest struct {
	Inputs     *string        `json:"inputs"`
	Parameters *tgiParameters `json:"parameters"`
	Stream     bool           `json:"stream"` // SageMaker's switch on /invocations
	Model      string         `json:"model"`  // which model, when the server serves several (or ?model=)
}

type tgiToken struct {
	ID      int     `json:"id"`
	Text    string  `json:"text"`
	Logprob float64 `json:"logprob"`
	Special bool    `json:"special"`
}

func newTGIToken(t parley.Token) tgiToken {
	return tgiToken{ID: t.ID, Text: t.Text, Logprob: apicore.Finite(t.Logprob), Special: t.Special}
}

// endMarker stands for the end of a reply whose last token already went out.
var endMarker = tgiToken{ID: 0, Text: "", Logprob: 0, Special: true}

type tgiStreamDetails struct {
	FinishReason    string `json:"finish_reason"`
	GeneratedTokens int    `json:"generated_tokens"`
	InputLength     int    `json:"input_length"` // prompt tokens
	Seed            *int64 `json:"seed"`
}

type tgiStreamEvent struct {
	Index         int               `json:"index"`
	Token         tgiToken          `json:"token"`
	TopTokens     []tgiToken        `json:"top_tokens,omitempty"`
	GeneratedText *string           `json:"generated_text"`
	Details       *tgiStreamDetails `json:"details"`
	Usage         *apicore.Usage    `json:"usage,omitempty"`   // Parley's, on the last event
	Timings       *apicore.Timings  `json:"timings,omitempty"` // Parley's, on the last event
}

type tgiDetails struct {
	FinishReason    string       `json:"finish_reason"`
	GeneratedTokens int          `json:"generated_tokens"`
	Seed            *int64       `json:"seed"`
	Prefill         []tgiToken   `json:"prefill"`
	Tokens          []tgiToken   `json:"tokens"`
	TopTokens       [][]tgiToken `json:"top_tokens,omitempty"`
}

type tgiResponse struct {
	GeneratedText string      `json:"generated_text"`
	Details       *tgiDetails `json:"details,omitempty"`
}

// tgiFinish is TGI's name for a finish reason; "" for the ones TGI reports as errors.
func tgiFinish(f parley.FinishReason) string {
	switch f {
	case parley.FinishLength:
		return "length"
	case parley.FinishEOS:
		return "eos_token"
	case parley.FinishStop:
		return "stop_sequence"
	}
	return ""
}

// tgiCall is a decoded, validated TGI request.
type tgiCall struct {
	facts    apicore.Facts
	inputs   string
	params   parley.Params
	details  bool
	fullText bool
	topN     int
	stream   bool
}

// seed is the seed TGI reports: the one a sampled reply used, none for greedy.
func (t *tgiCall) seed() *int64 {
	if t.params.Temperature <= 0 || t.params.Seed < 0 {
		return nil
	}
	s := t.params.Seed
	return &s
}

func (t *tgiCall) topTokens(tok parley.Token) []tgiToken {
	if t.topN <= 0 {
		return nil
	}
	return []tgiToken{newTGIToken(tok)}
}

// parseTGI decodes and validates a TGI request body.
func (s *API) parseTGI(c echo.Context) (*tgiCall, error) {
	body, err := apicore.ReadBody(c)
	if err != nil {
		return nil, err
	}
	var req tgiRequest
	if err := apicore.DecodeJSON(bytes.NewReader(body), &req); err != nil {
		return nil, err
	}
	model := req.Model
	if model == "" {
		model = c.QueryParam("model")
	}
	facts := apicore.FactsOf(c)
	if facts.Model, err = s.core.ResolveModel(model); err != nil {
		return nil, err
	}
	if req.Inputs == nil {
		return nil, parley.FieldErrorf("inputs", "is required")
	}
	if strings.TrimSpace(*req.Inputs) == "" {
		return nil, parley.FieldErrorf("inputs", "must not be empty")
	}
	call := &tgiCall{facts: facts, inputs: *req.Inputs, stream: req.Stream}
	var patch *apicore.ParamsPatch
	if tp := req.Parameters; tp != nil {
		patch = &tp.ParamsPatch
		if err := tp.applyGrammar(patch); err != nil {
			return nil, err
		}
		if tp.BestOf != nil && *tp.BestOf != 1 {
			return nil, parley.FieldErrorf("parameters.best_of", "only 1 is supported, got %d", *tp.BestOf)
		}
		if tp.Watermark {
			return nil, parley.FieldErrorf("parameters.watermark", "watermarking is not supported")
		}
		if tp.TopNTokens != nil {
			if *tp.TopNTokens < 0 || *tp.TopNTokens > apicore.MaxTopN {
				return nil, parley.FieldErrorf("parameters.top_n_tokens", "must be between 0 and %d, got %d", apicore.MaxTopN, *tp.TopNTokens)
			}
			call.topN = *tp.TopNTokens
		}
		if tp.Truncate != nil && *tp.Truncate < 0 {
			return nil, parley.FieldErrorf("parameters.truncate", "must not be negative, got %d", *tp.Truncate)
		}
		call.details = tp.Details
		call.fullText = tp.ReturnFullText != nil && *tp.ReturnFullText
	}
	p, err := s.core.ResolveParams(patch)
	if err != nil {
		// TGI's name for the reply cap is max_new_tokens.
		return nil, apicore.PrefixField(apicore.RenameField(err, "max_tokens", "max_new_tokens"), "parameters.")
	}
	apicore.ResolveSeed(&p)
	call.params = p
	return call, nil
}

// applyGrammar turns TGI's grammar (a GBNF string, or {"type":"json","value":SCHEMA})
// into the patch's grammar or JSON schema.
func (tp *tgiParameters) applyGrammar(patch *apicore.ParamsPatch) error {
	raw := bytes.TrimSpace(tp.Grammar)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil
	}
	if raw[0] == '"' {
		var g string
		if err := json.Unmarshal(raw, &g); err != nil {
			return parley.FieldErrorf("parameters.grammar", "invalid string: %v", err)
		}
		patch.Grammar = &g
		return nil
	}
	var typed struct {
		Type  string          `json:"type"`
		Value json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(raw, &typed); err != nil {
		return parley.FieldErrorf("parameters.grammar", `must be a GBNF string or {"type": "json", "value": SCHEMA}`)
	}
	value := bytes.TrimSpace(typed.Value)
	switch typed.Type {
	case "json", "json_object":
		if len(value) == 0 || bytes.Equal(value, []byte("null")) {
			return parley.FieldErrorf("parameters.grammar.value", "a JSON schema is required")
		}
		if value[0] == '"' { // a schema sent as a JSON string
			var text string
			if err := json.Unmarshal(value, &text); err != nil {
				return parley.FieldErrorf("parameters.grammar.value", "invalid string: %v", err)
			}
			value = []byte(text)
		}
		if !json.Valid(value) {
			return parley.FieldErrorf("parameters.grammar.value", "must be a JSON schema")
		}
		patch.JSONSchema = json.RawMessage(value)
	case "gbnf":
		var g string
		if err := json.Unmarshal(value, &g); err != nil {
			return parley.FieldErrorf("parameters.grammar.value", "must be a GBNF string")
		}
		patch.Grammar = &g
	case "regex":
		return parley.FieldErrorf("parameters.grammar", "regex grammars are not supported; use json (a JSON schema) or a GBNF string")
	default:
		return parley.FieldErrorf("parameters.grammar.type", "must be json or gbnf, got %q", typed.Type)
	}
	return nil
}

// Generate is POST /generate: TGI's one-response form, or JSON lines
// with ?format=jsonlines (or jsonlines-cumulative).
func (s *API) Generate(c echo.Context) error {
	switch f := c.QueryParam("format"); f {
	case "", "json":
	case formatJSONLines, formatJSONLinesCumulative:
		return s.handleJSONLines(c, f == formatJSONLinesCumulative)
	default:
		return parley.FieldErrorf("format", "must be json, %s or %s, got %q", formatJSONLines, formatJSONLinesCumulative, f)
	}
	tc, err := s.parseTGI(c)
	if err != nil {
		return err
	}
	resp, err := s.tgiCollect(c, "tgi", tc)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, resp)
}

// GenerateStream is POST /generate_stream: TGI's server-sent events.
func (s *API) GenerateStream(c echo.Context) error {
	tc, err := s.parseTGI(c)
	if err != nil {
		return err
	}
	return s.tgiStream(c, "tgi-stream", tc)
}

// Invocations is POST /invocations, SageMaker's convention on TGI:
// {"inputs", "parameters", "stream": true} streams TGI's events; without
// stream the response is [{"generated_text": ...}].
func (s *API) Invocations(c echo.Context) error {
	tc, err := s.parseTGI(c)
	if err != nil {
		return err
	}
	if tc.stream {
		return s.tgiStream(c, "sagemaker-stream", tc)
	}
	resp, err := s.tgiCollect(c, "sagemaker", tc)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, []tgiResponse{*resp})
}

// tgiCollect runs a whole reply and builds TGI's response, with TGI's
// timing headers.
func (s *API) tgiCollect(c echo.Context, route string, tc *tgiCall) (*tgiResponse, error) {
	call, err := s.core.StartCompletion(c, tc.facts, route, tc.inputs, tc.params)
	if err != nil {
		return nil, apicore.PrefixField(err, "parameters.")
	}
	toks, ev := call.Collect()
	if rerr := apicore.ReplyError(ev); rerr != nil {
		return nil, rerr
	}
	text := call.Rep.Text()
	if tc.fullText {
		text = tc.inputs + text
	}
	resp := &tgiResponse{GeneratedText: text}
	if tc.details {
		d := &tgiDetails{
			FinishReason:    tgiFinish(ev.Finish),
			GeneratedTokens: ev.Usage.CompletionTokens,
			Seed:            tc.seed(),
			Prefill:         []tgiToken{},
			Tokens:          make([]tgiToken, 0, len(toks)),
		}
		for _, t := range toks {
			d.Tokens = append(d.Tokens, newTGIToken(t))
			if tc.topN > 0 {
				d.TopTokens = append(d.TopTokens, tc.topTokens(t))
			}
		}
		resp.Details = d
	}
	h := c.Response().Header()
	ms := func(f float64) string { return strconv.FormatFloat(f, 'f', 0, 64) }
	t := apicore.NewTimings(ev.Timings, ev.Usage.CompletionTokens)
	h.Set("X-Prompt-Tokens", strconv.Itoa(ev.Usage.PromptTokens))
	h.Set("X-Generated-Tokens", strconv.Itoa(ev.Usage.CompletionTokens))
	h.Set("X-Total-Time", ms(t.TotalMS))
	h.Set("X-Queue-Time", ms(t.QueuedMS))
	if ev.Usage.CompletionTokens > 0 {
		h.Set("X-Time-Per-Token", ms(t.TotalMS/float64(ev.Usage.CompletionTokens)))
	}
	return resp, nil
}

// tgiStream streams TGI's events. Each is "data:" then the JSON object, then
// a blank line: the framing of TGI's server-sent events, which newline
// iterators such as SageMaker's examples rely on.
func (s *API) tgiStream(c echo.Context, route string, tc *tgiCall) error {
	call, err := s.core.StartCompletion(c, tc.facts, route, tc.inputs, tc.params)
	if err != nil {
		return apicore.PrefixField(err, "parameters.")
	}
	w := s.core.BeginStream(c, "text/event-stream")
	send := func(v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("encode event: %w", err)
		}
		return w.Write(append(append([]byte("data:"), b...), '\n', '\n'))
	}
	n := 0
	err = call.Relay(
		func(t parley.Token, index int) error {
			n = index
			return send(tgiStreamEvent{Index: index, Token: newTGIToken(t), TopTokens: tc.topTokens(t)})
		},
		func(last *parley.Token, ev parley.Event) error {
			if rerr := apicore.ReplyError(ev); rerr != nil {
				if last != nil {
					if err := send(tgiStreamEvent{Index: n + 1, Token: newTGIToken(*last), TopTokens: tc.topTokens(*last)}); err != nil {
						return err
					}
				}
				return send(newTGIError(rerr))
			}
			text := call.Rep.Text()
			if tc.fullText {
				text = tc.inputs + text
			}
			usage, timings := apicore.NewUsage(ev.Usage), apicore.NewTimings(ev.Timings, ev.Usage.CompletionTokens)
			final := tgiStreamEvent{
				Index:         n + 1,
				Token:         endMarker,
				GeneratedText: &text,
				Details: &tgiStreamDetails{
					FinishReason:    tgiFinish(ev.Finish),
					GeneratedTokens: ev.Usage.CompletionTokens,
					InputLength:     ev.Usage.PromptTokens,
					Seed:            tc.seed(),
				},
				Usage:   &usage,
				Timings: &timings,
			}
			if last != nil {
				final.Token, final.TopTokens = newTGIToken(*last), tc.topTokens(*last)
			}
			return send(final)
		})
	if err != nil {
		s.core.Log.Debug("event stream ended early", zap.String("route", route), zap.Error(err))
	}
	return nil
}

// API serves TGI's, SageMaker's, the JSON-lines and the plain-text
// endpoints over the shared core.
type API struct {
	core *apicore.Core
}

// New returns the endpoints over core.
func New(core *apicore.Core) *API { return &API{core: core} }
