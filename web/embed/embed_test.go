package embed_test

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/embed"
)

func TestInputShapes(t *testing.T) {
	for _, tc := range []struct {
		body   string
		texts  []string
		tokens [][]int
		bad    bool
	}{
		{body: `"hello"`, texts: []string{"hello"}},
		{body: `["a","b"]`, texts: []string{"a", "b"}},
		{body: `[1,2,3]`, tokens: [][]int{{1, 2, 3}}},
		{body: `[[1,2],[3]]`, tokens: [][]int{{1, 2}, {3}}},
		{body: `[]`},
		{body: `null`},
		{body: `["a",1]`, bad: true},
		{body: `[[1],"a"]`, bad: true},
		{body: `[1.5]`, bad: true},
		{body: `{"a":1}`, bad: true},
		{body: `3`, bad: true},
	} {
		var in embed.Input
		err := json.Unmarshal([]byte(tc.body), &in)
		if tc.bad {
			if err == nil {
				t.Errorf("%s: accepted as %+v", tc.body, in)
			}
			continue
		}
		if err != nil || !slices.Equal(in.Texts, tc.texts) || len(in.Tokens) != len(tc.tokens) {
			t.Errorf("%s: %+v, %v", tc.body, in, err)
			continue
		}
		for i := range tc.tokens {
			if !slices.Equal(in.Tokens[i], tc.tokens[i]) {
				t.Errorf("%s: tokens %v", tc.body, in.Tokens)
			}
		}
	}
}

func TestOpenAIValidate(t *testing.T) {
	info := embed.Info{Pooling: embed.PoolingMean, Dimensions: 64, MaxTokens: 512}
	for _, tc := range []struct {
		req   string
		field string
	}{
		{`{"input":"a"}`, ""},
		{`{"input":"a","encoding_format":"base64","dimensions":8}`, ""},
		{`{"input":"a","encoding_format":"int8"}`, "encoding_format"},
		{`{"input":[]}`, "input"},
		{`{"input":["a",""]}`, "input"},
		{`{"input":[[1],[]]}`, "input"},
		{`{"input":["a","b","c"]}`, "input"}, // over the limit of 2
		{`{"input":"a","dimensions":65}`, "dimensions"},
		{`{"input":"a","dimensions":-1}`, "dimensions"},
	} {
		var req embed.OpenAIRequest
		if err := json.Unmarshal([]byte(tc.req), &req); err != nil {
			t.Fatalf("%s: %v", tc.req, err)
		}
		err := req.Validate(2, info)
		var pe *parley.Error
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%s: %v", tc.req, err)
		case tc.field != "" && (!errors.As(err, &pe) || pe.Code != parley.EInvalid || pe.Field != tc.field):
			t.Errorf("%s: %v, want invalid %s", tc.req, err, tc.field)
		}
	}
}

// reference is llm's record of llama.cpp's embedding tool (see
// scripts/embedding-reference.sh): raw pooled vectors and the tool's
// Euclidean normalization of them.
type reference struct {
	Models map[string]struct {
		Raw [][]float64 `json:"raw"`
		L2  [][]float64 `json:"l2"`
	} `json:"models"`
}

func readReference(t *testing.T) reference {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "llm", "testdata", "embedding-reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref reference
	if err := json.Unmarshal(b, &ref); err != nil {
		t.Fatal(err)
	}
	return ref
}

func f32(v []float64) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x)
	}
	return out
}

// TestNormalizeAsLlamaCpp: the float response of llama.cpp's raw vectors is
// llama.cpp's own normalization of them, and base64 carries the same floats.
func TestNormalizeAsLlamaCpp(t *testing.T) {
	ref := readReference(t)
	for name, m := range ref.Models {
		if len(m.Raw) == 0 {
			continue
		}
		var raw [][]float32
		for _, v := range m.Raw {
			raw = append(raw, f32(v))
		}
		resp := embed.NewOpenAIResponse(name, raw, 0, "float", 7)
		b64 := embed.NewOpenAIResponse(name, raw, 0, "base64", 7)
		if resp.Object != "list" || resp.Usage.PromptTokens != 7 || len(resp.Data) != len(raw) {
			t.Fatalf("%s: %+v", name, resp)
		}
		for i, d := range resp.Data {
			got := d.Embedding.([]float32)
			norm := 0.0
			for j, x := range got {
				norm += float64(x) * float64(x)
				if math.Abs(float64(x)-m.L2[i][j]) > 1e-6 {
					t.Fatalf("%s: input %d value %d: %g, llama.cpp %g", name, i, j, x, m.L2[i][j])
				}
			}
			if math.Abs(norm-1) > 1e-5 || d.Index != i || d.Object != "embedding" {
				t.Fatalf("%s: input %d: norm %g, %+v", name, i, norm, d)
			}
			bs, err := base64.StdEncoding.DecodeString(b64.Data[i].Embedding.(string))
			if err != nil || len(bs) != 4*len(got) {
				t.Fatalf("%s: base64 %d bytes, %v", name, len(bs), err)
			}
			for j := range got {
				if v := math.Float32frombits(binary.LittleEndian.Uint32(bs[4*j:])); v != got[j] {
					t.Fatalf("%s: base64 value %d: %g, float %g", name, j, v, got[j])
				}
			}
		}
	}
}

func TestDimensions(t *testing.T) {
	raw := [][]float32{{3, 4, 12, 0}}
	got := embed.NewOpenAIResponse("m", raw, 2, "float", 1).Data[0].Embedding.([]float32)
	if !slices.Equal(got, []float32{0.6, 0.8}) {
		t.Fatalf("dimensions 2 of (3,4,12,0): %v, want (0.6, 0.8)", got)
	}
	zero := embed.NewOpenAIResponse("m", [][]float32{{0, 0}}, 0, "float", 1).Data[0].Embedding.([]float32)
	if !slices.Equal(zero, []float32{0, 0}) {
		t.Fatalf("a zero vector: %v", zero)
	}
}

func TestRerankOrder(t *testing.T) {
	req := embed.RerankRequest{Query: "q", Documents: []embed.Document{{Text: "a"}, {Text: "b"}, {Text: "c"}, {Text: "d"}}, ReturnDocuments: true}
	resp := embed.NewRerankResponse("r", req, []float32{0.5, 2, -1, 2}, 9)
	var order []int
	for _, r := range resp.Results {
		order = append(order, r.Index)
		if r.Document == nil || r.Document.Text != req.Documents[r.Index].Text {
			t.Fatalf("result %+v: not its document", r)
		}
	}
	if !slices.Equal(order, []int{1, 3, 0, 2}) || resp.Usage.TotalTokens != 9 || resp.Object != "list" {
		t.Fatalf("order %v (want best first, ties in document order), %+v", order, resp)
	}
	req.TopN, req.ReturnDocuments = 2, false
	resp = embed.NewRerankResponse("r", req, []float32{0.5, 2, -1, 2}, 9)
	if len(resp.Results) != 2 || resp.Results[0].Index != 1 || resp.Results[0].Document != nil {
		t.Fatalf("top_n 2: %+v", resp.Results)
	}
	var doc embed.Document
	for _, ok := range []string{`"x"`, `{"text":"x"}`} {
		if err := json.Unmarshal([]byte(ok), &doc); err != nil || doc.Text != "x" {
			t.Fatalf("%s: %+v %v", ok, doc, err)
		}
	}
	for _, bad := range []string{`1`, `{"title":"x"}`, `["x"]`} {
		if err := json.Unmarshal([]byte(bad), &doc); err == nil {
			t.Fatalf("%s: accepted", bad)
		}
	}
	for _, bad := range []embed.RerankRequest{
		{Documents: []embed.Document{{Text: "a"}}},
		{Query: "q"},
		{Query: "q", Documents: []embed.Document{{Text: "a"}}, TopN: -1},
		{Query: "q", Documents: make([]embed.Document, 3)},
	} {
		if err := bad.Validate(2); parley.ErrorCode(err) != parley.EInvalid {
			t.Fatalf("%+v: %v", bad, err)
		}
	}
}
