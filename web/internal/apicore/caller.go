package apicore

import (
	"context"

	"github.com/parley-chat/parley"
)

// callerKey is the context key of WithCaller.
type callerKey struct{}

// WithCaller returns a context whose request comes from who. The edge's
// middleware names the caller of every request here (its user, from its
// API key, and its client); a handler passes it on as an argument
// (session.Service's methods, servertools.Build) or a field
// (parley.ReplyRequest.User and Client). No layer below the web reads it
// from a context.
func WithCaller(ctx context.Context, who parley.Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, who)
}

// CallerOf is the caller WithCaller put in ctx: the zero Caller (the
// anonymous user, no client) when there is none.
func CallerOf(ctx context.Context) parley.Caller {
	who, _ := ctx.Value(callerKey{}).(parley.Caller)
	return who
}
