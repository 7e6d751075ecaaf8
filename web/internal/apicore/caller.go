package apicore

import (
	"context"

	"github.com/parley-chat/parley"
)

// CallerOf is the caller the request of ctx comes from: the user and the
// client the edge named in its context (parley.WithUser, parley.WithClient).
// The session layer takes it as an argument.
func CallerOf(ctx context.Context) parley.Caller {
	return parley.Caller{User: parley.UserFrom(ctx), Client: parley.ClientFrom(ctx)}
}
