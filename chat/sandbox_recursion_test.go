package chat_test

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
)

// schemaTypeTemplate renders each tool parameter's JSON-schema type with a recursive macro, as several tool
// templates do (a reconstruction of the construct, not any model's template verbatim): a type given as a list
// such as ["boolean", "null"] makes the macro call itself with the same value, without end.
const schemaTypeTemplate = `{%- macro render_type(p) -%}
{%- if p.type is string -%}{{ p.type }}
{%- elif p.type is sequence -%}{{ render_type(p) }}
{%- else -%}any{%- endif -%}
{%- endmacro -%}
{%- if tools %}<|im_start|>system
{%- for t in tools %}
{{ t.function.name }}({% for name, p in t.function.parameters.properties.items() %}{{ name }}: {{ render_type(p) }}{% endfor %})
{%- endfor %}<|im_end|>
{% endif -%}
{%- for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}`

// A request whose tool makes the template recurse without end is refused at once inside the renderer: no child
// dies or is killed at its time limit, and a normal conversation rendered beside a loop of such requests renders
// every time. The render time limit is a minute, so a recursion that held a worker to it would show as a hang.
func TestSandboxRecursionHoldsNoWorker(t *testing.T) {
	s := chat.NewSandbox(chat.WithRenderTimeout(time.Minute), chat.WithSandboxWorkers(2))
	defer s.Close()
	tmpl, err := chat.LoadJinja(schemaTypeTemplate, chat.JinjaConfig{Renderer: s})
	if err != nil {
		t.Fatalf("the template passes the probes (their tool's type is a string): %v", err)
	}
	nullable := []parley.Tool{{Name: "set_flag", Description: "Set a flag",
		Parameters: json.RawMessage(`{"type":"object","properties":{"on":{"type":["boolean","null"]}}}`)}}
	hostile := []parley.Message{{Role: parley.RoleUser, Content: "Set it"}}
	normal := []parley.Message{{Role: parley.RoleUser, Content: "Hello"}}
	const want = "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"

	// The normal turn alone, for the figures logged below.
	alone := make([]time.Duration, 0, 50)
	for range 50 {
		start := time.Now()
		out, err := tmpl.RenderJinja(normal, chat.Gen)
		alone = append(alone, time.Since(start))
		if err != nil || out != want {
			t.Fatalf("normal render %q, %v", out, err)
		}
	}

	const loops = 200
	var (
		wg      sync.WaitGroup
		refused int
		errs    []error
	)
	wg.Go(func() {
		for range loops {
			_, err := tmpl.RenderJinja(hostile, chat.RenderOptions{AddGenerationPrompt: true, Tools: nullable})
			switch {
			case errors.Is(err, chat.ErrTemplateLimit) && strings.Contains(err.Error(), "maximum recursion depth"):
				refused++
			default:
				errs = append(errs, err)
			}
		}
	})
	beside := make([]time.Duration, 0, 200)
	for range 200 {
		start := time.Now()
		out, err := tmpl.RenderJinja(normal, chat.Gen)
		beside = append(beside, time.Since(start))
		if err != nil || out != want {
			t.Errorf("normal render beside the loop %q, %v", out, err)
		}
	}
	wg.Wait()
	if refused != loops {
		t.Errorf("%d of %d recursive renders refused for their recursion; others: %v", refused, loops, errs)
	}
	if n := chat.SandboxStarts(s); n > 2 {
		t.Errorf("%d sandbox children started for 2 workers: a recursive render killed one", n)
	}
	// With the fallback, the same request renders in the template's family instead.
	if out, err := tmpl.Render(hostile, chat.RenderOptions{AddGenerationPrompt: true, Tools: nullable}); err != nil || out == "" {
		t.Errorf("fallback render %q, %v", out, err)
	}
	t.Logf("normal turn's render: median %v alone, %v beside %d recursive requests", median(alone), median(beside), loops)
}

func median(d []time.Duration) time.Duration {
	d = slices.Clone(d)
	slices.Sort(d)
	return d[len(d)/2]
}
