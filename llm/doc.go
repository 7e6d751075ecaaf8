// Package llm owns the GGUF model, the llama.cpp context, tokenization,
// sampling and the decode loop. One goroutine owns the context; requests
// arrive as sequences and tokens leave on channels. It knows nothing about
// HTTP, WebSockets or sessions.
package llm

import _ "github.com/ollama/ollama/llama"
