package chatsocket

// Tool calling in the WebSocket JSON mode: "tools" and "tool_choice" (OpenAI
// chat completions' shapes) in a prompt's params; a "tool_call" server
// message for each piece of a call as it is generated (index, id and name
// with the first, arguments growing over several); the done message's
// tool_calls and finish_reason "tool_calls"; and a "tool_result" client
// message, {"type": "tool_result", "tool_call_id": ..., "content": ...,
// "params": {...}}, that answers a call and continues the conversation with
// a new reply. Text mode is unchanged.

import (
	"context"
	"encoding/json"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
	"github.com/parley-chat/parley/web/internal/apicore"
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

// resolveWSParams is resolveParams for a JSON-mode message, tools included.
func (s *Chat) resolveWSParams(wp *wsParams) (parley.Params, error) {
	if wp == nil {
		return s.core.ResolveParams(nil)
	}
	return s.core.ResolveParams(&wp.ParamsPatch, apicore.AddTools(wp.Tools, wp.ToolChoice, "params."))
}

// toolTurner is the session layer's tool-result turn (*session.Service has it).
type toolTurner interface {
	ToolTurn(ctx context.Context, id, callID, content string, p parley.Params) (*session.Turn, error)
}

// regenerator is the session layer's regenerate turn (*session.Service has it).
type regenerator interface {
	Regenerate(ctx context.Context, id string, p parley.Params) (*session.Turn, error)
}

// continuer is the session layer's continue turn (*session.Service has it).
type continuer interface {
	Continue(ctx context.Context, id string, p parley.Params) (*session.Turn, error)
}

// startTurn starts the turn of j: a prompt, a tool result (j.callID), a
// regenerate (j.regen) or a continue (j.cont), with the parameters p.
func (c *conn) startTurn(ctx context.Context, j job, p parley.Params) (*session.Turn, error) {
	switch {
	case j.cont:
		ct, ok := c.srv.sessions.(continuer)
		if !ok {
			return nil, parley.FieldErrorf("type", "continue is not supported by this server's sessions")
		}
		return ct.Continue(ctx, c.id, p)
	case j.regen:
		rg, ok := c.srv.sessions.(regenerator)
		if !ok {
			return nil, parley.FieldErrorf("type", "regenerate is not supported by this server's sessions")
		}
		return rg.Regenerate(ctx, c.id, p)
	case j.callID != "":
		tt, ok := c.srv.sessions.(toolTurner)
		if !ok {
			return nil, parley.FieldErrorf("type", "tool results are not supported by this server's sessions")
		}
		return tt.ToolTurn(ctx, c.id, j.callID, j.content, p)
	}
	return c.srv.sessions.Turn(ctx, c.id, j.content, p)
}

func newToolCallMessage(d parley.ToolCallDelta) toolCallMessage {
	return toolCallMessage{Type: "tool_call", Index: d.Index, ID: d.ID, Name: d.Name, Arguments: d.Arguments}
}
