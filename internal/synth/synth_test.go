package synth

import (
	"context"
	"crypto/sha256"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ollama/ollama/fs/ggml"
	"go.uber.org/goleak"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/repo"
	"github.com/parley-chat/parley/llm"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// smallSpec is a fast model with every feature of the default one.
func smallSpec(tb testing.TB) Spec {
	s := DefaultSpec()
	s.VocabFrom = donor(tb)
	s.Layers, s.Dim, s.Heads, s.KVHeads, s.FFN, s.Context = 3, 128, 4, 2, 256, 512
	return s
}

// donor is the test model (testmodel.Path, which imports this package, so its logic is repeated here).
func donor(tb testing.TB) string {
	tb.Helper()
	if p := os.Getenv(repo.ModelEnv); p != "" {
		return p
	}
	p := repo.TestModel(repo.WorkingRoot())
	if _, err := os.Stat(p); err != nil {
		tb.Fatalf("test model: %v (set %s)", err, repo.ModelEnv)
	}
	return p
}

func decode(tb testing.TB, path string) *ggml.GGML {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	g, err := ggml.Decode(f, -1)
	if err != nil {
		tb.Fatalf("decode %s: %v", path, err)
	}
	return g
}

func fileHash(tb testing.TB, path string) [32]byte {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	return sha256.Sum256(b)
}

func TestF32ToF16(t *testing.T) {
	tests := []struct {
		in   float32
		want uint16
	}{
		{0, 0x0000},
		{float32(math.Copysign(0, -1)), 0x8000},
		{1, 0x3c00},
		{-2, 0xc000},
		{0.5, 0x3800},
		{0.1, 0x2e66},                    // 0.0999755859375, nearest
		{65504, 0x7bff},                  // largest finite half
		{65519, 0x7bff},                  // rounds down to it
		{65520, 0x7c00},                  // halfway to the next power rounds to even: Inf
		{1e6, 0x7c00},                    // overflow
		{6.103515625e-05, 0x0400},        // smallest normal half
		{5.960464477539063e-08, 0x0001},  // smallest subnormal half
		{2.9802322387695312e-08, 0x0000}, // half of it: ties to even (0)
		{4.470348358154297e-08, 0x0001},  // 0.75 of it: rounds up
		{1e-10, 0x0000},                  // underflow
		{1.0009765625, 0x3c01},           // 1 + 2^-10: exact
		{1.00048828125, 0x3c00},          // 1 + 2^-11: tie, even is 1
		{1.00146484375, 0x3c02},          // 1 + 3*2^-11: tie, even is up
		{float32(math.Inf(1)), 0x7c00},
		{float32(math.Inf(-1)), 0xfc00},
	}
	for _, tt := range tests {
		if got := f32ToF16(tt.in); got != tt.want {
			t.Errorf("f32ToF16(%g) = %#04x, want %#04x", tt.in, got, tt.want)
		}
	}
	if got := f32ToF16(float32(math.NaN())); got&0x7c00 != 0x7c00 || got&0x3ff == 0 {
		t.Errorf("f32ToF16(NaN) = %#04x, want a NaN", got)
	}
}

func TestSpecValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Spec)
		want   string // substring of the error; "" = valid
	}{
		{"default", func(*Spec) {}, ""},
		{"dim not multiple of heads", func(s *Spec) { s.Heads = 7 }, "not a multiple of heads"},
		{"heads not multiple of kv", func(s *Spec) { s.KVHeads = 2 }, "not a multiple of kv-heads"},
		{"odd head size", func(s *Spec) { s.Dim, s.Heads, s.KVHeads = 9, 3, 3 }, "even"},
		{"zero layers", func(s *Spec) { s.Layers = 0 }, "positive"},
		{"bad type", func(s *Spec) { s.Type = "q4_0" }, "f16 or f32"},
		{"nan std", func(s *Spec) { s.Std = math.NaN() }, "std"},
		{"no vocab", func(s *Spec) { s.VocabFrom = "" }, "vocabulary"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := DefaultSpec()
			s.VocabFrom = "x.gguf"
			tt.change(&s)
			err := s.validate()
			if tt.want == "" && err != nil {
				t.Fatalf("validate: %v", err)
			}
			if tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("validate = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestWriteShapesAndVocabulary(t *testing.T) {
	for _, typ := range []string{"f16", "f32"} {
		t.Run(typ, func(t *testing.T) {
			spec := smallSpec(t)
			spec.Type = typ
			out := filepath.Join(t.TempDir(), "m.gguf")
			info, err := Write(context.Background(), out, spec)
			if err != nil {
				t.Fatal(err)
			}
			g := decode(t, out)
			kv := g.KV()
			donor := decode(t, spec.VocabFrom).KV()

			if got := kv.Architecture(); got != "llama" {
				t.Errorf("architecture %q", got)
			}
			for key, want := range map[string]uint64{
				"block_count": 3, "embedding_length": 128, "feed_forward_length": 256,
				"attention.head_count": 4, "attention.head_count_kv": 2, "context_length": 512,
				"rope.dimension_count": 32, "vocab_size": 512,
			} {
				if got := kv.Uint(key); uint64(got) != want {
					t.Errorf("%s = %d, want %d", key, got, want)
				}
			}
			if got := kv.Float("rope.freq_base"); got != 100000 {
				t.Errorf("rope.freq_base = %g", got)
			}
			if got := kv.String("general.description"); got != spec.Description() {
				t.Errorf("description %q", got)
			}
			// The vocabulary is the donor's, token for token.
			for _, key := range []string{"tokenizer.ggml.tokens"} {
				if !slices.Equal(kv.Strings(key), donor.Strings(key)) {
					t.Errorf("%s differs from the donor's", key)
				}
			}
			if !slices.Equal(kv.Floats("tokenizer.ggml.scores"), donor.Floats("tokenizer.ggml.scores")) ||
				!slices.Equal(kv.Ints("tokenizer.ggml.token_type"), donor.Ints("tokenizer.ggml.token_type")) {
				t.Error("scores or token types differ from the donor's")
			}
			if kv.String("tokenizer.ggml.model") != donor.String("tokenizer.ggml.model") ||
				kv.Uint("tokenizer.ggml.eos_token_id") != donor.Uint("tokenizer.ggml.eos_token_id") {
				t.Error("tokenizer model or eos id differ from the donor's")
			}

			wantKind := uint32(ggml.TensorTypeF16)
			if typ == "f32" {
				wantKind = uint32(ggml.TensorTypeF32)
			}
			shapes := map[string][]uint64{}
			var params uint64
			for _, tn := range g.Tensors().Items() {
				shapes[tn.Name] = tn.Shape
				params += tn.Elements()
				isNorm := strings.HasSuffix(tn.Name, "norm.weight")
				if isNorm && tn.Kind != uint32(ggml.TensorTypeF32) || !isNorm && tn.Kind != wantKind {
					t.Errorf("%s has type %s", tn.Name, tn.Type())
				}
			}
			if len(shapes) != 3+9*3 || info.Tensors != len(shapes) {
				t.Errorf("%d tensors (info %d), want %d", len(shapes), info.Tensors, 3+9*3)
			}
			for name, want := range map[string][]uint64{
				"token_embd.weight": {128, 512}, "output.weight": {128, 512}, "output_norm.weight": {128},
				"blk.2.attn_q.weight": {128, 128}, "blk.2.attn_k.weight": {128, 64}, "blk.2.attn_v.weight": {128, 64},
				"blk.2.attn_output.weight": {128, 128}, "blk.2.ffn_gate.weight": {128, 256},
				"blk.2.ffn_up.weight": {128, 256}, "blk.2.ffn_down.weight": {256, 128}, "blk.2.ffn_norm.weight": {128},
			} {
				if !slices.Equal(shapes[name], want) {
					t.Errorf("%s shape %v, want %v", name, shapes[name], want)
				}
			}
			if params != info.Parameters || uint64(kv.ParameterCount()) != params {
				t.Errorf("parameters: tensors %d, info %d, metadata %d", params, info.Parameters, kv.ParameterCount())
			}
			st, err := os.Stat(out)
			if err != nil {
				t.Fatal(err)
			}
			if st.Size() != info.Bytes || uint64(st.Size()) < params*uint64(ggml.TensorType(wantKind).TypeSize()) {
				t.Errorf("file is %d bytes (info %d) for %d parameters", st.Size(), info.Bytes, params)
			}
		})
	}
}

// TestPaddedVocabulary: -vocab-size keeps the donor's tokens, scores and
// types in front, and adds ordinary tokens scored below them, with rows in
// both projections.
func TestPaddedVocabulary(t *testing.T) {
	spec := smallSpec(t)
	spec.VocabSize = 1000
	out := filepath.Join(t.TempDir(), "m.gguf")
	if _, err := Write(context.Background(), out, spec); err != nil {
		t.Fatal(err)
	}
	g := decode(t, out)
	kv, dkv := g.KV(), decode(t, spec.VocabFrom).KV()
	tokens, scores, types := kv.Strings("tokenizer.ggml.tokens"), kv.Floats("tokenizer.ggml.scores"), kv.Ints("tokenizer.ggml.token_type")
	if kv.Uint("vocab_size") != 1000 || len(tokens) != 1000 || len(scores) != 1000 || len(types) != 1000 {
		t.Fatalf("vocab_size %d, %d tokens, %d scores, %d types; want 1000", kv.Uint("vocab_size"), len(tokens), len(scores), len(types))
	}
	if !slices.Equal(tokens[:512], dkv.Strings("tokenizer.ggml.tokens")) || !slices.Equal(scores[:512], dkv.Floats("tokenizer.ggml.scores")) ||
		!slices.Equal(types[:512], dkv.Ints("tokenizer.ggml.token_type")) {
		t.Error("the donor's tokens, scores or types changed")
	}
	seen := map[string]bool{}
	for _, tok := range tokens {
		if seen[tok] {
			t.Fatalf("token %q twice", tok)
		}
		seen[tok] = true
	}
	low := slices.Min(scores[:512])
	for i := 512; i < 1000; i++ {
		if !strings.HasPrefix(tokens[i], padPrefix) || types[i] != tokenTypeNormal || scores[i] >= low {
			t.Fatalf("token %d: %q type %d score %g", i, tokens[i], types[i], scores[i])
		}
	}
	for _, tn := range g.Tensors().Items() {
		if (tn.Name == "token_embd.weight" || tn.Name == "output.weight") && !slices.Equal(tn.Shape, []uint64{128, 1000}) {
			t.Errorf("%s shape %v", tn.Name, tn.Shape)
		}
	}
	spec.VocabSize = 100
	if _, err := Write(context.Background(), filepath.Join(t.TempDir(), "m.gguf"), spec); err == nil || !strings.Contains(err.Error(), "below the 512 tokens") {
		t.Errorf("a vocab-size below the donor's: %v", err)
	}
}

func TestDeterministic(t *testing.T) {
	dir := t.TempDir()
	spec := smallSpec(t)
	a, b, c := filepath.Join(dir, "a.gguf"), filepath.Join(dir, "b.gguf"), filepath.Join(dir, "c.gguf")
	for _, p := range []string{a, b} {
		if _, err := Write(context.Background(), p, spec); err != nil {
			t.Fatal(err)
		}
	}
	spec.Seed++
	if _, err := Write(context.Background(), c, spec); err != nil {
		t.Fatal(err)
	}
	if fileHash(t, a) != fileHash(t, b) {
		t.Error("the same seed wrote different bytes")
	}
	if fileHash(t, a) == fileHash(t, c) {
		t.Error("different seeds wrote the same bytes")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 3 {
		t.Errorf("folder holds %d entries, want 3 (no temporary files left)", len(entries))
	}
}

// TestLlamaDecodesCycle loads a synthetic model with llama.cpp (through the
// llm package) and decodes greedily: the reply must run to its cap without an
// end-of-generation token, and each token must be σ of the one before it, the
// cycle the weights encode (see tensors). That is the property the benchmark
// relies on: replies never end early and never repeat one token.
func TestLlamaDecodesCycle(t *testing.T) {
	padded := smallSpec(t)
	padded.VocabSize = 2048
	for name, spec := range map[string]Spec{"donor's vocabulary": smallSpec(t), "padded to 2048": padded} {
		t.Run(name, func(t *testing.T) { decodesCycle(t, spec) })
	}
}

func decodesCycle(t *testing.T, spec Spec) {
	out := filepath.Join(t.TempDir(), "m.gguf")
	if _, err := Write(context.Background(), out, spec); err != nil {
		t.Fatal(err)
	}
	// One thread: the property does not depend on it, and two threads on a
	// machine whose cores are all busy wait for each other at every op.
	eng, err := llm.Open(llm.Config{Path: out, ContextLength: 256, Parallel: 1, Threads: 1})
	if err != nil {
		t.Fatalf("llama.cpp does not load the synthetic model: %v", err)
	}
	defer eng.Close()
	wantVocab := max(512, spec.VocabSize)
	if info := eng.Info(); info.Layers != spec.Layers || info.VocabSize != wantVocab || info.Architecture != "llama" {
		t.Errorf("model info %+v, want vocabulary %d", info, wantVocab)
	}

	prompt, got := greedyTokens(t, eng, 48)

	kv := decode(t, out).KV()
	next := cycle(spec.Seed, vocabulary{tokens: kv.Strings("tokenizer.ggml.tokens"), types: kv.Ints("tokenizer.ggml.token_type")})
	if len(next) < 50 {
		t.Fatalf("cycle of %d tokens", len(next))
	}
	if _, ok := next[got[0]]; !ok {
		t.Fatalf("first token %d is not in the cycle", got[0])
	}
	for i := 1; i < len(got); i++ {
		if want := next[got[i-1]]; got[i] != want {
			t.Fatalf("token %d is %d, want σ(previous) = %d; reply %v", i, got[i], want, got)
		}
	}
	// The donor's tokenization: padding adds no token that text can hold.
	if want := donorTokens(t, "Once upon a time"); !slices.Equal(prompt, want) {
		t.Errorf("prompt tokenizes to %v, the donor to %v", prompt, want)
	}

	// Tokenization-stable: the prompt followed by the reply's text tokenizes
	// to the prompt's tokens followed by exactly the generated ones, so the
	// next turn of a conversation finds this one in the KV cache.
	var text strings.Builder
	for _, tok := range got {
		text.WriteString(eng.TokenText(tok))
	}
	again, err := eng.Tokenize("Once upon a time" + text.String())
	if err != nil {
		t.Fatal(err)
	}
	if want := append(slices.Clone(prompt), got...); !slices.Equal(again, want) {
		t.Errorf("prompt + reply %q re-tokenizes to\n%v, want\n%v", text.String(), again, want)
	}
}

// donorTokens tokenizes text with the donor model itself.
func donorTokens(t *testing.T, text string) []int {
	t.Helper()
	eng, err := llm.Open(llm.Config{Path: donor(t), ContextLength: 64, Parallel: 1, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	toks, err := eng.Tokenize(text)
	if err != nil {
		t.Fatal(err)
	}
	return toks
}

// TestQuantizedKVCache: the synthetic model (head size 32, one quantized
// block) decodes its cycle with a q8_0 and a q4_0 KV cache and flash
// attention. stories260K's heads (8 values) cannot be quantized; llm's tests
// check that refusal.
func TestQuantizedKVCache(t *testing.T) {
	spec := smallSpec(t)
	out := filepath.Join(t.TempDir(), "m.gguf")
	if _, err := Write(context.Background(), out, spec); err != nil {
		t.Fatal(err)
	}
	kv := decode(t, out).KV()
	next := cycle(spec.Seed, vocabulary{tokens: kv.Strings("tokenizer.ggml.tokens"), types: kv.Ints("tokenizer.ggml.token_type")})
	for _, typ := range []string{"q8_0", "q4_0"} {
		t.Run(typ, func(t *testing.T) {
			eng, err := llm.Open(llm.Config{Path: out, ContextLength: 256, Parallel: 2, Threads: 1,
				FlashAttention: "on", KVCacheType: typ})
			if err != nil {
				t.Fatalf("open with a %s KV cache: %v", typ, err)
			}
			defer eng.Close()
			_, got := greedyTokens(t, eng, 32)
			// The cycle the weights encode survives the quantized cache:
			// the keys and values only feed attention, and each step's
			// token is decided by the previous token's embedding.
			for i := 1; i < len(got); i++ {
				if want := next[got[i-1]]; got[i] != want {
					t.Fatalf("token %d is %d, want σ(previous) = %d; reply %v", i, got[i], want, got)
				}
			}
		})
	}
}

// greedyTokens decodes n tokens greedily after "Once upon a time" and
// returns the prompt's tokens and the generated ones; the reply must run to
// its cap without a special token.
func greedyTokens(t *testing.T, eng *llm.Engine, n int) (prompt, got []int) {
	t.Helper()
	prompt, err := eng.Tokenize("Once upon a time")
	if err != nil {
		t.Fatal(err)
	}
	params := parley.DefaultParams()
	params.Temperature, params.RepeatPenalty, params.MaxTokens, params.Seed = 0, 1, n, 1
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // catches a hang only
	defer cancel()
	events, err := eng.Generate(ctx, parley.GenerateRequest{Tokens: prompt, Params: params})
	if err != nil {
		t.Fatal(err)
	}
	var last parley.Event
	for ev := range events {
		if ev.Done {
			last = ev
			break
		}
		got = append(got, ev.Token.ID)
		if ev.Token.Special {
			t.Errorf("special token %d generated", ev.Token.ID)
		}
	}
	if last.Finish != parley.FinishLength || len(got) != n {
		t.Fatalf("finish %q after %d tokens, want length after %d (err %v)", last.Finish, len(got), n, last.Err)
	}
	return prompt, got
}
