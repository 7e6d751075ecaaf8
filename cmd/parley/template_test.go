package main

import (
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/parley-chat/parley/internal/synth"
	"github.com/parley-chat/parley/internal/testbin"
	"github.com/parley-chat/parley/internal/testmodel"
)

// The binary renders a GGUF's own chat template in its sandbox process and splits a reasoning model's thought.
func TestBinaryModelTemplate(t *testing.T) {
	bin := testbin.Parley(t)
	src, err := os.ReadFile("../../chat/testdata/templates/Qwen-Qwen3-0.6B.jinja")
	if err != nil {
		t.Fatal(err)
	}
	script := synth.ChatMLThinking()
	script.Template = string(src)
	s := start(t, bin, "--model", testmodel.Scripted(t, script), "--store", "memory")
	if !strings.Contains(s.log(), "rendering with the model's own chat template") {
		t.Errorf("the log does not say the model's template renders:\n%s", s.log())
	}
	res, err := http.Get("http://" + s.addr + "/info")
	if err != nil {
		t.Fatal(err)
	}
	var info struct{ Template, Thinking string }
	err = json.NewDecoder(res.Body).Decode(&info)
	res.Body.Close()
	if err != nil || info.Template != "jinja" || info.Thinking != "think-tags" {
		t.Errorf("/info: template %q thinking %q (%v)", info.Template, info.Thinking, err)
	}
	ws := s.dial(t, "")
	read(t, ws) // session
	ws.WriteJSON(map[string]any{"type": "prompt", "content": "hi", "params": map[string]any{"max_tokens": 64}})
	var thought strings.Builder
	for {
		m := read(t, ws)
		if m.Type == "thinking" {
			thought.WriteString(m.Text)
			continue
		}
		if m.Type != "done" {
			continue
		}
		if m.Content != "Hello there, how are you today?" || m.Thinking != "The user says hi. I should greet them." ||
			thought.String() != m.Thinking {
			t.Errorf("done %+v, streamed thought %q", m, thought.String())
		}
		break
	}
}

// A GGUF whose template never ends is refused at load, within the sandbox's time limit; the server serves with the
// hand-written family instead, and stays responsive.
func TestBinaryRefusesHostileTemplate(t *testing.T) {
	bin := testbin.Parley(t)
	script := synth.ChatMLThinking()
	script.Template = "{% for i in range(1000000000) %}{% endfor %}" + script.Template
	began := time.Now()
	s := start(t, bin, "--model", testmodel.Scripted(t, script), "--store", "memory")
	took := time.Since(began)
	// Why: a sandbox limit, the time or the memory cap (the loop's range may be built first; which limit comes first
	// depends on the machine's load).
	log := s.log()
	if !strings.Contains(log, "the model's chat template is refused") || !strings.Contains(log, "exceeded its limits") {
		t.Errorf("the log does not say the template was refused and why:\n%s", log)
	}
	if took > 2*time.Minute { // catches a hang: how long the sandbox's limit took depends on the machine's load
		t.Errorf("the server took %v to become ready", took)
	}
	ws := s.dial(t, "")
	read(t, ws)
	if m := turn(t, ws, "hi", map[string]any{"max_tokens": 64}); m.FinishReason == "" || m.Content == "" {
		t.Errorf("a turn with the fallback family: %+v", m)
	}
}
