package openai

import (
	"reflect"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/toolloop"
)

// TestServerCallIndexes: a streamed server call carries its index among the
// tool calls of the model reply that made it, as OpenAI numbers an
// assistant message's tool_calls: two calls of one reply are 0 and 1, a
// client's call between them keeps its place, and the next reply counts
// from 0 again.
func TestServerCallIndexes(t *testing.T) {
	aside := func(e toolloop.Event) parley.Event { return parley.Event{Aside: &e} }
	replyDone := func(ids ...string) parley.Event {
		var calls []parley.ToolCall
		for _, id := range ids {
			calls = append(calls, parley.ToolCall{ID: id, Name: "add"})
		}
		return aside(toolloop.Event{Kind: toolloop.EventReplyDone, Model: parley.Event{Done: true, Finish: parley.FinishToolCalls, ToolCalls: calls}})
	}
	call := func(id string) parley.Event {
		return aside(toolloop.Event{Kind: toolloop.EventCall, Call: &toolloop.Call{ID: id, Tool: toolloop.Tool{Name: "add"}, Arguments: "{}"}})
	}
	result := func(id string) parley.Event {
		return aside(toolloop.Event{Kind: toolloop.EventResult, Call: &toolloop.Call{ID: id, Tool: toolloop.Tool{Name: "add"}, Output: "42"}})
	}
	events := []parley.Event{
		replyDone("a", "b"), call("a"), result("a"), call("b"), result("b"),
		replyDone("c", "client", "d"), call("c"), result("c"), call("d"), result("d"),
		call("e"), // a call its reply did not list takes the next free index
	}
	idx := callIndex{}
	var got []int
	var answered []string
	for _, ev := range events {
		err := serverToolEvent(ev, idx, func(chunkDelta) error { t.Fatal("a server event sent a model delta"); return nil },
			func(d serverMessage) error {
				for _, c := range d.ToolCalls {
					if c.Index == nil {
						t.Fatalf("call %s without an index", c.ID)
					}
					got = append(got, *c.Index)
				}
				if d.Role == "tool" {
					answered = append(answered, d.ToolCallID)
				}
				return nil
			})
		if err != nil {
			t.Fatal(err)
		}
	}
	if want := []int{0, 1, 0, 2, 3}; !reflect.DeepEqual(got, want) {
		t.Errorf("indexes %v, want %v", got, want)
	}
	if want := []string{"a", "b", "c", "d"}; !reflect.DeepEqual(answered, want) {
		t.Errorf("results answer %v, want %v", answered, want)
	}
}
