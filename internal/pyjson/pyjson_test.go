package pyjson_test

import (
	"math"
	"testing"

	"github.com/parley-chat/parley/internal/pyjson"
)

// The wanted texts are Python 3's json.dumps(..., ensure_ascii=False) of the same values.
func TestText(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		f        pyjson.Format
		want     string
	}{
		{"compact", `{"b":[1,2.5,{}],"a":"é\"\\\n\u0001<&>","c":[],"d":null,"e":true}`, pyjson.Compact,
			`{"b": [1, 2.5, {}], "a": "é\"\\\n\u0001<&>", "c": [], "d": null, "e": true}`},
		{"indent", `{"b":[1,2.5,{}],"a":"x","c":[]}`, pyjson.Indented(2),
			"{\n  \"b\": [\n    1,\n    2.5,\n    {}\n  ],\n  \"a\": \"x\",\n  \"c\": []\n}"},
		{"indent 0 is compact", `[1,[2]]`, pyjson.Indented(0), `[1, [2]]`},
		{"numbers keep their text", `[1e-7,1.0E16,3.00]`, pyjson.Compact, `[1e-7, 1.0E16, 3.00]`},
		{"invalid is unchanged", `{"a":`, pyjson.Compact, `{"a":`},
		{"text after the value is dropped", `{"a":1}}`, pyjson.Compact, `{"a": 1}`},
	} {
		if got := pyjson.Text([]byte(tc.in), tc.f); got != tc.want {
			t.Errorf("%s: Text(%q) = %q, want %q", tc.name, tc.in, got, tc.want)
		}
	}
}

func TestString(t *testing.T) {
	for in, want := range map[string]string{
		"plain":                 `"plain"`,
		"é 日本 <&>":              `"é 日本 <&>"`,
		"q\"b\\n\nr\rt\tb\bf\f": `"q\"b\\n\nr\rt\tb\bf\f"`,
		"\x00\x1f\x7f":          `"\u0000\u001f` + "\x7f\"",
		"bad \xff byte":         "\"bad \xff byte\"", // copied as it is, as nlohmann's dump and a template's own text do
	} {
		if got := pyjson.String(in); got != want {
			t.Errorf("String(%q) = %q, want %q", in, got, want)
		}
	}
}

// Python's float repr, as json.dumps writes each of these.
func TestFloat(t *testing.T) {
	for in, want := range map[float64]string{
		1e-7: "1e-07", 1e16: "1e+16", 3: "3.0", -0.5: "-0.5", 123456789.125: "123456789.125", 1234567.5: "1234567.5",
		0.0001: "0.0001", 0.00001234: "1.234e-05", 1.5e20: "1.5e+20", 1e21: "1e+21",
		12345678901234567.0: "1.2345678901234568e+16", 0.30000000000000004: "0.30000000000000004",
		math.Inf(1): "Infinity", math.Inf(-1): "-Infinity",
	} {
		if got := pyjson.Float(in); got != want {
			t.Errorf("Float(%v) = %q, want %q", in, got, want)
		}
	}
}
