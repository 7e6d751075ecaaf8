package chat

// BuildVars exposes buildVars to the external tests, which hand the same variables to Python's jinja2.
var BuildVars = buildVars

// NewCallSplitter is NewSplitter for a reply that may call tools (the Responder sets this when it has a toolStream).
func NewCallSplitter(format ThinkFormat, prompt string) *Splitter {
	s := NewSplitter(format, prompt)
	s.calls = true
	return s
}

// SandboxStarts is how many children s has started (one per worker, one more for each that died or was killed).
func SandboxStarts(s *Sandbox) int64 { return s.pool.Started() }
