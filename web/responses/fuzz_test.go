package responses

import (
	"context"
	"errors"
	"testing"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// FuzzResponsesRequest feeds the Responses API's request decoder (POST
// /v1/responses and WebSocket response.create) arbitrary bytes: no panic; a
// refusal is an EInvalid *parley.Error; an accepted request ends with a
// user message and has parameters that pass validation against the cap.
func FuzzResponsesRequest(f *testing.F) {
	seeds := []string{
		`{"model":"m","input":"Once upon a time"}`,
		`{"input":[{"role":"developer","content":"Be brief."},{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}]}`,
		`{"input":"hi","instructions":"x","store":false,"stream":true,"max_output_tokens":5,"temperature":0.2,"top_p":0.5}`,
		`{"input":"hi","previous_response_id":"resp_AAAAAAAAAAAAAAAAAAAAAA000000000000"}`,
		`{"input":"hi","conversation":{"id":"conv_AAAAAAAAAAAAAAAAAAAAAA"},"metadata":{"a":"b"}}`,
		`{"type":"response.create","input":[{"role":"assistant","content":"x"}]}`,
		`{"input":[{"type":"function_call_output"}]}`,
		`{"input":[{"role":"user","content":[{"type":"input_image"}]}]}`,
		`{"input":"hi","tools":[{}]}`,
		`{"input":"hi","max_output_tokens":-3}`,
		`{"input":7}`,
		`{"input":`,
		`null`,
		``,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	srv := New(&apicore.Core{Log: zap.NewNop(), Defaults: parley.DefaultParams(), MaxTokensCap: 4096}, nil, nil, context.Background())
	f.Fuzz(func(t *testing.T, data []byte) {
		pr, err := srv.parseResponsesRequest(context.Background(), apicore.Facts{}, data)
		if err != nil {
			var pe *parley.Error
			if !errors.As(err, &pe) || pe.Code != parley.EInvalid || pe.Message == "" {
				t.Fatalf("refusal %#v is not an EInvalid *parley.Error with a message", err)
			}
			return
		}
		in := pr.req.Input
		if len(in) == 0 || in[len(in)-1].Role != parley.RoleUser {
			t.Fatalf("accepted input %+v does not end with a user message", in)
		}
		if err := pr.req.Params.Validate(4096); err != nil {
			t.Fatalf("accepted parameters fail validation: %v", err)
		}
		if pr.req.Previous != "" && pr.req.Conversation != "" {
			t.Fatal("accepted both previous_response_id and conversation")
		}
	})
}
