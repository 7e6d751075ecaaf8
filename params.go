package parley

import (
	"bytes"
	"encoding/json"
	"math"

	"github.com/parley-chat/parley/internal/gbnf"
)

// Limits on sampling parameters. Values outside them are rejected with an
// EInvalid error naming the field, before anything reaches llama.cpp.
const (
	MaxStopStrings = 16       // stop strings per request
	MaxStopLen     = 256      // bytes per stop string
	MaxGrammarLen  = 64 << 10 // bytes of GBNF grammar
	// MaxSchemaLen bounds a JSON schema in bytes. It is larger than
	// MaxGrammarLen because descriptions and titles, which never reach the
	// grammar, make up much of a real extraction schema; gbnf's
	// MaxSchema* limits bound what does.
	MaxSchemaLen   = 256 << 10
	MaxTemperature = 10.0    // higher is noise
	MaxPenalty     = 10.0    // repetition penalty upper bound (1 = off)
	MaxAbsPenalty  = 10.0    // presence/frequency penalties live in [-MaxAbsPenalty, MaxAbsPenalty]
	MaxRepeatLastN = 1 << 16 // tokens in the repetition window
	MaxTopK        = 1 << 20 // larger than any vocabulary
	// MaxGrammarDepth bounds the nesting of parentheses in a GBNF grammar.
	// llama.cpp parses groups recursively on the C stack: around 20,000
	// levels (well within MaxGrammarLen) overflow it and kill the process.
	MaxGrammarDepth = 256
	// MaxSchemaDepth bounds the nesting of objects and arrays in a JSON
	// schema. llama.cpp names each nested rule after its parents, so the
	// grammar it builds grows with the square of the depth: a 64 KiB schema
	// nested 7,000 deep took 8 s and 2.9 GB to convert.
	MaxSchemaDepth = 64
)

// grammarLimits bound a request's grammar before it reaches llama.cpp; see
// package gbnf for why.
func grammarLimits() gbnf.Limits {
	return gbnf.Limits{MaxBytes: MaxGrammarLen, MaxDepth: MaxGrammarDepth}
}

// Params are the sampling and stopping parameters of one reply. The zero
// value is not useful; start from DefaultParams (or the server's configured
// defaults) and override.
type Params struct {
	MaxTokens        int             `json:"max_tokens"`            // reply cap in tokens; > 0
	Temperature      float64         `json:"temperature"`           // 0 = greedy
	TopK             int             `json:"top_k"`                 // 0 = off
	TopP             float64         `json:"top_p"`                 // 1 = off
	MinP             float64         `json:"min_p"`                 // 0 = off
	TypicalP         float64         `json:"typical_p"`             // 1 = off
	RepeatPenalty    float64         `json:"repetition_penalty"`    // 1 = off
	RepeatLastN      int             `json:"repeat_last_n"`         // window for the penalties; 0 = off, -1 = whole context
	PresencePenalty  float64         `json:"presence_penalty"`      // 0 = off
	FrequencyPenalty float64         `json:"frequency_penalty"`     // 0 = off
	Seed             int64           `json:"seed"`                  // -1 = random; else [0, 2^32-2]
	Stop             []string        `json:"stop,omitempty"`        // reply ends before any of these
	Grammar          string          `json:"grammar,omitempty"`     // GBNF; exclusive with JSONSchema
	JSONSchema       json.RawMessage `json:"json_schema,omitempty"` // constrains output to JSON matching the schema
	// SkipLogprobs says no client reads the tokens' log-probabilities, so
	// the engine skips computing them (a softmax over the vocabulary per
	// token) and Token.Logprob is NaN. Set by the wire layer, never sent.
	SkipLogprobs bool `json:"-"`
}

// DefaultParams returns Parley's defaults: a short, mildly creative reply.
func DefaultParams() Params {
	return Params{
		MaxTokens:     256,
		Temperature:   0.8,
		TopK:          40,
		TopP:          0.95,
		MinP:          0.05,
		TypicalP:      1,
		RepeatPenalty: 1.1,
		RepeatLastN:   64,
		Seed:          -1,
	}
}

// Validate checks every field and returns an EInvalid *Error naming the first
// bad one. maxTokens bounds MaxTokens (the server's cap); <= 0 means no cap.
func (p Params) Validate(maxTokens int) error {
	finite := func(name string, v, lo, hi float64) error {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return FieldErrorf(name, "must be a finite number")
		}
		if v < lo || v > hi {
			return FieldErrorf(name, "must be between %g and %g, got %g", lo, hi, v)
		}
		return nil
	}
	if p.MaxTokens < 1 {
		return FieldErrorf("max_tokens", "must be at least 1, got %d", p.MaxTokens)
	}
	if maxTokens > 0 && p.MaxTokens > maxTokens {
		return FieldErrorf("max_tokens", "must be at most %d, got %d", maxTokens, p.MaxTokens)
	}
	checks := []struct {
		name      string
		v, lo, hi float64
	}{
		{"temperature", p.Temperature, 0, MaxTemperature},
		{"top_p", p.TopP, 0, 1},
		{"min_p", p.MinP, 0, 1},
		{"typical_p", p.TypicalP, 0, 1},
		{"repetition_penalty", p.RepeatPenalty, 0, MaxPenalty},
		{"presence_penalty", p.PresencePenalty, -MaxAbsPenalty, MaxAbsPenalty},
		{"frequency_penalty", p.FrequencyPenalty, -MaxAbsPenalty, MaxAbsPenalty},
	}
	for _, c := range checks {
		if err := finite(c.name, c.v, c.lo, c.hi); err != nil {
			return err
		}
	}
	if p.RepeatPenalty == 0 {
		return FieldErrorf("repetition_penalty", "must be greater than 0 (1 disables it)")
	}
	if p.TopK < 0 || p.TopK > MaxTopK {
		return FieldErrorf("top_k", "must be between 0 and %d, got %d", MaxTopK, p.TopK)
	}
	if p.RepeatLastN < -1 || p.RepeatLastN > MaxRepeatLastN {
		return FieldErrorf("repeat_last_n", "must be between -1 and %d, got %d", MaxRepeatLastN, p.RepeatLastN)
	}
	// llama.cpp treats 0xFFFFFFFF as "random", so the largest fixed seed is one less.
	if p.Seed < -1 || p.Seed > math.MaxUint32-1 {
		return FieldErrorf("seed", "must be -1 (random) or between 0 and %d, got %d", uint32(math.MaxUint32-1), p.Seed)
	}
	if len(p.Stop) > MaxStopStrings {
		return FieldErrorf("stop", "at most %d stop strings, got %d", MaxStopStrings, len(p.Stop))
	}
	for _, s := range p.Stop {
		if s == "" {
			return FieldErrorf("stop", "stop strings must not be empty")
		}
		if len(s) > MaxStopLen {
			return FieldErrorf("stop", "stop strings must be at most %d bytes", MaxStopLen)
		}
	}
	if p.Grammar != "" && len(p.JSONSchema) > 0 {
		return FieldErrorf("grammar", "give a grammar or a json_schema, not both")
	}
	if len(p.Grammar) > MaxGrammarLen {
		return FieldErrorf("grammar", "must be at most %d bytes", MaxGrammarLen)
	}
	if len(p.JSONSchema) > MaxSchemaLen {
		return FieldErrorf("json_schema", "must be at most %d bytes", MaxSchemaLen)
	}
	if p.Grammar != "" {
		if err := gbnf.Check(p.Grammar, grammarLimits()); err != nil {
			return FieldErrorf("grammar", "%v", err)
		}
	}
	if len(p.JSONSchema) > 0 && !json.Valid(p.JSONSchema) {
		return FieldErrorf("json_schema", "must be valid JSON")
	}
	if len(p.JSONSchema) > 0 && jsonDepthOver(p.JSONSchema, MaxSchemaDepth) {
		return FieldErrorf("json_schema", "nests objects and arrays more than %d deep", MaxSchemaDepth)
	}
	if len(p.JSONSchema) > 0 {
		if err := gbnf.CheckSchema(p.JSONSchema, grammarLimits()); err != nil {
			return FieldErrorf("json_schema", "%v", err)
		}
		// Converted here, at the edge, so that a schema over a limit is
		// refused before it is queued; the engine converts it again.
		if _, err := gbnf.SchemaToGrammar(p.JSONSchema, grammarLimits()); err != nil {
			return FieldErrorf("json_schema", "%v", err)
		}
	}
	return nil
}

// jsonDepthOver reports whether the valid JSON value b nests objects and
// arrays more than limit deep. It stops reading at the first level past it.
func jsonDepthOver(b []byte, limit int) bool {
	dec := json.NewDecoder(bytes.NewReader(b))
	depth := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return false // end of input (b was validated before)
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			if depth++; depth > limit {
				return true
			}
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
}
