package chat_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
	"github.com/parley-chat/parley/internal/paramstest"
)

// TestToolsNotValidatedAgain: a request with tools that the edge validated
// reaches the engine's door validated once, as a request without tools
// does: the chat layer converts the call grammar for the template's syntax
// (again only when its argument key differs) without validating it again.
func TestToolsNotValidatedAgain(t *testing.T) {
	weather := parley.Tool{Name: "get_weather", Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"}}}`)}
	for _, tc := range []struct {
		template, argsKey string
		choice            parley.ToolChoice
	}{
		{chat.NameChatML, "arguments", parley.ToolChoice{}},
		{chat.NameLlama3, "", parley.ToolChoice{}}, // no lazy grammar: llama3 has no Open
		{chat.NameLlama3, "parameters", parley.ToolChoice{Mode: parley.ToolRequired}},
		{chat.NameLlama3, "", parley.ToolChoice{Mode: parley.ToolNone}},
	} {
		t.Run(tc.template+"/"+string(tc.choice.Mode), func(t *testing.T) {
			p := params(20)
			p.Tools, p.ToolChoice = []parley.Tool{weather}, tc.choice
			if err := p.Validate(100); err != nil { // the edge
				t.Fatal(err)
			}
			gen := newFake(4096, tc.template, piece{text: "hello"})
			r := chat.NewResponder(gen)
			if _, err := r.CountTokens("", []parley.Message{user("weather?")}, p); err != nil {
				t.Fatal(err)
			}
			rep, err := r.Reply(context.Background(), parley.ReplyRequest{Messages: []parley.Message{user("weather?")}, Params: p})
			if err != nil {
				t.Fatal(err)
			}
			collect(t, rep)
			gen.wait(t)
			got := gen.lastRequest(t).Params
			if n := paramstest.Validations(&got); n != 1 {
				t.Errorf("the params reached the engine validated %d times, want 1 (the edge's)", n)
			}
			g, _, ok := got.CheckedGrammar()
			if !ok {
				t.Fatal("the params reached the engine with no checked grammar for the template's syntax")
			}
			if !got.ToolsForced() {
				_, g, _ = got.LazyToolGrammar()
			}
			if tc.argsKey != "" && !strings.Contains(g, `\"`+tc.argsKey+`\"`) {
				t.Errorf("the call grammar does not key the arguments %q:\n%s", tc.argsKey, g)
			}
		})
	}
}

// TestToolsUnvalidatedStillRefused: params no edge validated are validated
// by the chat layer, so their errors still reach the caller.
func TestToolsUnvalidatedStillRefused(t *testing.T) {
	p := params(20)
	p.Tools = []parley.Tool{{Name: "bad name"}}
	gen := newFake(4096, chat.NameLlama3)
	_, err := chat.NewResponder(gen).Reply(context.Background(), parley.ReplyRequest{Messages: []parley.Message{user("hi")}, Params: p})
	var pe *parley.Error
	if !errors.As(err, &pe) || pe.Code != parley.EInvalid || !strings.Contains(err.Error(), "tools[0].name") {
		t.Fatalf("err = %v, want the tool name refused", err)
	}
}
