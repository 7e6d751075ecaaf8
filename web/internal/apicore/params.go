package apicore

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/parley-chat/parley"
)

// ParamsPatch is the one decoder of sampling parameters for every wire
// format: each field is optional and overrides the server's defaults. It
// accepts the names the conventions Parley speaks use (OpenAI, TGI, DJL,
// llama.cpp), so one validation serves them all.
type ParamsPatch struct {
	MaxTokens         *int            `json:"max_tokens"`
	MaxNewTokens      *int            `json:"max_new_tokens"`        // TGI, DJL
	MaxCompletion     *int            `json:"max_completion_tokens"` // OpenAI's newer name
	Temperature       *float64        `json:"temperature"`
	TopK              *int            `json:"top_k"`
	TopP              *float64        `json:"top_p"`
	MinP              *float64        `json:"min_p"`
	TypicalP          *float64        `json:"typical_p"`
	RepetitionPenalty *float64        `json:"repetition_penalty"`
	RepeatPenalty     *float64        `json:"repeat_penalty"` // llama.cpp / Ollama name
	RepeatLastN       *int            `json:"repeat_last_n"`
	PresencePenalty   *float64        `json:"presence_penalty"`
	FrequencyPenalty  *float64        `json:"frequency_penalty"`
	Seed              *int64          `json:"seed"`
	ManualSeed        *int64          `json:"manual_seed"` // DJL
	DoSample          *bool           `json:"do_sample"`   // TGI/DJL: false means greedy
	Stop              stopList        `json:"stop"`
	StopSequences     stopList        `json:"stop_sequences"` // DJL / Anthropic-style name
	Grammar           *string         `json:"grammar"`
	JSONSchema        json.RawMessage `json:"json_schema"`
	thinkPatch
	// SchemaField is where the client put JSONSchema when a wire's own
	// field carried it (OpenAI's response_format.json_schema.schema); ""
	// for json_schema itself. Errors name it.
	SchemaField string
}

// sentName is the name under which the client sent the parameter that
// validation calls field: ParamsPatch takes several names for some
// parameters, and an error must name the one in the request
// (max_completion_tokens: -1 is an error about max_completion_tokens).
// The later names in apply's lists win there, so they win here.
func (p *ParamsPatch) sentName(field string) string {
	switch field {
	case "max_tokens":
		if p.MaxCompletion != nil {
			return "max_completion_tokens"
		} else if p.MaxNewTokens != nil {
			return "max_new_tokens"
		}
	case "repetition_penalty":
		if p.RepetitionPenalty == nil && p.RepeatPenalty != nil {
			return "repeat_penalty"
		}
	case "seed":
		if p.ManualSeed != nil {
			return "manual_seed"
		}
	case "stop":
		if len(p.Stop) == 0 && len(p.StopSequences) > 0 {
			return "stop_sequences"
		}
	case "json_schema":
		if p.SchemaField != "" {
			return p.SchemaField
		}
	}
	return field
}

// RenameSent renames the field err names to the name the client sent it
// under (sentName). Errors from the engine (a schema that does not
// convert) pass through it too.
func (p *ParamsPatch) RenameSent(err error) error {
	field := ErrorField(err)
	if p == nil || field == "" {
		return err
	}
	if sent := p.sentName(field); sent != field {
		return RenameField(err, field, sent)
	}
	return err
}

// stopList accepts a string or an array of strings.
type stopList []string

func (s *stopList) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var one string
		if err := json.Unmarshal(b, &one); err != nil {
			return err
		}
		*s = stopList{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		// A type error, so that the decoder adds the field's name to it.
		return &json.UnmarshalTypeError{Value: jsonKind(b), Type: reflect.TypeFor[[]string]()}
	}
	*s = many
	return nil
}

// jsonKind names the kind of a JSON value, for type errors.
func jsonKind(b []byte) string {
	switch {
	case len(b) == 0:
		return "nothing"
	case b[0] == '{':
		return "object"
	case b[0] == '[':
		return "array with a non-string element"
	case b[0] == 't' || b[0] == 'f':
		return "bool"
	}
	return "number"
}

// apply overlays the patch on base.
func (p *ParamsPatch) apply(base parley.Params) parley.Params {
	out := base
	out.Stop = append([]string(nil), base.Stop...)
	setInt := func(dst *int, vs ...*int) {
		for _, v := range vs {
			if v != nil {
				*dst = *v
			}
		}
	}
	setF := func(dst *float64, vs ...*float64) {
		for _, v := range vs {
			if v != nil {
				*dst = *v
			}
		}
	}
	setInt(&out.MaxTokens, p.MaxTokens, p.MaxNewTokens, p.MaxCompletion)
	setF(&out.Temperature, p.Temperature)
	setInt(&out.TopK, p.TopK)
	setF(&out.TopP, p.TopP)
	setF(&out.MinP, p.MinP)
	setF(&out.TypicalP, p.TypicalP)
	setF(&out.RepeatPenalty, p.RepeatPenalty, p.RepetitionPenalty)
	setInt(&out.RepeatLastN, p.RepeatLastN)
	setF(&out.PresencePenalty, p.PresencePenalty)
	setF(&out.FrequencyPenalty, p.FrequencyPenalty)
	if p.Seed != nil {
		out.Seed = *p.Seed
	}
	if p.ManualSeed != nil {
		out.Seed = *p.ManualSeed
	}
	if p.DoSample != nil && !*p.DoSample {
		out.Temperature = 0
	}
	if len(p.Stop) > 0 || len(p.StopSequences) > 0 {
		out.Stop = append(append([]string(nil), p.Stop...), p.StopSequences...)
	}
	if p.Grammar != nil {
		out.Grammar = *p.Grammar
	}
	if len(p.JSONSchema) > 0 && !bytes.Equal(bytes.TrimSpace(p.JSONSchema), []byte("null")) {
		out.JSONSchema = append(json.RawMessage(nil), p.JSONSchema...)
	}
	return out
}

// DecodeJSON decodes one JSON value from r into v and turns decoder errors
// into EInvalid errors that name the offending field.
func DecodeJSON(r io.Reader, v any) error {
	dec := json.NewDecoder(r)
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if dec.More() {
		return parley.Errorf(parley.EInvalid, "invalid JSON: trailing data after the object")
	}
	return nil
}

func jsonError(err error) error {
	var typeErr *json.UnmarshalTypeError
	var synErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		// Embedded structs (ParamsPatch and CacheKeyFields inside a wire's request type) show
		// in the path under their type name; clients know only JSON names.
		field := strings.ReplaceAll(strings.ReplaceAll(typeErr.Field, "ParamsPatch.", ""), "CacheKeyFields.", "")
		if field == "" {
			return parley.Errorf(parley.EInvalid, "invalid JSON: expected %s, got %s", typeErr.Type, typeErr.Value)
		}
		return parley.FieldErrorf(field, "expected %s, got %s", typeErr.Type, typeErr.Value)
	case errors.As(err, &synErr):
		return parley.Errorf(parley.EInvalid, "invalid JSON at byte %d: %v", synErr.Offset, err)
	case errors.Is(err, io.EOF):
		return parley.Errorf(parley.EInvalid, "empty request body: expected a JSON object")
	case strings.HasPrefix(err.Error(), "json: "):
		// Field-specific errors from UnmarshalJSON methods and number range errors.
		msg := strings.TrimPrefix(err.Error(), "json: ")
		if i := strings.Index(msg, "Go struct field "); i >= 0 {
			rest := msg[i+len("Go struct field "):]
			if j := strings.Index(rest, " "); j > 0 {
				path := rest[:j]
				if k := strings.LastIndex(path, "."); k >= 0 {
					path = path[k+1:]
				}
				return parley.FieldErrorf(path, "%s", msg)
			}
		}
		return parley.Errorf(parley.EInvalid, "invalid JSON: %s", msg)
	default:
		return parley.Errorf(parley.EInvalid, "invalid JSON: %v", err)
	}
}

// ResolveParams overlays patch (may be nil) on the server's defaults, lets
// each of adds set what the wire gives beside the patch (tools, the tool
// choice, a thought switch), and validates the result against the server's
// reply cap: the one validation at the edge. An error of adds is returned
// as it is, before validation.
func (k *Core) ResolveParams(patch *ParamsPatch, adds ...func(*parley.Params) error) (parley.Params, error) {
	p := k.Defaults
	if patch != nil {
		p = patch.apply(p)
		think, err := patch.think()
		if err != nil {
			return p, err
		}
		if think != nil {
			p.Think = think
		}
		if b := patch.budget(); b != nil {
			p.ThinkBudget = *b
		}
	}
	for _, add := range adds {
		if err := add(&p); err != nil {
			return p, err
		}
	}
	if err := p.Validate(k.MaxTokensCap); err != nil {
		return p, patch.RenameSent(err)
	}
	return p, nil
}

// PatchFromQuery turns sampling parameters given as query parameters
// (?max_tokens=20&temperature=0&stop=.) into a ParamsPatch, through the same
// JSON decoder every other wire uses: each value is a JSON number, boolean
// or null when it parses as one and a JSON string otherwise, so
// temperature=hot is the usual 400 naming temperature. Repeated keys are an
// array (several stop strings). Keys that are not parameters are ignored.
func PatchFromQuery(q url.Values, skip ...string) (*ParamsPatch, error) {
	var b strings.Builder
	b.WriteByte('{')
	n := 0
	for key, vals := range q {
		if len(vals) == 0 || slices.Contains(skip, key) {
			continue
		}
		if n > 0 {
			b.WriteByte(',')
		}
		n++
		b.WriteString(JSONString(key))
		b.WriteByte(':')
		if len(vals) > 1 {
			b.WriteByte('[')
		}
		for i, v := range vals {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(queryJSONValue(v))
		}
		if len(vals) > 1 {
			b.WriteByte(']')
		}
	}
	b.WriteByte('}')
	var p ParamsPatch
	if err := DecodeJSON(strings.NewReader(b.String()), &p); err != nil {
		return nil, err
	}
	return &p, nil
}

func queryJSONValue(v string) string {
	switch v {
	case "true", "false", "null":
		return v
	}
	if f, err := strconv.ParseFloat(v, 64); err == nil && !math.IsInf(f, 0) && !math.IsNaN(f) &&
		!strings.ContainsAny(v, "xXpP_") && strings.TrimSpace(v) == v {
		// ParseFloat also takes hex and underscores, which JSON does not.
		return v
	}
	return JSONString(v)
}

// JSONString is s as a JSON string (strconv.Quote's \x escapes are not JSON).
func JSONString(s string) string {
	b, _ := json.Marshal(s) // a string always marshals; invalid UTF-8 becomes U+FFFD
	return string(b)
}

// MaxTopN bounds the alternatives a client may ask for per token (TGI's
// top_n_tokens, OpenAI's top_logprobs).
const MaxTopN = 20

// ResolveSeed fixes the seed of a sampled reply that asked for a random one,
// so the seed can be reported (TGI's details.seed) and logged, and the reply
// reproduced. Greedy replies need no seed.
func ResolveSeed(p *parley.Params) {
	if p.Seed < 0 && p.Temperature > 0 {
		p.Seed = int64(rand.Uint32N(math.MaxUint32)) // [0, 2^32-2]: 2^32-1 means "random" to llama.cpp
	}
}
