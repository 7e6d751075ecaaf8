package chat_test

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/parley-chat/parley/chat"
)

// A source that nests without bound is refused at once as a template limit (jinja2's RecursionError), before a
// recursive parser sees it, and never overflows the stack: brackets, unary operators, a chain of binary operators
// (which nests one level per operator once written for the engine), blocks.
func TestJinjaSourceNesting(t *testing.T) {
	cases := map[string]string{
		"brackets":  "{{ " + strings.Repeat("(", 20000) + "1" + strings.Repeat(")", 20000) + " }}",
		"lists":     "{{ " + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + " }}",
		"not":       "{{ " + strings.Repeat("not ", 20000) + "x }}",
		"negation":  "{{ " + strings.Repeat("-", 20000) + "1 }}",
		"plus":      "{{ 1" + strings.Repeat(" + 1", 20000) + " }}",
		"compare":   "{{ 1" + strings.Repeat(" < 1", 20000) + " }}",
		"ternary":   "{{ 1" + strings.Repeat(" if 1 else 1", 20000) + " }}",
		"filters":   "{{ 1" + strings.Repeat("|string", 20000) + " }}",
		"blocks":    strings.Repeat("{% if 1 %}", 20000) + strings.Repeat("{% endif %}", 20000),
		"for loops": strings.Repeat("{% for x in [1] %}", 10000) + strings.Repeat("{% endfor %}", 10000),
	}
	r := &chat.InProcess{}
	for name, src := range cases {
		_, err := r.RenderJinja(src, []byte(`{}`))
		if !errors.Is(err, chat.ErrTemplateLimit) || !strings.Contains(err.Error(), "maximum recursion depth") {
			t.Errorf("%s: %v, want a recursion limit", name, err)
		}
	}
	// A real template's chains are far from the limits.
	ok := "{{ 'a'" + strings.Repeat(" + 'a'", 200) + " }}" + strings.Repeat("{% if 1 %}", 100) + "x" + strings.Repeat("{% endif %}", 100)
	if out, err := r.RenderJinja(ok, []byte(`{}`)); err != nil || out != strings.Repeat("a", 201)+"x" {
		t.Errorf("a long chain: %q, %v", out, err)
	}
}

// A template jinja2 refuses to compile is refused with a syntax error, not as a limit (which would say the template
// is hostile).
func TestJinjaSourceSyntaxErrors(t *testing.T) {
	for _, src := range []string{
		"{{ x ", "{% if x %}", "{% endif %}", "{% for x in %}{% endfor %}", "{{ 'unterminated }}", "{{ x + }}",
		"{% nosuchtag %}", "{{ (1 }}", "{{ [1) }}", "{# no end", "{% raw %} no end", "{% macro f(1) %}{% endmacro %}",
		"{{ f(*a, b) }}", "{{ f(k=1, 2) }}", "{% else %}", "{% break %}", "{{ x is }}", "{{ a.1.b.( }}", "{{ @ }}",
	} {
		_, err := (&chat.InProcess{}).RenderJinja(src, []byte(`{}`))
		if err == nil || errors.Is(err, chat.ErrTemplateLimit) {
			t.Errorf("%q: %v, want a syntax error", src, err)
		}
	}
}

// FuzzJinjaSource: any template source renders or fails with an error, never a panic or a crash of the process.
func FuzzJinjaSource(f *testing.F) {
	for _, s := range []string{
		"{%- for m in messages -%}{{ m.role ~ ': ' ~ m.content }}\n{% endfor %}",
		"{% macro f(a, b=[1, 2]) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ f(*x, **y) }}",
		"{{ {'a': {1: none}}|tojson }}{{ d.items() }}{% set l = [] %}{{ l.append }}",
		"a {%+ if x -%} b {%- raw -%} {{ }} {% endraw +%}\n{#- c #}",
		"{{ x is divisibleby 3 }}{{ 'a' * -1 }}{{ 1 // 0 }}{{ '%s %(k)s' % x }}",
		"{{ '\\u00e9\\x41\\N' }}{{ 1_000 }}{{ 1e3 }}{{ .5 }}{{ x.0 }}",
	} {
		f.Add(s, `{"messages":[{"role":"user","content":"hi"}],"x":[1,2],"y":{"b":2},"d":{"items":1}}`)
	}
	f.Fuzz(func(t *testing.T, src, vars string) {
		if len(src) > 4096 || strings.Contains(src, "range") || bigNumber.MatchString(src) {
			return // the sandbox bounds a render's time and memory; the fuzzer checks only that a render answers
		}
		(&chat.InProcess{}).RenderJinja(src, []byte(vars)) //nolint:errcheck // any answer is fine
	})
}

var bigNumber = regexp.MustCompile(`\d{4,}|\*\*`)
