package openai

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// openAIRequest is what chat and legacy completion requests share: the
// sampling fields, the cache key's, the model, streaming and the options
// Parley takes only at their default.
type openAIRequest struct {
	apicore.ParamsPatch
	apicore.CacheKeyFields
	Model         string `json:"model"`
	Stream        bool   `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	N         *int            `json:"n"`
	LogitBias json.RawMessage `json:"logit_bias"`
}

// decodeRequest reads the body of c into req, a request type that embeds
// common, picks the request's model (its Facts) and narrows its cache key.
func (s *API) decodeRequest(c echo.Context, req any, common *openAIRequest) (apicore.Facts, error) {
	body, err := apicore.ReadBody(c)
	if err != nil {
		return apicore.Facts{}, err
	}
	if err := apicore.DecodeJSON(bytes.NewReader(body), req); err != nil {
		// The decoder names a field of common under its type's name;
		// clients know only the JSON name.
		if f := apicore.ErrorField(err); strings.HasPrefix(f, "openAIRequest.") {
			err = apicore.RenameField(err, f, strings.TrimPrefix(f, "openAIRequest."))
		}
		return apicore.Facts{}, err
	}
	facts := apicore.FactsOf(c)
	if facts.Model, err = s.core.ResolveModel(common.Model); err != nil {
		return apicore.Facts{}, err
	}
	if err := common.CacheKeyFields.Narrow(&facts); err != nil {
		return apicore.Facts{}, err
	}
	return facts, nil
}

// unsupported refuses n other than 1 and a logit_bias: Parley makes one
// choice and biases no tokens, and says so rather than ignore them.
func (r *openAIRequest) unsupported() error {
	if r.N != nil && *r.N != 1 {
		return parley.FieldErrorf("n", "only 1 is supported, got %d", *r.N)
	}
	if apicore.IsSet(r.LogitBias) && !bytes.Equal(bytes.TrimSpace(r.LogitBias), []byte("{}")) {
		return parley.FieldErrorf("logit_bias", "is not supported")
	}
	return nil
}

// includeUsage reports whether a stream ends with a usage chunk.
func (r *openAIRequest) includeUsage() bool {
	return r.StreamOptions != nil && r.StreamOptions.IncludeUsage
}
