package apicore

import "time"

// Facts are what a request says about how it is served, beyond its
// messages and sampling: the model it picks and how long that model stays
// loaded after it. A handler fills them in while it decodes its request and
// passes them, as an argument, to every helper that needs one; no helper
// reads them from a context.
type Facts struct {
	// Model is the served name of the request's model (ResolveModel); ""
	// is the default model, and every request's with one model.
	Model string
	// KeepAlive is how long the model stays loaded once idle after the
	// request (Ollama's keep_alive); nil leaves it to the server's policy.
	KeepAlive *time.Duration
}
