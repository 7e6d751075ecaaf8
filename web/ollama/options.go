package ollama

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// Ollama's request options: the "options" object of /api/chat and
// /api/generate, "format" and "keep_alive". Options are decoded one by one
// into the apicore.ParamsPatch every wire uses, so validation is the shared one;
// its errors are renamed to the Ollama option the client sent
// (options.num_predict, not max_tokens). An option Parley does not know is
// a 400 naming it; Ollama's runner options (threads, GPU layers, mmap),
// which the server's flags own, are accepted and have no effect.

// ollamaIgnoredOptions are Ollama runner options: how Ollama loads a model,
// which Parley's own flags decide. Accepting them keeps clients that always
// send them (num_gpu, num_thread) working.
var ollamaIgnoredOptions = map[string]bool{
	"num_keep": true, "num_batch": true, "num_gpu": true, "main_gpu": true, "use_mmap": true, "use_mlock": true,
	"num_thread": true, "numa": true, "low_vram": true, "f16_kv": true, "vocab_only": true, "logits_all": true,
	"embedding_only": true, "penalize_newline": true, "mirostat_tau": true, "mirostat_eta": true,
}

// ollamaFieldNames maps the shared validation's field names to Ollama's.
var ollamaFieldNames = map[string]string{
	"max_tokens":         "options.num_predict",
	"temperature":        "options.temperature",
	"top_k":              "options.top_k",
	"top_p":              "options.top_p",
	"min_p":              "options.min_p",
	"typical_p":          "options.typical_p",
	"repetition_penalty": "options.repeat_penalty",
	"repeat_penalty":     "options.repeat_penalty",
	"repeat_last_n":      "options.repeat_last_n",
	"presence_penalty":   "options.presence_penalty",
	"frequency_penalty":  "options.frequency_penalty",
	"seed":               "options.seed",
	"stop":               "options.stop",
	"json_schema":        "format",
}

// renameOllama renames the field a validation or engine error names to
// the Ollama name the client sent it under.
func renameOllama(err error) error {
	if to, ok := ollamaFieldNames[apicore.ErrorField(err)]; ok {
		return apicore.RenameField(err, apicore.ErrorField(err), to)
	}
	return err
}

// ollamaLimits are what options are checked against: the context a
// conversation gets and the server's reply cap (0: none).
type ollamaLimits struct {
	contextLength int
	maxTokensCap  int
}

// unlimitedTokens is the reply cap of num_predict -1 (until the model
// stops) and -2 (fill the context): the server's cap, and at most half the
// context, so the conversation keeps the other half.
func (l ollamaLimits) unlimitedTokens() int {
	n := l.contextLength / 2
	if l.maxTokensCap > 0 && l.maxTokensCap < n {
		n = l.maxTokensCap
	}
	return max(n, 1)
}

// applyOllamaOptions decodes options into p.
func applyOllamaOptions(raw json.RawMessage, p *apicore.ParamsPatch, lim ollamaLimits) error {
	if !apicore.IsSet(raw) {
		return nil
	}
	var opts map[string]json.RawMessage
	if err := json.Unmarshal(raw, &opts); err != nil {
		return parley.FieldErrorf("options", "must be an object of option names and values")
	}
	keys := make([]string, 0, len(opts))
	for k := range opts {
		keys = append(keys, k)
	}
	sort.Strings(keys) // the first bad option named is the same every time
	for _, k := range keys {
		if err := applyOllamaOption(k, opts[k], p, lim); err != nil {
			return err
		}
	}
	return nil
}

func applyOllamaOption(key string, v json.RawMessage, p *apicore.ParamsPatch, lim ollamaLimits) error {
	field := "options." + key
	if !apicore.IsSet(v) {
		return nil // null: the default, as if absent
	}
	num := func(dst **float64) error {
		f, err := ollamaNumber(v, field)
		*dst = &f
		return err
	}
	integer := func(dst **int) error {
		n, err := ollamaInt(v, field)
		*dst = &n
		return err
	}
	switch key {
	case "num_predict":
		n, err := ollamaInt(v, field)
		if err != nil {
			return err
		}
		if n == -1 || n == -2 {
			n = lim.unlimitedTokens()
		}
		p.MaxTokens = &n
	case "temperature":
		return num(&p.Temperature)
	case "top_p":
		return num(&p.TopP)
	case "min_p":
		return num(&p.MinP)
	case "typical_p":
		return num(&p.TypicalP)
	case "repeat_penalty":
		return num(&p.RepeatPenalty)
	case "presence_penalty":
		return num(&p.PresencePenalty)
	case "frequency_penalty":
		return num(&p.FrequencyPenalty)
	case "top_k":
		return integer(&p.TopK)
	case "repeat_last_n":
		return integer(&p.RepeatLastN)
	case "seed":
		n, err := ollamaInt(v, field)
		s := int64(n)
		p.Seed = &s
		return err
	case "stop":
		if err := json.Unmarshal(v, &p.Stop); err != nil {
			return parley.FieldErrorf(field, "must be a string or an array of strings")
		}
	case "num_ctx":
		return checkNumCtx(v, field, lim)
	case "mirostat":
		if n, err := ollamaInt(v, field); err != nil || n != 0 {
			return parley.FieldErrorf(field, "only 0 is supported: Parley samples with top_k, top_p, min_p and typical_p")
		}
	case "tfs_z":
		if f, err := ollamaNumber(v, field); err != nil || f != 1 {
			return parley.FieldErrorf(field, "only 1 (off) is supported: tail-free sampling was removed from llama.cpp")
		}
	default:
		if !ollamaIgnoredOptions[key] {
			return parley.FieldErrorf(field, "is not an option Parley knows")
		}
	}
	return nil
}

// checkNumCtx accepts a num_ctx up to the context a conversation gets,
// which the server fixes at start (--ctx); a larger one is refused rather
// than silently shrunk.
func checkNumCtx(v json.RawMessage, field string, lim ollamaLimits) error {
	n, err := ollamaInt(v, field)
	if err != nil {
		return err
	}
	if n < 1 || n > lim.contextLength {
		return parley.FieldErrorf(field, "must be between 1 and %d, the context this server gives each conversation (--ctx), got %d", lim.contextLength, n)
	}
	return nil
}

// ollamaNumber decodes a JSON number.
func ollamaNumber(v json.RawMessage, field string) (float64, error) {
	var f float64
	if err := json.Unmarshal(v, &f); err != nil {
		return 0, parley.FieldErrorf(field, "expected a number, got %s", jsonKindOf(v))
	}
	return f, nil
}

// ollamaInt decodes a JSON number that is a whole number in int32's range
// (Python clients send 128.0 for 128).
func ollamaInt(v json.RawMessage, field string) (int, error) {
	f, err := ollamaNumber(v, field)
	if err != nil {
		return 0, parley.FieldErrorf(field, "expected an integer, got %s", jsonKindOf(v))
	}
	if f != math.Trunc(f) || f < math.MinInt32 || f > math.MaxUint32 {
		return 0, parley.FieldErrorf(field, "expected an integer, got %s", bytes.TrimSpace(v))
	}
	return int(f), nil
}

// jsonKindOf names the kind of a JSON value, for type errors.
func jsonKindOf(v json.RawMessage) string {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return "nothing"
	}
	switch v[0] {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	}
	return "a number"
}

// applyOllamaFormat turns format ("json", or a JSON schema) into the
// schema the shared grammar path constrains the reply with.
func applyOllamaFormat(raw json.RawMessage, p *apicore.ParamsPatch) error {
	raw = bytes.TrimSpace(raw)
	if !apicore.IsSet(raw) {
		return nil
	}
	switch raw[0] {
	case '"':
		var s string
		_ = json.Unmarshal(raw, &s)
		switch s {
		case "":
			return nil
		case "json":
			p.JSONSchema = json.RawMessage(`{"type":"object"}`)
		default:
			return parley.FieldErrorf("format", `must be "json" or a JSON schema object, got %q`, s)
		}
	case '{':
		p.JSONSchema = raw
	default:
		return parley.FieldErrorf("format", `must be "json" or a JSON schema object, got %s`, jsonKindOf(raw))
	}
	p.SchemaField = "format"
	return nil
}

// checkKeepAlive validates keep_alive as Ollama parses it: a duration
// string ("5m", "-1s", "0") or a number of seconds. The model stays loaded
// while Parley runs whatever it says.
func checkKeepAlive(raw json.RawMessage) (time.Duration, error) {
	raw = bytes.TrimSpace(raw)
	if !apicore.IsSet(raw) {
		return 0, nil
	}
	if raw[0] == '"' {
		var s string
		_ = json.Unmarshal(raw, &s)
		if d, err := time.ParseDuration(s); err == nil {
			return d, nil
		}
		if d, err := time.ParseDuration(s + "s"); err == nil && s != "" && !strings.ContainsAny(s, "hms") {
			return d, nil // "-1", "300": seconds
		}
		return 0, parley.FieldErrorf("keep_alive", `must be a duration such as "5m" or a number of seconds, got %q`, s)
	}
	f, err := ollamaNumber(raw, "keep_alive")
	if err != nil || math.Abs(f) > math.MaxInt64/float64(time.Second) {
		return 0, parley.FieldErrorf("keep_alive", `must be a duration such as "5m" or a number of seconds`)
	}
	return time.Duration(f * float64(time.Second)), nil
}

// ParseKeepAlive is keep_alive as Ollama parses it (see checkKeepAlive),
// for the embedding endpoints: set is false when the request has none.
func ParseKeepAlive(raw json.RawMessage) (d time.Duration, set bool, err error) {
	d, err = checkKeepAlive(raw)
	return d, err == nil && apicore.IsSet(bytes.TrimSpace(raw)), err
}

// goTypeName matches the Go type names the JSON decoder puts in its type
// errors ([]ollama.ollamaMessage, ollama.ollamaChatRequest).
var goTypeName = regexp.MustCompile(`(\[\])?(map\[string\])?ollama\.[A-Za-z]+`)

// decodeOllama decodes a request body; a type error names JSON's kinds
// (an array, an object), not the server's Go types.
func decodeOllama(body []byte, v any) error {
	err := apicore.DecodeJSON(bytes.NewReader(body), v)
	var pe *parley.Error
	if err == nil || !errors.As(err, &pe) {
		return err
	}
	// The shared fields sit in an embedded struct, whose name the decoder
	// puts in the path; clients know only the JSON names.
	field := strings.ReplaceAll(pe.Field, "ollamaCommon.", "")
	msg := strings.ReplaceAll(pe.Message, "ollamaCommon.", "")
	msg = goTypeName.ReplaceAllStringFunc(msg, func(t string) string {
		if strings.HasPrefix(t, "[]") {
			return "an array"
		}
		return "an object"
	})
	return &parley.Error{Code: pe.Code, Field: field, Message: msg}
}
