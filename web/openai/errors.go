package openai

import (
	"github.com/parley-chat/parley/web/internal/oaiwire"
)

// ErrorBody is err as OpenAI's error body.
func ErrorBody(err error) any { return oaiwire.ErrorBodyOf(err) }

// Status is err's HTTP status on OpenAI's routes (a prompt over a limit is
// a 400, as OpenAI answers it).
func Status(err error) int { return oaiwire.Status(err) }
