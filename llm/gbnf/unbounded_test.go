package gbnf_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/parley-chat/parley/llm/gbnf"
)

// TestUnboundedBounds: the bounds schema generators write for "no bound"
// (zod 4's safe-integer range, Number.MAX_VALUE, 1e308) pass the check and
// are stripped before conversion; every other bound is kept, in place.
func TestUnboundedBounds(t *testing.T) {
	for _, tc := range []struct{ name, schema, want string }{
		{"zod int", `{"type":"integer","minimum":-9007199254740991,"maximum":9007199254740991}`, `{"type":"integer"}`},
		{"zod nonnegative int", `{"type":"integer","minimum":0,"maximum":9007199254740991}`, `{"type":"integer","minimum":0}`},
		{"zod int max", `{"type":"integer","minimum":-9007199254740991,"maximum":100}`, `{"type":"integer","maximum":100}`},
		{"MAX_VALUE", `{"type":"number","minimum":-1.7976931348623157e308,"exclusiveMaximum":1.7976931348623157e308}`, `{"type":"number"}`},
		{"1e308", `{"type":"integer","exclusiveMinimum":-1e308,"maximum":1e308}`, `{"type":"integer"}`},
		{"nested, order kept", `{"type":"object","properties":{"z":{"type":"integer","maximum":9007199254740991},"a":{"type":"array","items":{"type":"integer","minimum":-9007199254740991}}},"required":["z","a"]}`,
			`{"type":"object","properties":{"z":{"type":"integer"},"a":{"type":"array","items":{"type":"integer"}}},"required":["z","a"]}`},
		{"a property named maximum stays", `{"type":"object","properties":{"maximum":{"type":"integer","maximum":5}}}`, `{"type":"object","properties":{"maximum":{"type":"integer","maximum":5}}}`},
		{"values are not schemas", `{"enum":[{"maximum":1e308}],"const":{"minimum":1e308}}`, `{"enum":[{"maximum":1e308}],"const":{"minimum":1e308}}`},
		{"ordinary bounds stay", `{"type":"integer","minimum":-5,"maximum":1000000}`, `{"type":"integer","minimum":-5,"maximum":1000000}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := gbnf.CheckSchema([]byte(tc.schema), gbnf.Limits{}); err != nil {
				t.Fatalf("refused: %v", err)
			}
			got := string(gbnf.StripUnbounded([]byte(tc.schema)))
			if got != tc.want {
				t.Fatalf("stripped to\n%s\nwant\n%s", got, tc.want)
			}
			if !json.Valid([]byte(got)) {
				t.Fatalf("not JSON: %s", got)
			}
		})
	}
}

// TestHugeBoundsStillRefused: a bound short of "no bound" but past what
// llama.cpp's digit rules handle is still refused, naming the field.
func TestHugeBoundsStillRefused(t *testing.T) {
	for _, s := range []string{
		`{"type":"object","properties":{"age":{"type":"integer","minimum":-9007199254740990,"maximum":9007199254740990}}}`,
		`{"type":"object","properties":{"age":{"type":"integer","minimum":0,"maximum":5e15}}}`,
	} {
		err := gbnf.CheckSchema([]byte(s), gbnf.Limits{})
		if err == nil || !strings.Contains(err.Error(), "properties.age") {
			t.Errorf("%s: %v, want a refusal naming properties.age", s, err)
		}
	}
}
