package chat_test

import (
	"os"
	"strings"
	"testing"

	"github.com/parley-chat/parley/chat"
)

func TestSplitter(t *testing.T) {
	tests := []struct {
		name          string
		format        chat.ThinkFormat
		prompt, reply string
		thought, ans  string
	}{
		{"tags", chat.ThinkTags, "<|im_start|>assistant\n", "<think>\nThe user greets.\n</think>\n\nHello!", "The user greets.", "Hello!"},
		{"tags, no thought", chat.ThinkTags, "<|im_start|>assistant\n", "Hello <think> there", "", "Hello <think> there"},
		{"tags, opened by the prompt", chat.ThinkTags, "<｜Assistant｜><think>\n", "Hmm.</think>Four.", "Hmm.", "Four."},
		{"tags, closed by the prompt (thinking off)", chat.ThinkTags, "assistant\n<think>\n\n</think>\n\n", "Four, <think> not a thought", "", "Four, <think> not a thought"},
		{"tags, unclosed at the end", chat.ThinkTags, "", "<think>still thinking", "still thinking", ""},
		{"tags, the answer keeps its inner whitespace", chat.ThinkTags, "", "<think>a \n b</think>x  y\n", "a \n b", "x  y\n"},
		{"harmony", chat.ThinkHarmony, "<|start|>assistant",
			"<|channel|>analysis<|message|>Think about it.<|end|><|start|>assistant<|channel|>final<|message|>Blue.<|return|>", "Think about it.", "Blue."},
		{"harmony, the role written by the model", chat.ThinkHarmony, "<|start|>",
			"assistant<|channel|>analysis<|message|>T.<|end|><|start|>assistant<|channel|>final<|message|>A.<|return|>", "T.", "A."},
		{"harmony, no channels", chat.ThinkHarmony, "", "just text", "", "just text"},
		{"none", chat.ThinkNone, "", "<think>x</think>y", "", "<think>x</think>y"},
		{"gemma 4 channel", chat.ThinkChannel, "<|turn>model\n", "<|channel>thought\nHmm.\n<channel|>Hi!", "Hmm.", "Hi!"},
		{"gemma 4, thinking off", chat.ThinkChannel, "<|turn>model\n<|channel>thought\n<channel|>", "Hi!", "", "Hi!"},
	}
	for _, tt := range tests {
		// Every way of cutting the reply in two pieces, and one piece per byte.
		for cut := 0; cut <= len(tt.reply); cut++ {
			s := chat.NewSplitter(tt.format, tt.prompt)
			var th, an strings.Builder
			for _, p := range []string{tt.reply[:cut], tt.reply[cut:]} {
				a, b := s.Push(p)
				th.WriteString(a)
				an.WriteString(b)
			}
			a, b := s.Flush()
			th.WriteString(a)
			an.WriteString(b)
			if th.String() != tt.thought || an.String() != tt.ans {
				t.Errorf("%s (cut at %d): thought %q answer %q, want %q %q", tt.name, cut, th.String(), an.String(), tt.thought, tt.ans)
				break
			}
		}
		s := chat.NewSplitter(tt.format, tt.prompt)
		var th, an strings.Builder
		for i := range len(tt.reply) {
			a, b := s.Push(tt.reply[i : i+1])
			th.WriteString(a)
			an.WriteString(b)
		}
		a, b := s.Flush()
		if th.String()+a != tt.thought || an.String()+b != tt.ans {
			t.Errorf("%s (byte by byte): thought %q answer %q", tt.name, th.String()+a, an.String()+b)
		}
	}
}

func TestDetectThinkFormat(t *testing.T) {
	want := map[string]chat.ThinkFormat{
		"Qwen-Qwen3-0.6B": chat.ThinkTags,
		"Qwen-QwQ-32B":    chat.ThinkTags,
		"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": chat.ThinkTags,
		"HuggingFaceTB-SmolLM3-3B":                 chat.ThinkTags,
		"openai-gpt-oss-120b":                      chat.ThinkHarmony,
		"Qwen-Qwen2.5-7B-Instruct":                 chat.ThinkNone,
		"meta-llama-Llama-3.1-8B-Instruct":         chat.ThinkNone,
		"mistralai-Mistral-Nemo-Instruct-2407":     chat.ThinkNone,
		"deepseek-ai-DeepSeek-R1-Distill-Llama-8B": chat.ThinkTags,
		"google-gemma-2-2b-it":                     chat.ThinkNone,
		"google-gemma-4-31B-it":                    chat.ThinkChannel,
	}
	for name, f := range want {
		src, err := os.ReadFile("testdata/templates/" + name + ".jinja")
		if err != nil {
			t.Fatal(err)
		}
		if got := chat.DetectThinkFormat(string(src)); got != f {
			t.Errorf("%s: %v, want %v", name, got, f)
		}
	}
}

// A header longer than a harmony header is answer text, however the text is cut.
func TestSplitterLongHarmonyHeader(t *testing.T) {
	reply := strings.Repeat("x", 300) + "<|message|>after"
	for _, cut := range []int{1, 7, 100, len(reply)} {
		if _, an := splitInPieces(chat.NewSplitter(chat.ThinkHarmony, ""), reply, cut); an != reply {
			t.Errorf("cut %d: answer %q", cut, an)
		}
	}
}

// splitInPieces pushes reply through s in pieces of n bytes, then flushes it, and returns the thought and the answer.
func splitInPieces(s *chat.Splitter, reply string, n int) (thought, answer string) {
	var th, an strings.Builder
	for rest := reply; rest != ""; {
		k := min(n, len(rest))
		t, a := s.Push(rest[:k])
		th.WriteString(t)
		an.WriteString(a)
		rest = rest[k:]
	}
	t, a := s.Flush()
	return th.String() + t, an.String() + a
}

// A harmony message to a function (the recipient before or after the channel) is a call: the answer gets it as
// <|call|>{"name": ..., "arguments": ...}, the syntax the reply's toolStream reads; a reply that may not call drops
// the message (its arguments are no answer). Any cutting of the text gives the same.
func TestSplitterHarmonyCall(t *testing.T) {
	const args = `{"city": "Paris", "unit": "c"}`
	for _, tc := range []struct {
		name, reply string
		calls       bool
		thought     string
		answer      string
	}{
		{"recipient after the channel", "<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>" + args + "<|call|>",
			true, "Look it up.", `<|call|>{"name": "get_weather", "arguments": ` + args + "}"},
		{"recipient before the channel", "<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>" + args + "<|call|>",
			true, "Look it up.", `<|call|>{"name": "get_weather", "arguments": ` + args + "}"},
		{"commentary without a recipient is answer text", "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>" + args + "<|call|>",
			true, "", `Checking.<|call|>{"name": "get_weather", "arguments": ` + args + "}"},
		{"the engine ends on <|call|> without passing it on", "<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>" + args,
			true, "Look it up.", `<|call|>{"name": "get_weather", "arguments": ` + args + "}"},
		{"cut inside the arguments: no call's end", "<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>" + args[:9],
			true, "Look it up.", `<|call|>{"name": "get_weather", "arguments": ` + args[:9]},
		{"no tools", "<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>" + args + "<|call|>",
			false, "Look it up.", ""},
		{"no tools: only the call is dropped", "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>" + args + "<|call|>",
			false, "", "Checking."},
	} {
		for _, cut := range []int{1, 3, 11, len(tc.reply)} {
			s := chat.NewSplitter(chat.ThinkHarmony, "<|start|>assistant")
			if tc.calls {
				s = chat.NewCallSplitter(chat.ThinkHarmony, "<|start|>assistant")
			}
			if th, an := splitInPieces(s, tc.reply, cut); th != tc.thought || an != tc.answer {
				t.Errorf("%s, cut %d: thought %q answer %q, want %q %q", tc.name, cut, th, an, tc.thought, tc.answer)
			}
		}
	}
}
