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
	// Think switches a reasoning model's thought on or off (the template's enable_thinking); nil leaves the model's
	// default. Models whose template has no switch ignore it.
	Think *bool `json:"think,omitempty"`
	// ThinkBudget caps a reasoning model's thought, in tokens (0: no cap but MaxTokens, which covers thought and
	// answer): at the budget Parley closes the thought itself and the answer follows.
	ThinkBudget int `json:"think_budget,omitempty"`
	// Tools the model may call, and whether it must (see tools.go).
	Tools      []Tool     `json:"tools,omitempty"`
	ToolChoice ToolChoice `json:"tool_choice,omitempty"`
	// ToolSyntax is how the chat template writes a call; set by the chat
	// layer before generation, never sent.
	ToolSyntax ToolSyntax `json:"-"`
	// SkipLogprobs says no client reads the tokens' log-probabilities, so
	// the engine skips computing them (a softmax over the vocabulary per
	// token) and Token.Logprob is NaN. Set by the wire layer, never sent.
	SkipLogprobs bool `json:"-"`

	// checked records the grammar Validate checked or converted, so that
	// neither a later Validate nor the engine repeats the work; see
	// CheckedGrammar. Copying a Params copies it.
	checked checkedGrammar
	// validations counts the Validate calls on this value and on the values
	// it was copied from: a request is validated at the edge and at the
	// engine's door only, and tests hold that through package
	// internal/paramstest, which reads this field by name.
	validations int
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
//
// It records in p the grammar it checked, or the one a JSONSchema converts
// to (see CheckedGrammar), and does not check or convert them again while
// Grammar and JSONSchema are unchanged: a request is validated at the edge,
// and again (cheaply) by the layers below it that must not trust their
// callers. Keep the validated value.
func (p *Params) Validate(maxTokens int) error {
	p.validations++
	finite := func(name string, v, lo, hi float64) error {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return FieldErrorf(name, "must be a finite number")
		}
		if v < lo || v > hi {
			return FieldErrorf(name, "must be between %g and %g, got %g", lo, hi, v)
		}
		return nil
	}
	if p.ThinkBudget < 0 {
		return FieldErrorf("think_budget", "must be 0 (no cap) or more, got %d", p.ThinkBudget)
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
	if p.checked.of(p) {
		return nil
	}
	if err := p.checkTools(); err != nil {
		return err
	}
	return p.checkGrammar()
}

// checkGrammar checks the grammar or JSON schema (converting the schema to
// the grammar it stands for) and records the result in p.checked. It does
// nothing when p.checked was derived from the current Grammar or JSONSchema:
// a 500-property schema takes ~100 ms to convert, and a request's
// parameters are validated at the edge, in the session and in the engine.
func (p *Params) checkGrammar() error {
	if p.checked.of(p) {
		return nil
	}
	p.checked = checkedGrammar{}
	c := checkedGrammar{done: true, field: p.grammarField()}
	switch c.field {
	case "grammar":
		if err := gbnf.Check(p.Grammar, grammarLimits()); err != nil {
			return FieldErrorf("grammar", "%v", err)
		}
		c.src, c.grammar = p.Grammar, p.Grammar
	case "json_schema":
		if !json.Valid(p.JSONSchema) {
			return FieldErrorf("json_schema", "must be valid JSON")
		}
		if jsonDepthOver(p.JSONSchema, MaxSchemaDepth) {
			return FieldErrorf("json_schema", "nests objects and arrays more than %d deep", MaxSchemaDepth)
		}
		if err := gbnf.CheckSchema(p.JSONSchema, grammarLimits()); err != nil {
			return FieldErrorf("json_schema", "%v", err)
		}
		// Converted here, at the edge, so that a schema over a limit is
		// refused before it is queued; the engine samples with the result.
		g, err := gbnf.SchemaToGrammar(p.JSONSchema, grammarLimits())
		if err != nil {
			return FieldErrorf("json_schema", "%v", err)
		}
		c.src, c.grammar = string(p.JSONSchema), g // a copy: the caller may reuse its bytes
	}
	if c.tools = p.toolsKey(); p.ToolsActive() {
		rules, err := p.toolGrammar()
		if err != nil {
			return err
		}
		c.toolRules = rules
	}
	p.checked = c
	return nil
}

// grammarField returns the field that constrains the reply: "grammar",
// "json_schema", or "" for neither. (Validate refuses both at once.)
func (p *Params) grammarField() string {
	switch {
	case p.Grammar != "":
		return "grammar"
	case len(p.JSONSchema) > 0:
		return "json_schema"
	}
	return ""
}

// CheckedGrammar returns the GBNF grammar that constrains the reply ("" for
// none) and the field the client gave it in ("grammar" or "json_schema"),
// as the last Validate checked (and, for a schema, converted) it. ok is
// false unless Validate has succeeded on p's current Grammar and
// JSONSchema: the caller must validate first.
func (p *Params) CheckedGrammar() (grammar, field string, ok bool) {
	if !p.checked.of(p) {
		return "", "", false
	}
	if p.ToolsForced() {
		// A call from the first token: Open, the call, Close.
		return p.checked.callGrammar(p.ToolSyntax, ""), "tools", true
	}
	return p.checked.grammar, p.checked.field, true
}

// checkedGrammar is what Validate derived from a Params' Grammar or
// JSONSchema. It is valid while the Params' source text equals src; src is
// a copy, so a change to the caller's bytes shows.
type checkedGrammar struct {
	done    bool   // Validate succeeded on src
	field   string // "grammar", "json_schema", or "" when neither is set
	src     string // the Grammar or JSONSchema text checked
	grammar string // the GBNF to sample with: Grammar itself, or the schema converted
	// tools is the toolsKey checked ("" for none); toolRules the GBNF rules
	// of one call to them, entered by "tool-call".
	tools, toolRules string
}

// of reports whether c was derived from p's current Grammar or JSONSchema.
func (c checkedGrammar) of(p *Params) bool {
	if !c.done || c.field != p.grammarField() || c.tools != p.toolsKey() {
		return false
	}
	if c.field == "json_schema" {
		return c.src == string(p.JSONSchema) // compared without a copy
	}
	return c.src == p.Grammar
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
