package web_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/parley-chat/parley/web"
)

var respWeatherTools = []map[string]any{{"type": "function", "name": "get_weather", "description": "Weather in a city",
	"parameters": map[string]any{"type": "object", "additionalProperties": false, "required": []string{"city", "unit"},
		"properties": map[string]any{"city": map[string]any{"type": "string", "maxLength": 16}, "unit": map[string]any{"enum": []string{"c", "f"}}}}}}

type respToolItem struct {
	Type      string `json:"type"`
	ID        string `json:"id"`
	Status    string `json:"status"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
	Output    string `json:"output"`
}

type respToolObject struct {
	ID     string         `json:"id"`
	Status string         `json:"status"`
	Output []respToolItem `json:"output"`
}

// TestResponsesToolCalls: over a real socket, a Responses request with
// tool_choice required gets a function_call output item (call_id, name,
// arguments that validate); streamed, the arguments arrive as several
// response.function_call_arguments.delta events and one .done; a
// function_call_output chained by previous_response_id continues the turn,
// and input_items and the conversation's items show the call and its result.
func TestResponsesToolCalls(t *testing.T) {
	s := openToolStack(t)
	var r respToolObject
	decodeBody(t, post(t, s.base+"/v1/responses", map[string]any{"input": "Weather in Paris?", "tools": respWeatherTools,
		"tool_choice": "required", "max_output_tokens": 200}), http.StatusOK, &r)
	if len(r.Output) != 1 || r.Output[0].Type != "function_call" || r.Output[0].Name != "get_weather" ||
		!strings.HasPrefix(r.Output[0].CallID, "call_") || r.Output[0].Status != "completed" {
		t.Fatalf("response %+v", r)
	}
	call := r.Output[0]
	checkWeatherArgs(t, call.Arguments)

	// Streamed.
	res := post(t, s.base+"/v1/responses", map[string]any{"input": "Weather in Paris?", "tools": respWeatherTools,
		"tool_choice": "required", "max_output_tokens": 200, "stream": true})
	var deltas []string
	var doneArgs string
	var completed respToolObject
	type event struct {
		Type        string          `json:"type"`
		Delta       string          `json:"delta"`
		Arguments   string          `json:"arguments"`
		Response    json.RawMessage `json:"response"`
		OutputIndex int             `json:"output_index"`
		Item        respToolItem    `json:"item"`
	}
	var streamed []event
	for _, e := range readResponseEvents(t, res.Body) {
		var ev event
		b, _ := json.Marshal(e.data)
		if err := json.Unmarshal(b, &ev); err != nil {
			t.Fatal(err)
		}
		streamed = append(streamed, ev)
		switch ev.Type {
		case "response.function_call_arguments.delta":
			deltas = append(deltas, ev.Delta)
		case "response.function_call_arguments.done":
			doneArgs = ev.Arguments
		case "response.completed":
			if err := json.Unmarshal(ev.Response, &completed); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(deltas) < 3 || strings.Join(deltas, "") != doneArgs || doneArgs != call.Arguments {
		t.Fatalf("streamed arguments %q, done %q, want %q over several deltas", deltas, doneArgs, call.Arguments)
	}
	// A reply that is only a call has no message item, streamed or not, as
	// OpenAI's has none (a client sends every output item back by reference).
	if n := len(completed.Output); n != 1 || completed.Output[0].Type != "function_call" || completed.Output[0].Arguments != doneArgs {
		t.Fatalf("completed output %+v", completed.Output)
	}
	for _, ev := range streamed {
		if ev.Type == "response.output_item.added" && (ev.OutputIndex != 0 || ev.Item.Type != "function_call") {
			t.Fatalf("item added %+v: want the call alone, at output index 0", ev)
		}
	}

	// The result continues the first response.
	var next respObject
	decodeBody(t, post(t, s.base+"/v1/responses", map[string]any{"previous_response_id": r.ID, "tools": respWeatherTools,
		"input":             []map[string]any{{"type": "function_call_output", "call_id": call.CallID, "output": `{"temperature": 21}`}},
		"max_output_tokens": 8}), http.StatusOK, &next)
	if len(next.Output) != 1 || next.Output[0].Type != "message" {
		t.Fatalf("continued response %+v", next)
	}
	var items struct {
		Data []respToolItem `json:"data"`
	}
	decodeBody(t, do(t, http.MethodGet, s.base+"/v1/responses/"+next.ID+"/input_items?order=asc", nil), http.StatusOK, &items)
	if len(items.Data) != 1 || items.Data[0].Type != "function_call_output" || items.Data[0].CallID != call.CallID {
		t.Fatalf("input items %+v", items.Data)
	}
	sid := sessionOf(t, s, next.ID)
	decodeBody(t, do(t, http.MethodGet, s.base+"/v1/conversations/conv_"+sid+"/items?order=asc", nil), http.StatusOK, &items)
	var types []string
	for _, it := range items.Data {
		types = append(types, it.Type)
	}
	if strings.Join(types, ",") != "message,function_call,function_call_output,message" || items.Data[1].CallID != call.CallID {
		t.Fatalf("conversation items %v: %+v", types, items.Data)
	}

	// A result for a call the conversation never made is refused, and the
	// conversation is unchanged.
	res = post(t, s.base+"/v1/responses", map[string]any{"previous_response_id": next.ID,
		"input": []map[string]any{{"type": "function_call_output", "call_id": "call_unknown", "output": "x"}}})
	var e struct {
		Error struct{ Message string } `json:"error"`
	}
	decodeBody(t, res, http.StatusBadRequest, &e)
	if !strings.HasPrefix(e.Error.Message, "input[0].call_id:") {
		t.Fatalf("error %+v", e)
	}
	var again struct {
		Data []respToolItem `json:"data"`
	}
	decodeBody(t, do(t, http.MethodGet, s.base+"/v1/conversations/conv_"+sid+"/items?order=asc", nil), http.StatusOK, &again)
	if len(again.Data) != len(items.Data) {
		t.Fatalf("the refused result changed the conversation: %d items, then %d", len(items.Data), len(again.Data))
	}
}

// TestResponsesOtherToolTypes: tools of types Parley does not run (Codex
// sends web_search and a namespace of its sub-agent tools in every
// request) are accepted and left out of the prompt: the request is
// answered, its prompt is the one with its function tools alone, and
// tool_choice required still calls the function.
func TestResponsesOtherToolTypes(t *testing.T) {
	s := openToolStack(t)
	others := append([]map[string]any{
		{"type": "web_search", "external_web_access": false},
		{"type": "namespace", "name": "multi_agent_v1", "description": "Tools for sub-agents.", "tools": []map[string]any{
			{"type": "function", "name": "close_agent", "parameters": map[string]any{"type": "object", "properties": map[string]any{}}}}},
		{"type": "custom", "name": "apply_patch", "format": map[string]any{"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
	}, respWeatherTools...)
	type usage struct {
		Usage struct {
			InputTokens int `json:"input_tokens"`
		} `json:"usage"`
		Output []respToolItem `json:"output"`
	}
	var alone, mixed usage
	decodeBody(t, post(t, s.base+"/v1/responses", map[string]any{"input": "Weather in Paris?", "tools": respWeatherTools,
		"tool_choice": "required", "max_output_tokens": 200, "store": false}), http.StatusOK, &alone)
	decodeBody(t, post(t, s.base+"/v1/responses", map[string]any{"input": "Weather in Paris?", "tools": others,
		"tool_choice": "required", "max_output_tokens": 200, "store": false}), http.StatusOK, &mixed)
	if mixed.Usage.InputTokens != alone.Usage.InputTokens {
		t.Fatalf("prompt of %d tokens with the other tools, %d with the function alone: they reached the prompt", mixed.Usage.InputTokens, alone.Usage.InputTokens)
	}
	if len(mixed.Output) != 1 || mixed.Output[0].Type != "function_call" || mixed.Output[0].Name != "get_weather" {
		t.Fatalf("output %+v", mixed.Output)
	}
}

// TestResponsesItemReference: a client that keeps its history but lets the
// server store responses (the AI SDK's OpenAI provider) sends a stored
// response's output items back as item_reference inputs in its next step:
// they are read from the stored response, so the prompt is the one the
// items' full content makes, whatever the stream or the reply held; a
// reference to an item the server does not keep is a 400 naming it.
func TestResponsesItemReference(t *testing.T) {
	s := openStack(t, stackOpts{model: toolCallingModel(t), parallel: 1, contextLen: 2048, maxTokens: 100, tokenizer: true, options: func(s *stack) []web.Option {
		return []web.Option{web.WithResponder(s.responder), web.WithModelInfo(s.engine.Info)}
	}})
	user := map[string]any{"role": "user", "content": "Weather in Paris?"}
	res := post(t, s.base+"/v1/responses", map[string]any{"input": []map[string]any{user}, "tools": respWeatherTools, "stream": true})
	var first respToolObject
	for _, e := range readResponseEvents(t, res.Body) {
		var ev struct {
			Type     string          `json:"type"`
			Response json.RawMessage `json:"response"`
		}
		b, _ := json.Marshal(e.data)
		json.Unmarshal(b, &ev)
		if ev.Type == "response.completed" {
			json.Unmarshal(ev.Response, &first)
		}
	}
	if len(first.Output) != 2 || first.Output[0].Type != "message" || first.Output[1].Type != "function_call" {
		t.Fatalf("output %+v: want a message and a call", first.Output)
	}
	msg, call := first.Output[0], first.Output[1]
	result := map[string]any{"type": "function_call_output", "call_id": call.CallID, "output": `{"temperature": 21}`}
	full := map[string]any{"type": "message", "role": "assistant", "content": []map[string]any{{"type": "output_text", "text": "Let me look that up."}}}
	fullCall := map[string]any{"type": "function_call", "call_id": call.CallID, "name": call.Name, "arguments": call.Arguments}
	type usage struct {
		Usage struct {
			InputTokens int `json:"input_tokens"`
		} `json:"usage"`
	}
	var byValue, byRef, callByRef usage
	decodeBody(t, post(t, s.base+"/v1/responses", map[string]any{"tools": respWeatherTools, "max_output_tokens": 4,
		"input": []map[string]any{user, full, fullCall, result}}), http.StatusOK, &byValue)
	decodeBody(t, post(t, s.base+"/v1/responses", map[string]any{"tools": respWeatherTools, "max_output_tokens": 4,
		"input": []map[string]any{user, {"type": "item_reference", "id": msg.ID}, fullCall, result}}), http.StatusOK, &byRef)
	decodeBody(t, post(t, s.base+"/v1/responses", map[string]any{"tools": respWeatherTools, "max_output_tokens": 4,
		"input": []map[string]any{user, {"type": "item_reference", "id": msg.ID}, {"type": "item_reference", "id": call.ID}, result}}), http.StatusOK, &callByRef)
	if byRef.Usage.InputTokens != byValue.Usage.InputTokens || callByRef.Usage.InputTokens != byValue.Usage.InputTokens {
		t.Fatalf("prompt %d tokens with the items by reference (%d with the call too), %d with their content", byRef.Usage.InputTokens, callByRef.Usage.InputTokens, byValue.Usage.InputTokens)
	}
	for _, id := range []string{"msg_nothing12345678900", "fc_x", ""} {
		wantFieldError(t, post(t, s.base+"/v1/responses", map[string]any{"max_output_tokens": 4,
			"input": []map[string]any{user, {"type": "item_reference", "id": id}, {"role": "user", "content": "And?"}}}), http.StatusBadRequest, "input[1].id")
	}
}
