package responses

import (
	"github.com/labstack/echo/v4"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/session"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// setAffinity names resp's affinity key in the reply's X-Parley-Session, so
// that a balancer hashing on the header keeps the conversation on the
// replica that holds its cache: the key the client sent in the header; else,
// for a stored response, its session's id (the conversation it continues,
// or the chain previous_response_id follows: the same from turn to turn);
// else the request's prompt_cache_key; else, for a response not stored, one
// derived from its user, instructions and input (parley.AffinityKey).
func setAffinity(c echo.Context, pr *parsedResponse, resp *session.Response) {
	user := pr.facts.Caller.User
	if sent := c.Request().Header.Get(parley.AffinityHeader); sent != "" {
		apicore.SetAffinity(c, parley.AffinityKey(user, sent, nil))
		return
	}
	if resp.Stored && resp.SessionID() != "" {
		apicore.SetAffinity(c, resp.SessionID())
		return
	}
	var msgs []parley.Message
	if pr.req.Instructions != nil && *pr.req.Instructions != "" {
		msgs = append(msgs, parley.Message{Role: parley.RoleSystem, Content: *pr.req.Instructions})
	}
	apicore.SetAffinity(c, parley.AffinityKey(user, pr.facts.CacheKey, append(msgs, pr.req.Input...)))
}
