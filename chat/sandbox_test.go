package chat_test

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
)

// hostileTemplates loop, recurse or allocate without bound; each must be refused at load (by the render limit: the
// refusal is the check, not how long a busy machine took to deliver it), without harming the process that loads it.
// (range() stops at 100000, as in jinja2's sandbox: a longer loop nests two.)
var hostileTemplates = map[string]string{
	"long loop":         "{% for i in range(100000000) %}{% endfor %}{{ messages[0].content }}",
	"nested loops":      "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{{ messages[0].content }}",
	"huge output":       "{% for i in range(100000) %}{% for j in range(1000) %}xxxxxxxxxxxxxxxx{% endfor %}{% endfor %}",
	"doubling string":   "{% set ns = namespace(s='xy') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
	"string repetition": "{{ 'x' * 100000000000 }}{{ messages[0].content }}",
	"macro recursion":   "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
	"only on long chats": "{% if messages | length > 100 %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}" +
		"{% for m in messages %}{{ m.content }}{% endfor %}",
}

// hangWait bounds what must end: it only catches a hang.
const hangWait = time.Minute

// renderLimit is the render limit of the test sandboxes: a second, or, on a machine that is slow now, ten times what a
// sandbox takes here to start and render a trivial template (a baseline measured by each test on the same machine:
// under a CPU hog with -race a good template's probes took over a second). A hostile template is
// unbounded, so any limit refuses it; a good one must never be refused for the machine's load.
func renderLimit(t *testing.T) time.Duration {
	t.Helper()
	s := chat.NewSandbox(chat.WithRenderTimeout(hangWait))
	defer s.Close()
	tmpl := chat.NewJinja("{% for m in messages %}{{ m.content }}{% endfor %}", chat.JinjaConfig{Renderer: s})
	start := time.Now()
	if _, err := tmpl.RenderJinja([]parley.Message{{Role: parley.RoleUser, Content: "hello"}}, chat.Gen); err != nil {
		t.Fatal(err)
	}
	limit := max(time.Second, 10*time.Since(start))
	t.Logf("render limit %v (a sandbox's first render took %v)", limit, time.Since(start))
	return limit
}

func newTestSandbox(t *testing.T) *chat.Sandbox {
	t.Helper()
	s := chat.NewSandbox(chat.WithRenderTimeout(renderLimit(t)), chat.WithSandboxMemory(512<<20))
	t.Cleanup(func() { s.Close() })
	return s
}

func TestSandboxRefusesHostileTemplates(t *testing.T) {
	s := newTestSandbox(t)
	good, err := os.ReadFile("testdata/templates/Qwen-Qwen3-0.6B.jinja")
	if err != nil {
		t.Fatal(err)
	}
	for name, src := range hostileTemplates {
		start := time.Now()
		_, err := chat.LoadJinja(src, chat.JinjaConfig{Renderer: s})
		took := time.Since(start)
		if !errors.Is(err, chat.ErrTemplateLimit) {
			t.Errorf("%s: LoadJinja err %v, want ErrTemplateLimit", name, err)
			continue
		}
		t.Logf("%s: refused in %v: %v", name, took.Round(time.Millisecond), err)
		if took > hangWait {
			t.Errorf("%s: refused after %v, want by the render limit", name, took)
		}
		// The sandbox recovers: the next template renders.
		tmpl, err := chat.LoadJinja(string(good), chat.JinjaConfig{Renderer: s})
		if err != nil {
			t.Fatalf("after %s, a good template: %v", name, err)
		}
		out, err := tmpl.RenderJinja([]parley.Message{{Role: parley.RoleUser, Content: "Hello"}}, chat.Gen)
		if err != nil || !strings.HasSuffix(out, "<|im_start|>assistant\n") {
			t.Fatalf("after %s, a good template rendered %q, %v", name, out, err)
		}
	}
}

// A template that passes the probes but misbehaves on some later conversation is capped per render: the render
// fails with ErrTemplateLimit and the turn falls back to the hand-written family.
func TestSandboxCapsEachRender(t *testing.T) {
	s := newTestSandbox(t)
	// range() stops at 100000 (jinja2's sandbox MAX_RANGE): two nested ranges make the slow render.
	src := "{% if messages[-1].content == 'boom' %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}" +
		"{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" +
		"{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
	tmpl, err := chat.LoadJinja(src, chat.JinjaConfig{Renderer: s})
	if err != nil {
		t.Fatal(err)
	}
	boom := []parley.Message{{Role: parley.RoleUser, Content: "boom"}}
	start := time.Now()
	if _, err := tmpl.RenderJinja(boom, chat.Gen); !errors.Is(err, chat.ErrTemplateLimit) {
		t.Fatalf("render err %v, want ErrTemplateLimit", err)
	}
	if took := time.Since(start); took > hangWait {
		t.Errorf("the capped render took %v", took)
	}
	out, err := tmpl.Render(boom, chat.Gen) // with the fallback (chatml, detected from the source)
	if err != nil || out != "<|im_start|>user\nboom<|im_end|>\n<|im_start|>assistant\n" {
		t.Errorf("fallback render %q, %v", out, err)
	}
}

// The sandbox renders exactly as in process.
func TestSandboxRendersLikeInProcess(t *testing.T) {
	s := newTestSandbox(t)
	for _, name := range []string{"openai-gpt-oss-120b", "meta-llama-Llama-3.1-8B-Instruct", "Qwen-Qwen3-0.6B"} {
		src, err := os.ReadFile("testdata/templates/" + name + ".jinja")
		if err != nil {
			t.Fatal(err)
		}
		now := func() time.Time { return time.Unix(1.7e9, 0) }
		in := chat.NewJinja(string(src), chat.JinjaConfig{Now: now})
		sb := chat.NewJinja(string(src), chat.JinjaConfig{Now: now, Renderer: s})
		for _, c := range goldenCases() {
			a, errA := in.RenderJinja(c.msgs, c.opt)
			b, errB := sb.RenderJinja(c.msgs, c.opt)
			if a != b || (errA == nil) != (errB == nil) {
				t.Errorf("%s/%s: in process %q (%v), sandbox %q (%v)", name, c.name, a, errA, b, errB)
			}
		}
	}
}

// A render stuck on one conversation holds up one child, not the others' renders: a normal render started beside it
// returns while the stuck one is still running (the order of the two events, not a time).
func TestSandboxSlowRenderDoesNotStallOthers(t *testing.T) {
	s := chat.NewSandbox(chat.WithRenderTimeout(2*renderLimit(t)), chat.WithSandboxWorkers(2))
	defer s.Close()
	// range() stops at 100000 (jinja2's sandbox MAX_RANGE): two nested ranges make the slow render.
	src := "{% if messages[-1].content == 'boom' %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}" +
		"{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
	tmpl := chat.NewJinja(src, chat.JinjaConfig{Renderer: s})
	if _, err := tmpl.RenderJinja([]parley.Message{{Role: parley.RoleUser, Content: "warm"}}, chat.Gen); err != nil {
		t.Fatal(err)
	}
	slow := make(chan error, 1)
	go func() {
		_, err := tmpl.RenderJinja([]parley.Message{{Role: parley.RoleUser, Content: "boom"}}, chat.Gen)
		slow <- err
	}()
	time.Sleep(200 * time.Millisecond) // the slow render holds its child
	if _, err := tmpl.RenderJinja([]parley.Message{{Role: parley.RoleUser, Content: "hello"}}, chat.Gen); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-slow:
		t.Fatalf("the normal render returned only after the stuck one (%v)", err)
	default:
	}
	if err := <-slow; !errors.Is(err, chat.ErrTemplateLimit) {
		t.Errorf("the stuck render: %v, want ErrTemplateLimit", err)
	}
}
