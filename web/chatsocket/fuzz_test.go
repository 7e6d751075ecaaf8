package chatsocket

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"unicode/utf8"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
	"go.uber.org/zap"
)

// FuzzClientMessage feeds the JSON-mode message decoder and the parameter
// resolution arbitrary bytes. Whatever arrives: no panic; a refusal is an
// EInvalid *parley.Error with a message that encodes as JSON; an accepted
// message has a known type, the content its type needs, and (for a prompt)
// parameters that pass the one validation against the server's cap.
func FuzzClientMessage(f *testing.F) {
	seeds := []string{
		`{"type":"prompt","content":"Once upon a time"}`,
		`{"type":"prompt","content":"hi","params":{"max_tokens":12,"temperature":0.7,"top_k":40,"top_p":0.9,"seed":42,"stop":["\n"]}}`,
		`{"type":"prompt","content":"x","params":{"max_new_tokens":5,"manual_seed":7,"do_sample":false,"stop_sequences":"end"}}`,
		`{"type":"prompt","content":"x","params":{"grammar":"root ::= \"yes\" | \"no\""}}`,
		`{"type":"prompt","content":"x","params":{"json_schema":{"type":"object","properties":{"a":{"type":"integer"}}}}}`,
		`{"type":"prompt","content":"x","params":{"temperature":"NaN"}}`,
		`{"type":"prompt","content":"x","params":{"temperature":1e999}}`,
		`{"type":"prompt","content":"x","params":{"max_tokens":-1}}`,
		`{"type":"prompt","content":"x","params":{"seed":99999999999999999999}}`,
		`{"type":"prompt","content":"x","params":{"stop":17}}`,
		`{"type":"prompt","content":"x","params":{"grammar":"root ::= ((((\"a\"))))"}}`,
		`{"type":"prompt","content":"x","params":{"json_schema":[[[[[[[[[]]]]]]]]]}}`,
		`{"type":"prompt","content":"\ud800\u0000\u202e"}`,
		`{"type":"prompt"}`,
		`{"type":"system","content":"You are a pirate."}`,
		`{"type":"cancel"}`,
		`{"type":"reset"}`,
		`{"type":"prompt","content":[{"type":"text","text":"see "},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}},{"type":"text","text":"?"}]}`,
		`{"type":"prompt","content":[{"type":"image_url","image_url":"AAAA"}],"images":["AAAA"]}`,
		`{"type":"dance"}`,
		`{"type":7}`,
		`{"type":"reset"} {"type":"reset"}`,
		`{"type":`,
		`[]`,
		`null`,
		``,
		"\xff\xfe",
		strings.Repeat("[", 200) + strings.Repeat("]", 200),
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	srv := New(&apicore.Core{Log: zap.NewNop(), Defaults: parley.DefaultParams(), MaxTokensCap: 4096}, nil, nil,
		Settings{Defaults: parley.DefaultParams(), MaxTokensCap: 4096}, Hooks{}, context.Background(), &atomic.Bool{})
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := parseClientMessage(data)
		if err == nil && m.Type == "prompt" {
			var p parley.Params
			p, _, err = srv.resolveWSParams(m.Params)
			if err == nil {
				if verr := p.Validate(4096); verr != nil {
					t.Fatalf("resolved parameters fail validation: %v", verr)
				}
			}
		}
		if err != nil {
			var pe *parley.Error
			if !errors.As(err, &pe) || pe.Code != parley.EInvalid || pe.Message == "" {
				t.Fatalf("refusal %#v is not an invalid *parley.Error with a message", err)
			}
			if pe.Field != "" && !strings.Contains(pe.Message, pe.Field) {
				t.Fatalf("message %q does not name its field %q", pe.Message, pe.Field)
			}
			if _, merr := json.Marshal(errorMessage{Type: "error", Code: pe.Code, Message: pe.Message, Field: pe.Field}); merr != nil {
				t.Fatalf("error event does not encode: %v", merr)
			}
			return
		}
		switch m.Type {
		case "prompt", "system":
			if m.Content == nil {
				t.Fatalf("%s accepted without content", m.Type)
			}
			if !utf8.ValidString(*m.Content) {
				t.Fatalf("content %q is not valid UTF-8", *m.Content)
			}
		case "cancel", "reset":
		default:
			t.Fatalf("accepted unknown type %q", m.Type)
		}
	})
}
