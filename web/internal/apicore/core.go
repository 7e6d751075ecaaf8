// Package apicore is what the HTTP API families share: decoding and
// validating a request's sampling parameters once, picking the request's
// model, starting a chat or a completion and relaying or collecting its
// reply, the stream writer, the status table, and the tool definitions
// several families take. It knows no family: each family package owns its
// wire types and its error body, and web's route table hands the core what
// it needs from the server (Core's hooks).
package apicore

import (
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/toolloop"
)

// Tokenizer counts the tokens of a prompt (*llm.Engine satisfies it). It
// must be safe for concurrent use.
type Tokenizer interface {
	Tokenize(text string) ([]int, error)
}

// Meter records one reply's events in the server's metrics; one per reply,
// used by the goroutine that reads the reply.
type Meter interface {
	Observe(ev parley.Event)
}

// Core is the server's side of every API family: its settings, the engine
// and models behind it, and the hooks into the server (readiness, metrics,
// error bodies). The server fills it once, before its routes are mounted;
// it is read-only after.
type Core struct {
	Log       *zap.Logger
	Responder parley.Responder
	Models    Models    // several models; nil: one
	Tokenizer Tokenizer // counts prompts for MaxPromptTokens; nil: none counted
	// ModelInfo describes the one model (nil: it is described by name only).
	ModelInfo func() parley.ModelInfo

	// ImagePolicy is how requests' images are taken (limits, remote URLs); the zero value is the defaults with
	// data: URLs only.
	ImagePolicy ImagePolicy

	Defaults        parley.Params // sampling defaults
	MaxTokensCap    int           // the largest max_tokens a client may ask for
	MaxPromptTokens int           // tokens per prompt; <= 0: no cap
	WriteWait       time.Duration // bound on every write of a stream
	PingPeriod      time.Duration // between keep-alive events of a long stream
	Mounted         time.Time     // when the routes were mounted: the model's "created" for OpenAI clients

	// Available refuses work while the model loads or the server drains.
	Available func() error
	// Meter starts the metrics of one reply of model ("" with one model).
	Meter func(model string) Meter
	// ErrorBody is err as the JSON error body of r's route: the route
	// table knows which family answers r.
	ErrorBody func(r *http.Request, err error) any
	// Alias finds a served model by a name other than its own (Ollama's
	// name:tag); nil: none.
	Alias func(name string) (string, bool)
	// ThinkFormat is how the one model marks its thought ("" unknown,
	// "none" for a model without one); nil: unknown.
	ThinkFormat func() string
	// Operator reports whether r comes with the server's own API key (it
	// may see paths and settings that others see redacted).
	Operator func(r *http.Request) bool
	// Tools lists and calls the tools that run on the server (the
	// operator's MCP servers) under each user's policy; nil: none.
	Tools toolloop.Host
}

// Who cancelled a reply (label "by" of parley_replies_cancelled_total).
const (
	CancelByClient     = "client"      // an explicit cancel (or reset) from a client that stays connected
	CancelByDisconnect = "disconnect"  // the client went away mid-reply
	CancelBySlowClient = "slow_client" // the server disconnected a client that stopped reading (or flooded it)
	CancelByShutdown   = "shutdown"    // the server closed the connection while shutting down
)
