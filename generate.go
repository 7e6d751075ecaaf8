package parley

import (
	"errors"
	"time"
)

// GenerateRequest asks the engine for one reply to a tokenized prompt.
type GenerateRequest struct {
	// Key ties the request to a KV-cache slot across requests (a session id).
	// Requests with the same key reuse the longest common prefix of the tokens
	// that slot already holds. "" means a stateless request: any free slot.
	// The engine takes it within Scope (ScopedKey).
	Key string
	// Scope is the request's cache scope (ReplyRequest.CacheScope's): it
	// reuses, copies and restores only KV caches of its own scope. "" is
	// the anonymous user's.
	Scope string
	// Tokens is the whole prompt, as returned by Tokenize (BOS included when
	// the model wants one). Never empty.
	Tokens []int
	// Params: MaxTokens and the sampling fields are applied by the engine.
	// Stop strings are not: the chat layer matches them on text and cancels.
	Params Params
	// Images are the prompt's images, in order: each ImageToken in Tokens
	// stands for the next one. The engine puts the image's embeddings there
	// (as many positions as the model's projector makes of it). Only a model
	// loaded with a projector takes them.
	Images []Image
	// Client names the client the request comes from (its address, or its
	// named user: Caller.Client): the engine queues requests
	// fairly between clients and caps per client what one client's requests
	// may hold (grammar samplers that overran their step budget). "" is one
	// client of its own.
	Client string
	// Stateless: the request belongs to no stored conversation (see
	// ReplyRequest.Stateless): the engine keeps its slot's KV state in RAM
	// only once the slot goes to another request (no KV swap to disk).
	Stateless bool
}

// ImageToken stands in GenerateRequest.Tokens for one of its Images.
const ImageToken = -1

// ImageMarker is the text a rendered prompt holds where an image goes (llama.cpp's mtmd default marker): the
// engine's TokenizeImages turns each into an ImageToken.
const ImageMarker = "<__media__>"

// Image is one image of a prompt, decoded (media.Decoded's pixels).
type Image struct {
	// Key identifies the image for the engine's caches: media.CacheKey of
	// the user and the image's content hash, so that equal keys are the same
	// image of the same user, and no cache entry serves another user.
	Key           [32]byte
	Width, Height int
	RGB           []byte // Width*Height*3 bytes, row by row
}

// Device is where the engine runs the model: the ggml backend device that
// holds the offloaded layers, or the CPU when none are.
type Device struct {
	Backend          string `json:"backend"`            // ggml device name, e.g. "CUDA0" or "CPU"
	Name             string `json:"name"`               // its description, e.g. "NVIDIA H100 80GB HBM3"
	Type             string `json:"type"`               // "gpu" or "cpu"
	MemoryTotal      uint64 `json:"memory_total_bytes"` // device memory (host memory for the CPU)
	MemoryFreeAtLoad uint64 `json:"memory_free_at_load_bytes"`
	GPULayers        int    `json:"gpu_layers"`       // n_gpu_layers asked of llama.cpp (0: CPU only)
	LayersOffloaded  int    `json:"layers_offloaded"` // of them, layers the model has (blocks plus the output head)
	LayersTotal      int    `json:"layers_total"`     // offloadable layers: blocks plus the output head
	FlashAttention   bool   `json:"flash_attention"`  // as resolved from on, off or auto
	KVUnified        bool   `json:"kv_unified"`       // one KV buffer shared by all slots (else one stream per slot)
	HugePagesBytes   uint64 `json:"huge_pages_bytes"` // weights read into memory on 2 MiB pages (0: the file is mapped)
}

// ModelInfo describes the loaded model.
type ModelInfo struct {
	Path            string        `json:"path"`
	Name            string        `json:"name"`         // general.name, or the file's base name
	Architecture    string        `json:"architecture"` // general.architecture, e.g. "llama"
	Parameters      uint64        `json:"parameters"`   // total parameter count
	Quantization    string        `json:"quantization"` // file type, e.g. "F32", "Q4_K_M"
	SizeBytes       int64         `json:"size_bytes"`
	Layers          int           `json:"layers"`
	EmbeddingLength int           `json:"embedding_length"`
	VocabSize       int           `json:"vocab_size"`
	TrainContext    int           `json:"train_context"`  // context length the model was trained with
	ContextLength   int           `json:"context_length"` // tokens per session (slot) as configured
	Parallel        int           `json:"parallel"`       // slots that generate at once
	ChatTemplate    string        `json:"chat_template"`  // tokenizer.chat_template, "" when absent
	BOSToken        string        `json:"bos_token"`      // text of the BOS token, "" when none
	EOSToken        string        `json:"eos_token"`      // text of the EOS token, "" when none
	LoadTime        time.Duration `json:"load_time"`
	Device          Device        `json:"device"` // where the model runs
	// ControlTokens are the texts of the vocabulary's control tokens (role
	// markers, BOS/EOS) and of its user-defined tokens that are markup
	// (such as <tool_call>). The tokenizer turns these texts into the tokens
	// themselves, so no string a client writes may carry them verbatim.
	ControlTokens []string `json:"-"`
	// Vision reports that the model sees images: it was loaded with a vision projector (--mmproj), so its
	// requests may carry image parts.
	Vision bool `json:"vision"`
	// ChatTemplates are the named variants (tokenizer.chat_template.NAME), such as tool_use, which renders when a
	// request has tools.
	ChatTemplates map[string]string `json:"-"`
	// Pooling is an embedding model's or reranker's pooling type (mean,
	// cls, last or rank, from <arch>.pooling_type); "" for a chat model.
	Pooling string `json:"pooling,omitempty"`
}

// Caller is who a request comes from: the user it acts for and the client
// that sent it. The web edge names it once per request; every layer that
// acts per user or per client (sessions, their stores' shares, the
// engine's fair queue) takes it as an argument or a field.
type Caller struct {
	// User is the user the request acts for: the name its API key maps to;
	// "" is the one anonymous user of a server without named users.
	// Sessions record the user that created them, and a user reaches only
	// its own.
	User string
	// Client names the client the request comes from (its user's name, or
	// its address): sessions count their creation rate and their store's
	// share per client, and the engine queues fairly between clients.
	Client string
}

// ErrShuttingDown is the cause (context.Cause) of the cancellation of the
// requests and turns a server cancels when its drain ends: what was still
// running, or still waiting for the engine, when the server shut down.
var ErrShuttingDown = errors.New("the server shut down")

// LoadProgress is told how a model load a request waits for goes: the
// model's name and the fraction loaded, 0 to 1 (ReplyRequest.LoadProgress).
// It is called from the loading goroutine and must not block.
type LoadProgress func(model string, fraction float64)
