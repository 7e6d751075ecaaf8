package chat_test

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
)

// wordCount counts the words of a conversation rendered as a plain
// transcript, a stand-in for tokens; calls counts how often it ran.
func wordCount(calls *int) func([]parley.Message) (int, error) {
	plain, _ := chat.TemplateByName("plain")
	return func(msgs []parley.Message) (int, error) {
		*calls++
		prompt, err := plain.Render(msgs, chat.Gen)
		if err != nil {
			return 0, err
		}
		return len(strings.Fields(prompt)), nil
	}
}

func TestFit(t *testing.T) {
	// Rendered as plain text each message costs 1 word for its label plus its
	// content's words; the generation prompt costs 1.
	history := []parley.Message{
		sys("be nice"),                   // 3
		user("one one"), asst("one one"), // 3 + 3
		user("two two"), asst("two two"), // 3 + 3
		user("three"), asst("three"), // 2 + 2
		user("now"), // 2, + 1 for "Assistant:"
	} // 22 words in all
	tests := []struct {
		name        string
		msgs        []parley.Message
		budget      int
		want        []parley.Message
		wantDropped int
		wantCode    string
	}{
		{"fits as is", history, 22, history, 0, ""},
		{"drops the oldest pair", history, 21, []parley.Message{history[0], history[3], history[4], history[5], history[6], history[7]}, 2, ""},
		{"drops two pairs", history, 15, []parley.Message{history[0], history[5], history[6], history[7]}, 4, ""},
		{"keeps system and the newest user", history, 6, []parley.Message{history[0], history[7]}, 6, ""},
		{"too large even alone", history, 5, nil, 0, parley.ETooLarge},
		{"no history to drop", []parley.Message{sys("a b c"), user("d e f")}, 5, nil, 0, parley.ETooLarge},
		{
			"system messages stay wherever they are",
			[]parley.Message{user("old old"), asst("old"), sys("note"), user("new")},
			6,
			[]parley.Message{sys("note"), user("new")},
			2, "",
		},
		{
			"a turn is a user message and all its answers",
			[]parley.Message{user("q"), asst("a1"), asst("a2"), user("q2"), asst("b"), user("q3")},
			7,
			[]parley.Message{user("q2"), asst("b"), user("q3")},
			3, "",
		},
		{
			"answers before any question form the first turn",
			[]parley.Message{asst("hello there"), user("q"), asst("a"), user("q2")},
			7,
			[]parley.Message{user("q"), asst("a"), user("q2")},
			1, "",
		},
		{
			"messages after the newest user message stay",
			[]parley.Message{user("a b c d"), asst("e"), user("q"), asst("prefill")},
			6,
			[]parley.Message{user("q"), asst("prefill")},
			2, "",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			orig := slices.Clone(tt.msgs)
			kept, dropped, err := chat.Fit(tt.msgs, tt.budget, wordCount(&calls))
			if tt.wantCode != "" {
				if parley.ErrorCode(err) != tt.wantCode {
					t.Fatalf("err = %v, want code %s", err, tt.wantCode)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(kept, tt.want) || dropped != tt.wantDropped {
				t.Errorf("kept %v dropped %d, want %v dropped %d", kept, dropped, tt.want, tt.wantDropped)
			}
			if !reflect.DeepEqual(tt.msgs, orig) {
				t.Errorf("Fit modified its input")
			}
			if n, _ := wordCount(new(int))(kept); n > tt.budget {
				t.Errorf("kept %d words, budget %d", n, tt.budget)
			}
		})
	}
}

// TestFitMinimal checks on long conversations that Fit drops exactly as
// many turns as needed (compared with trying every cut) and counts few
// times.
func TestFitMinimal(t *testing.T) {
	var msgs []parley.Message
	msgs = append(msgs, sys("system prompt here"))
	for i := range 300 {
		msgs = append(msgs, user(strings.Repeat("q ", 1+i%7)), asst(strings.Repeat("a ", 1+i%5)))
	}
	msgs = append(msgs, user("final question"))
	total, _ := wordCount(new(int))(msgs)
	for _, budget := range []int{total, total - 1, total - 10, total / 2, 200, 20, 8} {
		calls := 0
		kept, dropped, err := chat.Fit(msgs, budget, wordCount(&calls))
		if err != nil {
			t.Fatalf("budget %d: %v", budget, err)
		}
		// The reference: the fewest whole pairs whose removal fits.
		var want int
		for k := 0; ; k++ {
			cand := append([]parley.Message{msgs[0]}, msgs[1+2*k:]...)
			if n, _ := wordCount(new(int))(cand); n <= budget {
				want = 2 * k
				break
			}
		}
		if dropped != want || len(kept) != len(msgs)-want {
			t.Errorf("budget %d: dropped %d, want %d", budget, dropped, want)
		}
		if calls > 20 {
			t.Errorf("budget %d: %d counts for %d turns; want O(log turns)", budget, calls, 300)
		}
		if budget == total && calls != 1 {
			t.Errorf("a conversation that fits was counted %d times, want 1", calls)
		}
	}
}

func TestFitCountError(t *testing.T) {
	boom := errors.New("tokenizer broke")
	calls := 0
	count := func([]parley.Message) (int, error) {
		calls++
		if calls == 2 {
			return 0, boom
		}
		return 100, nil
	}
	msgs := []parley.Message{user("a"), asst("b"), user("c")}
	if _, _, err := chat.Fit(msgs, 10, count); !errors.Is(err, boom) {
		t.Errorf("err = %v, want it to wrap %v", err, boom)
	}
	_, _, err := chat.Fit(msgs, 10, func([]parley.Message) (int, error) { return 0, fmt.Errorf("first: %w", boom) })
	if !errors.Is(err, boom) {
		t.Errorf("err = %v, want it to wrap %v", err, boom)
	}
}

// Once the window is full, FitStable keeps the same first kept turn for
// several turns in a row, so the KV cache's prefix survives; Fit would move
// it on every turn.
func TestFitStableKeepsTheCutForSeveralTurns(t *testing.T) {
	var calls int
	count := wordCount(&calls)
	var msgs []parley.Message
	msgs = append(msgs, parley.Message{Role: parley.RoleSystem, Content: "be kind"})
	firstKept := func(kept []parley.Message) string {
		for _, m := range kept {
			if m.Role == parley.RoleUser {
				return m.Content
			}
		}
		return ""
	}
	var cuts []string
	moves, minimalMoves := 0, 0
	prevStable, prevMin := "", ""
	for turn := 0; turn < 40; turn++ {
		msgs = append(msgs, parley.Message{Role: parley.RoleUser, Content: fmt.Sprintf("question %d w w w", turn)})
		kept, dropped, err := chat.FitStable(msgs, 60, 4, count)
		if err != nil {
			t.Fatal(err)
		}
		minKept, minDropped, _ := chat.Fit(msgs, 60, count)
		if n, _ := count(kept); n > 60 {
			t.Fatalf("turn %d: kept %d words, over the budget", turn, n)
		}
		if dropped < minDropped || (dropped-minDropped)/2 >= 4 {
			t.Fatalf("turn %d: dropped %d messages, minimal %d: more than 3 extra turns", turn, dropped, minDropped)
		}
		if c := firstKept(kept); c != prevStable {
			moves++
			prevStable = c
			cuts = append(cuts, c)
		}
		if c := firstKept(minKept); c != prevMin {
			minimalMoves++
			prevMin = c
		}
		msgs = append(msgs, parley.Message{Role: parley.RoleAssistant, Content: "answer w w w w"})
	}
	if moves*2 > minimalMoves {
		t.Fatalf("stable cut moved %d times, minimal cut %d times: want at most half", moves, minimalMoves)
	}
}
