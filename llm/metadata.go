package llm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/ollama/ollama/fs/ggml"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/llm/offload"
	"github.com/parley-chat/parley/llm/source"
)

// GGUF token types (tokenizer.ggml.token_type).
const (
	tokenTypeNormal      = 1
	tokenTypeUnknown     = 2
	tokenTypeControl     = 3
	tokenTypeUserDefined = 4
	tokenTypeUnused      = 5
	tokenTypeByte        = 6
)

// vocabInfo is what the engine needs from the GGUF vocabulary beyond llama.cpp.
type vocabInfo struct {
	tokens []string
	types  []int32
}

func (v vocabInfo) size() int { return len(v.tokens) }

// special reports whether tok is a control token (role markers, BOS/EOS).
func (v vocabInfo) special(tok int) bool {
	if tok < 0 || tok >= len(v.types) {
		return false
	}
	return v.types[tok] == tokenTypeControl
}

// neutralized reports whether a client's text must not spell the token
// (see parley.ModelInfo.ControlTokens): control tokens, and user-defined
// ones (such as <tool_call>), which llama.cpp finds in text even when told
// not to parse special tokens. Single characters are never broken up, nor
// are user-defined tokens that are only whitespace or only letters and
// digits (some vocabularies add runs of spaces or words as user-defined
// tokens: they forge nothing, and breaking them up would change the text).
func neutralized(typ int32, text string) bool {
	if utf8.RuneCountInString(text) < 2 {
		return false
	}
	switch typ {
	case tokenTypeControl:
		return true
	case tokenTypeUserDefined:
		return strings.ContainsFunc(text, func(r rune) bool { return !unicode.IsSpace(r) && !unicode.IsLetter(r) && !unicode.IsDigit(r) }) &&
			!strings.ContainsFunc(text, unicode.IsSpace)
	}
	return false
}

type metadata struct {
	info  parley.ModelInfo
	vocab vocabInfo
	// headK and headV are the values per attention head in the K and V
	// caches (0 when the metadata does not say).
	headK, headV int
	// offload is the model's side of the GPU fitting: blocks' weights and
	// the output head (the KV cache and compute buffers depend on the
	// context and are filled in by Open), and shape is its dimensions.
	offload offload.Model
	shape   offload.Shape
	headsKV int // key/value heads (grouped-query attention)
	embed   embedMeta
}

// readMetadata reads the model's facts from its GGUF header in pure Go, so a
// file that is not a GGUF gets a clear error before llama.cpp sees it.
func readMetadata(path string) (metadata, error) {
	if err := source.CheckGGUF(path); err != nil {
		return metadata{}, err
	}
	f, err := os.Open(path)
	if err != nil {
		return metadata{}, fmt.Errorf("model file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return metadata{}, fmt.Errorf("model file: %w", err)
	}
	g, err := ggml.Decode(f, -1)
	if err != nil {
		return metadata{}, fmt.Errorf("model file %s: damaged GGUF header: %w", filepath.Base(path), err)
	}
	kv := g.KV()
	arch := kv.Architecture()
	if arch == "" {
		return metadata{}, errors.New("model file: no general.architecture in its metadata")
	}
	params := kv.ParameterCount()
	if params == 0 {
		for _, t := range g.Tensors().Items() {
			params += t.Elements()
		}
	}
	quant := kv.FileType().String()
	if quant == "" || quant == "unknown" {
		quant = dominantTensorType(g.Tensors().Items())
	}
	name := kv.String("general.name")
	if name == "" {
		name = strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	}
	vocab := vocabInfo{tokens: kv.Strings("tokenizer.ggml.tokens"), types: kv.Ints("tokenizer.ggml.token_type")}
	tokenText := func(key string) string {
		id, ok := kv.Value("tokenizer.ggml." + key).(uint32)
		if !ok || int(id) >= len(vocab.tokens) {
			return ""
		}
		return vocab.tokens[id]
	}
	var controls []string
	for i, typ := range vocab.types {
		if i < len(vocab.tokens) && neutralized(typ, vocab.tokens[i]) {
			controls = append(controls, vocab.tokens[i])
		}
	}
	info := parley.ModelInfo{
		ControlTokens:   controls,
		Name:            name,
		Architecture:    arch,
		Parameters:      params,
		Quantization:    quant,
		SizeBytes:       st.Size(),
		Layers:          int(kv.BlockCount()),
		EmbeddingLength: int(kv.EmbeddingLength()),
		VocabSize:       len(vocab.tokens),
		TrainContext:    int(kv.ContextLength()),
		ChatTemplate:    kv.ChatTemplate(),
		ChatTemplates:   chatTemplateVariants(kv),
		BOSToken:        tokenText("bos_token_id"),
		EOSToken:        tokenText("eos_token_id"),
	}
	md := metadata{info: info, vocab: vocab, headK: int(kv.EmbeddingHeadCountK()), headV: int(kv.EmbeddingHeadCountV())}
	md.headsKV = int(kv.HeadCountKVMax())
	md.embed = readEmbedMeta(kv)
	md.info.Pooling = poolingNames[md.embed.pooling]
	md.shape = offload.Shape{
		Embedding:   int(kv.EmbeddingLength()),
		FeedForward: int(kv.Uint("feed_forward_length")),
		Heads:       int(kv.HeadCountMax()),
		Vocab:       len(vocab.tokens),
	}
	md.offload = offloadModel(g.Tensors().GroupLayers(), info.Layers)
	return md, nil
}

// offloadModel sums the tensor sizes of each block and of the output head.
// A model whose output projection is tied to the token embeddings gets a
// copy of them on the device (llama.cpp duplicates the tensor), so they
// count as the head's.
func offloadModel(groups map[string]ggml.Layer, layers int) offload.Model {
	m := offload.Model{Layers: layers, LayerBytes: make([]uint64, layers)}
	for i := range layers {
		m.LayerBytes[i] = groups[fmt.Sprintf("blk.%d", i)].Size()
	}
	out := groups["output"]
	m.OutputBytes = out.Size() + groups["output_norm"].Size()
	if _, ok := out["weight"]; !ok {
		if embd, ok := groups["token_embd"]["weight"]; ok {
			m.OutputBytes += embd.Size()
		}
	}
	return m
}

// dominantTensorType names the tensor type holding the most parameters, for
// files that do not declare general.file_type.
func dominantTensorType(ts []*ggml.Tensor) string {
	count := map[string]uint64{}
	best := ""
	for _, t := range ts {
		name := strings.ToUpper(t.Type())
		count[name] += t.Elements()
		if best == "" || count[name] > count[best] {
			best = name
		}
	}
	if best == "" {
		return "unknown"
	}
	return best
}

// chatTemplateVariants returns the GGUF's named chat templates (tokenizer.chat_template.NAME, as llama.cpp's
// converter writes a model's tool_use or rag template), or nil.
func chatTemplateVariants(kv ggml.KV) map[string]string {
	const prefix = "tokenizer.chat_template."
	var out map[string]string
	for k, v := range kv {
		src, ok := v.(string)
		if !ok || !strings.HasPrefix(k, prefix) || src == "" {
			continue
		}
		if out == nil {
			out = make(map[string]string)
		}
		out[strings.TrimPrefix(k, prefix)] = src
	}
	return out
}
