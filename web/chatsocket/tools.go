package chatsocket

// Tool calling in the WebSocket JSON mode: "tools" and "tool_choice" (OpenAI
// chat completions' shapes) in a prompt's params; a "tool_call" server
// message for each piece of a call as it is generated (index, id and name
// with the first, arguments growing over several); the done message's
// tool_calls and finish_reason "tool_calls"; and a "tool_result" client
// message, {"type": "tool_result", "tool_call_id": ..., "content": ...,
// "params": {...}}, that answers a call and continues the conversation with
// a new reply. Text mode is unchanged.
//
// Tools that run on the server: {"type": "mcp", "server_label": ...} entries
// in a prompt's (or tool result's) params.tools ("*": every server the user
// may use) run through the tool loop; each call is a "server_tool_call"
// message and its result a "server_tool_result" message, in order with the
// tokens (each with its seq), and the conversation stores them as an
// assistant turn with the call and a tool message.

import (
	"context"
	"encoding/json"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
	"github.com/parley-chat/parley/toolloop"
	"github.com/parley-chat/parley/web/internal/apicore"
	"github.com/parley-chat/parley/web/internal/servertools"
)

// wsParams are a JSON-mode message's params: the sampling fields every wire
// shares, and tools.
type wsParams struct {
	apicore.ParamsPatch
	Tools      json.RawMessage `json:"tools"`
	ToolChoice json.RawMessage `json:"tool_choice"`
}

// toolCallMessage is one piece of a tool call (server -> client).
type toolCallMessage struct {
	Type      string `json:"type"` // "tool_call"
	Index     int    `json:"index"`
	ID        string `json:"id,omitempty"`
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// resolveWSParams is resolveParams for a JSON-mode message, tools included:
// the selection of tools that run on the server too ({"type": "mcp"}
// entries in params.tools; nil without).
func (s *Chat) resolveWSParams(wp *wsParams) (parley.Params, *toolloop.Selection, error) {
	if wp == nil {
		p, err := s.core.ResolveParams(nil)
		return p, nil, err
	}
	functions, server, err := servertools.SplitTools(wp.Tools, "params.tools")
	if err != nil {
		return parley.Params{}, nil, err
	}
	p, err := s.core.ResolveParams(&wp.ParamsPatch, apicore.AddTools(functions, wp.ToolChoice, "params."))
	return p, server, err
}

// toolTurner is the session layer's tool-result turn (*session.Service has it).
type toolTurner interface {
	ToolTurn(ctx context.Context, who parley.Caller, id, callID, content string, p parley.Params, opts ...session.TurnOption) (*session.Turn, error)
}

// regenerator is the session layer's regenerate turn (*session.Service has it).
type regenerator interface {
	Regenerate(ctx context.Context, who parley.Caller, id string, p parley.Params, opts ...session.TurnOption) (*session.Turn, error)
}

// continuer is the session layer's continue turn (*session.Service has it).
type continuer interface {
	Continue(ctx context.Context, who parley.Caller, id string, p parley.Params, opts ...session.TurnOption) (*session.Turn, error)
}

// startTurn starts the turn of j: a prompt, a tool result (j.callID), a
// regenerate (j.regen) or a continue (j.cont), with the parameters p.
func (c *conn) startTurn(ctx context.Context, j job, p parley.Params, opts ...session.TurnOption) (*session.Turn, error) {
	if j.server != nil {
		// The prompt enables tools that run on the server: the turn
		// replies through the tool loop (servertools.go).
		tools, err := servertools.Build(ctx, c.srv.core, c.user, *j.server, p.Tools)
		if err != nil {
			return nil, err
		}
		opts = append(opts, session.ReplyWith(tools))
	}
	opts = append(opts, session.InCacheScope(c.srv.cacheScope(c.user, c.ip)))
	switch {
	case j.cont:
		ct, ok := c.srv.sessions.(continuer)
		if !ok {
			return nil, parley.FieldErrorf("type", "continue is not supported by this server's sessions")
		}
		return ct.Continue(ctx, c.who(), c.id, p, opts...)
	case j.regen:
		rg, ok := c.srv.sessions.(regenerator)
		if !ok {
			return nil, parley.FieldErrorf("type", "regenerate is not supported by this server's sessions")
		}
		return rg.Regenerate(ctx, c.who(), c.id, p, opts...)
	case j.callID != "":
		tt, ok := c.srv.sessions.(toolTurner)
		if !ok {
			return nil, parley.FieldErrorf("type", "tool results are not supported by this server's sessions")
		}
		return tt.ToolTurn(ctx, c.who(), c.id, j.callID, j.content, p, opts...)
	case len(j.images) > 0:
		it, ok := c.srv.sessions.(imageTurner)
		if !ok {
			return nil, parley.FieldErrorf("images", "images are not supported by this server's sessions")
		}
		return it.ImageTurn(ctx, c.who(), c.id, j.content, j.images, p, opts...)
	}
	return c.srv.sessions.Turn(ctx, c.who(), c.id, j.content, p, opts...)
}

func newToolCallMessage(d parley.ToolCallDelta) toolCallMessage {
	return toolCallMessage{Type: "tool_call", Index: d.Index, ID: d.ID, Name: d.Name, Arguments: d.Arguments}
}

// serverToolMessage is a server tool's call or result (server -> client).
type serverToolMessage struct {
	Type      string  `json:"type"` // "server_tool_call" or "server_tool_result"
	ID        string  `json:"id"`   // the tool call's id
	Server    string  `json:"server"`
	Name      string  `json:"name"` // the tool's name on its server
	Arguments string  `json:"arguments"`
	Content   *string `json:"content,omitempty"` // server_tool_result: what the model reads
	Error     string  `json:"error,omitempty"`   // server_tool_result: why the call failed
	Seq       int     `json:"seq"`
}

// serverToolFrame is the message of a tool loop event, if it has one; skip
// is set for an event the client is not shown (a server call's deltas, the
// end of one model reply).
func serverToolFrame(ev parley.Event, seq int) (msg *serverToolMessage, skip bool) {
	le, ok := servertools.Aside(ev)
	if !ok {
		return nil, false
	}
	switch le.Kind {
	case toolloop.EventCall, toolloop.EventResult:
		c := le.Call
		m := &serverToolMessage{Type: "server_tool_call", ID: c.ID, Server: c.Tool.Server, Name: c.Tool.Remote, Arguments: c.Arguments, Seq: seq}
		if le.Kind == toolloop.EventResult {
			out := c.Output
			m.Type, m.Content, m.Error = "server_tool_result", &out, c.Error
		}
		return m, false
	case toolloop.EventToken:
		return nil, le.Server
	}
	return nil, true
}
