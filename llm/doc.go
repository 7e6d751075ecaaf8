// Package llm owns the GGUF model, the llama.cpp context, tokenization,
// sampling and the decode loop. It knows nothing about HTTP, WebSockets or
// sessions.
//
// One goroutine (the loop) owns the llama.cpp context. Requests arrive through
// Generate as sequences; each active sequence is bound to a slot (a llama.cpp
// sequence id with its own share of the KV cache). Every step the loop packs
// the next token of every generating sequence, plus chunks of prompts still
// being evaluated, into one batch (continuous batching), decodes it, samples,
// and sends token events to each sequence's channel. The loop never blocks on
// a consumer: a sequence whose consumer falls too far behind is ended.
//
// A slot remembers the tokens its KV cache holds and the key (session id) of
// the request that filled it, so the next turn of a conversation evaluates only
// the tokens after the longest common prefix. A new sequence whose prompt
// shares a long prefix (a system prompt) with another slot's cache gets that
// cache copied (KvCacheSeqCp) instead of evaluating the prefix again.
//
// Every use of the cgo binding stays inside this package.
//
// The engine's files, one role each: engine.go (Open, Generate, Shutdown and
// the types they share), config.go (Config, its defaults and the checks Open
// makes before llama.cpp sees it), loop.go (the decode loop: admitting
// sequences, one batched decode step, sending events, ending sequences),
// slots.go (choosing a slot and reusing its KV cache, or another slot's, for
// the longest common prefix), sampling.go (building a sequence's sampler,
// sampling inline under the step budget, logprobs) and csampler.go (the
// grammar-constrained sampler that runs off the loop).
package llm

import _ "github.com/ollama/ollama/llama"
