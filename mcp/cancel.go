package mcp

// Cancelling a call on the server. When a call's context ends (the client
// left, or its time is up) the Go SDK retires the call and sends MCP's
// notifications/cancelled for it from a goroutine of its own, so the server
// stops the work. A call over its time cap also starts the session again
// (the server may have stopped reading), and closing the connection at once
// would drop that notification: the restart waits until the transport has
// written it (callTrace), or the connection has ended, or cancelGrace.

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// methodCancelled is MCP's cancellation notification.
const methodCancelled = "notifications/cancelled"

// cancelGrace bounds how long a restart after a hung call waits for the
// call's cancellation to be written: the SDK gives up sending it after as
// long, and a write that blocks (a server that stopped reading) never ends
// without the restart.
const cancelGrace = 5 * time.Second

// callTrace follows one call through the transport: sent is closed once
// the cancellation of the call has been written to the server. The SDK
// sends it with a context that keeps the call's values, which is how the
// transport finds the trace.
type callTrace struct {
	once sync.Once
	sent chan struct{}
}

type traceKey struct{}

// withTrace returns ctx carrying a new trace for the call made with it.
func withTrace(ctx context.Context) (context.Context, *callTrace) {
	t := &callTrace{sent: make(chan struct{})}
	return context.WithValue(ctx, traceKey{}, t), t
}

// wrote notes that the transport wrote a message of method with ctx.
func wrote(ctx context.Context, method string) {
	if method != methodCancelled {
		return
	}
	if t, ok := ctx.Value(traceKey{}).(*callTrace); ok {
		t.once.Do(func() { close(t.sent) })
	}
}

// tracedTransport is a stdio transport whose writes are noted (wrote).
type tracedTransport struct{ sdk.Transport }

func (t tracedTransport) Connect(ctx context.Context) (sdk.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return tracedConn{c}, nil
}

// tracedConn notes each request it writes. The stdio connection has no
// optional interfaces on the client side, so wrapping it hides nothing.
type tracedConn struct{ sdk.Connection }

func (c tracedConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	if err := c.Connection.Write(ctx, msg); err != nil {
		return err
	}
	if r, ok := msg.(*jsonrpc.Request); ok {
		wrote(ctx, r.Method)
	}
	return nil
}

// wroteHTTP notes a POST of the Streamable HTTP transport (which sends each
// message with its context) that the server received.
func wroteHTTP(req *http.Request) {
	if req.Method != http.MethodPost || req.GetBody == nil || req.Context().Value(traceKey{}) == nil {
		return
	}
	body, err := req.GetBody()
	if err != nil {
		return
	}
	defer body.Close()
	var m struct {
		Method string `json:"method"`
	}
	if json.NewDecoder(io.LimitReader(body, 1<<16)).Decode(&m) == nil {
		wrote(req.Context(), m.Method)
	}
}
