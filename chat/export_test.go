package chat

import "github.com/parley-chat/parley"

// BuildVars exposes buildVars to the external tests, which hand the same variables to Python's jinja2.
func BuildVars(msgs []parley.Message, opt RenderOptions, bos, eos string, now int64, thinkingKey bool) ([]byte, error) {
	return buildVars(msgs, opt, bos, eos, now, thinkingKey, false)
}

// NewCallSplitter is NewSplitter for a reply that may call tools (the Responder sets this when it has a toolStream).
func NewCallSplitter(format ThinkFormat, prompt string) *Splitter {
	s := NewSplitter(format, prompt)
	s.calls = true
	return s
}

// SandboxStarts is how many children s has started (one per worker, one more for each that died or was killed).
func SandboxStarts(s *Sandbox) int64 { return s.pool.Started() }
