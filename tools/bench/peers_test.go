package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
	"github.com/parley-chat/parley/internal/testmodel"
)

// peerConvs are conversations both renderings must agree on.
func peerConvs() [][]parley.Message {
	u := func(s string) parley.Message { return parley.Message{Role: parley.RoleUser, Content: s} }
	a := func(s string) parley.Message { return parley.Message{Role: parley.RoleAssistant, Content: s} }
	sys := func(s string) parley.Message { return parley.Message{Role: parley.RoleSystem, Content: s} }
	return [][]parley.Message{
		{u(promptFor(0, 0))},
		{u(promptFor(1, 0)), a("Once upon a time, Tom had a red ball."), u(promptFor(1, 1))},
		{u("a"), a("b"), u("c"), a("d"), u("e")},
		{sys("Be kind."), u("Hi"), a("Hello."), u("Bye")},
	}
}

// TestLlamaTemplateMatchesParley renders the conversations with the chat
// template given to llama-server (through Parley's Jinja) and with Parley's
// plain transcript: llama-server must be given the same prompt text.
// TestLlamaServerPeer checks llama-server's own rendering too.
func TestLlamaTemplateMatchesParley(t *testing.T) {
	plain, err := chat.TemplateByName(chat.NamePlain)
	if err != nil {
		t.Fatal(err)
	}
	j := chat.NewJinja(llamaPlainTemplate, chat.JinjaConfig{Fallback: plain})
	for _, conv := range peerConvs() {
		want, err := plain.Render(conv, chat.Gen)
		if err != nil {
			t.Fatal(err)
		}
		got, err := j.Render(conv, chat.Gen)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("the llama-server template renders\n%q\nParley renders\n%q", got, want)
		}
	}
}

func TestLlamaServerArgs(t *testing.T) {
	args, err := llamaServerArgs(serverConfig{model: "/m/x.gguf", ctx: 1024, parallel: 8, threads: 2, flashAttn: "off", gpuLayers: "0"}, "127.0.0.1:4567", "/s/t.jinja")
	if err != nil {
		t.Fatal(err)
	}
	got := " " + strings.Join(args, " ") + " "
	// -c is all slots' context: 8 slots of 1024 tokens, as Parley's --ctx 1024 --parallel 8.
	for _, want := range []string{" --model /m/x.gguf ", " --host 127.0.0.1 --port 4567 ", " --threads 2 --threads-batch 2 ", " --parallel 8 ", " --ctx-size 8192 ",
		" --flash-attn off ", " --chat-template-file /s/t.jinja ", " --n-gpu-layers 0 "} {
		if !strings.Contains(got, want) {
			t.Errorf("llama-server args lack %q: %s", want, got)
		}
	}
	if args, _ := llamaServerArgs(serverConfig{gpuLayers: "auto", parallel: 1, ctx: 64}, "127.0.0.1:1", "t"); slices.Contains(args, "--n-gpu-layers") {
		t.Errorf("-gpu-layers auto passes --n-gpu-layers: %q", args)
	}
	if _, err := llamaServerArgs(serverConfig{}, "no-port", "t"); err == nil {
		t.Error("an address without a port accepted")
	}
}

func TestPeerFlags(t *testing.T) {
	model := testmodel.Path(t)
	exe, err := os.Executable() // any file that exists stands in for the binaries
	if err != nil {
		t.Fatal(err)
	}
	c, err := parseFlags([]string{"-models", model, "-parley", exe, "-llama-server", exe, "-engine-lib", "/lib/x",
		"-servers", "parley,parley-current,llama-server", "-raw-engines", "embedded,current"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.peers.rawEngines, []string{"embedded", "current"}) {
		t.Errorf("raw engines %q", c.peers.rawEngines)
	}
	if got := strings.Join(c.parleyArgsFor("parley-current"), " "); got != "--engine auto --engine current --engine-lib /lib/x" {
		t.Errorf("parley-current args %q", got)
	}
	if got := strings.Join(c.parleyArgsFor("parley"), " "); got != "--engine auto --engine-lib /lib/x" {
		t.Errorf("parley args %q", got)
	}
	if c.parleyEngine("llama-server") != "" || c.parleyEngine("parley-current") != "current" || c.parleyEngine("parley") != "auto" {
		t.Error("parleyEngine")
	}
	if c, _ := parseFlags([]string{"-models", model, "-servers", ""}, &bytes.Buffer{}); !slices.Equal(c.peers.rawEngines, []string{"auto"}) {
		t.Errorf("default raw engines %q, want -engine's", c.peers.rawEngines)
	}
	for _, args := range [][]string{
		{"-models", model, "-servers", "parley-vllm"},
		{"-models", model, "-servers", "", "-raw-engines", "embedded,cuda"},
		{"-models", model, "-servers", "llama-server", "-llama-server", "/nonexistent/llama-server"},
	} {
		if _, err := parseFlags(args, &bytes.Buffer{}); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
}

// TestPeersTable renders the table and targets from measurements
// made up to cross each target from both sides.
func TestPeersTable(t *testing.T) {
	run := func(tokens int, ttft, decode time.Duration) turnResult {
		return turnResult{TTFT: ttft, Decode: decode, Tokens: tokens, PromptTokens: 30, CachedTokens: -1}
	}
	// tok/s = (tokens-1) / decode: 101 tokens over 1 s is 100 tok/s.
	stream := func(rate float64) *streamResult {
		return &streamResult{Runs: []turnResult{run(101, 50*time.Millisecond, time.Duration(float64(time.Second)*100/rate))}}
	}
	conv := func(n int, rate float64, ttft time.Duration) concResult {
		c := concResult{Sessions: n, Wall: time.Second, Turns: make([][]turnResult, n)}
		for i := range n {
			for turn := range 3 {
				r := run(11, ttft, time.Duration(float64(time.Second)*10/rate))
				r.Turn = turn
				c.Turns[i] = append(c.Turns[i], r)
			}
		}
		return c
	}
	rep := &report{
		Cfg: config{engine: "embedded", threads: 2, parallel: 8, ctx: 2048, turns: 3, concurrency: []int{1, 8}, flashAttn: "off",
			servers: []string{"parley-embedded", "parley-current", "llama-server"}, peers: peerConfig{rawEngines: []string{"embedded", "current"}}},
		LlamaServerVersion: "1 (abc)",
		Models: []modelReport{{
			Name: "m",
			Raws: []rawResult{{Engine: "embedded", Runs: stream(100).Runs}, {Engine: "current", Runs: stream(200).Runs}},
			Servers: []serverReport{
				{Name: "parley-embedded", Stream: stream(95), Conv: []concResult{conv(1, 90, 20*time.Millisecond), conv(8, 20, 80*time.Millisecond)}},
				{Name: "parley-current", Stream: stream(150), Conv: []concResult{conv(1, 140, 10*time.Millisecond), conv(8, 30, 40*time.Millisecond)}},
				{Name: "llama-server", Stream: stream(160), Conv: []concResult{conv(1, 120, 15*time.Millisecond), conv(8, 25, 50*time.Millisecond)}},
			},
		}},
	}
	rep.Models[0].Raw = &rep.Models[0].Raws[0]
	var b strings.Builder
	rep.mdPeers(func(format string, args ...any) { b.WriteString(fmt.Sprintf(format, args...)) })
	md := b.String()
	for _, want := range []string{
		"### Engines and peers",
		"`--threads 2 --threads-batch 2 --parallel 8 --ctx-size 16384 --flash-attn off`",
		"| m | raw loop, embedded engine | 100.0 |",
		"| m | raw loop, current engine | 200.0 |",
		"| m | Parley, embedded engine | 100.0 | 95.0 | 95% | 50.0 | 90.0 | 20.0 | 264.0 | 20.0 | 80.0 |",
		"| m | Parley, current engine | 200.0 | 150.0 | 75% |",
		"| m | llama-server 1 (abc) | - | 160.0 | - |",
		"m, Parley embedded: single stream within 10% of the raw loop: 95% (met)",
		"m, Parley current: single stream within 10% of the raw loop: 75% (**missed**)",
		"m, Parley current: single stream at or ahead of llama-server's: 150.0 vs 160.0 tok/s (**missed**)",
		"m, Parley current, 1 conversation(s) vs llama-server: aggregate 33.0 vs 33.0 tok/s (**missed**), stream 140.0 vs 120.0 tok/s (met), warm TTFT 10.0 vs 15.0 ms (met)",
		"m, Parley embedded, 8 conversation(s) vs llama-server: aggregate 264.0 vs 264.0 tok/s (**missed**), stream 20.0 vs 25.0 tok/s (**missed**), warm TTFT 80.0 vs 50.0 ms (**missed**)",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("table lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "Parley embedded: single stream at or ahead") {
		t.Error("the single-stream target against llama-server is the current engine's, not the embedded one's")
	}
	// A paired stream that failed in a later round: the rounds before keep
	// their figures, and the failure is in the errors column.
	rep.Models[0].Servers[2].Stream.Err = "unexpected EOF"
	b.Reset()
	rep.mdPeers(func(format string, args ...any) { b.WriteString(fmt.Sprintf(format, args...)) })
	if want := "| m | llama-server 1 (abc) | - | 160.0 | - |"; !strings.Contains(b.String(), want) || !strings.Contains(b.String(), "stream: unexpected EOF |") {
		t.Errorf("a later stream failure: table lacks %q or the error:\n%s", want, b.String())
	}
	// A run with neither llama-server nor a second engine writes no such table.
	rep.Cfg.servers, rep.Cfg.peers.rawEngines = []string{"parley", "ollama"}, []string{"embedded"}
	b.Reset()
	rep.mdPeers(func(format string, args ...any) { b.WriteString(fmt.Sprintf(format, args...)) })
	if b.Len() != 0 {
		t.Errorf("peers table without peers:\n%s", b.String())
	}
}

// TestLlamaServerPeer drives a real llama-server (scripts/build-llama-server.sh;
// skipped when it has not been built, as in CI) on stories260K: it must be
// given the same prompt text as Parley (its own rendering of the template,
// POST /apply-template), stream the single-stream workload from
// /v1/completions and the conversations from /v1/chat/completions, and find
// each turn's history in its cache.
func TestLlamaServerPeer(t *testing.T) {
	if testing.Short() {
		t.Skip("runs llama-server")
	}
	bin := os.Getenv("PARLEY_BENCH_LLAMA_SERVER")
	if bin == "" {
		cache, _ := os.UserCacheDir()
		bin = filepath.Join(cache, "parley", "llama-server", "bin", "llama-server")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("no llama-server at %s (scripts/build-llama-server.sh builds it)", bin)
	}
	plain, err := chat.TemplateByName(chat.NamePlain)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sc := serverConfig{model: testmodel.Path(t), ctx: 512, parallel: 4, threads: 2, flashAttn: "off", gpuLayers: "0", scratch: t.TempDir(), stops: plain.Stops()}
	p, tgt, err := startLlamaServer(ctx, bin, sc)
	if err != nil {
		t.Fatal(err)
	}
	defer p.stop(10 * time.Second)
	defer tgt.Close()
	if v := llamaServerVersion(ctx, bin); v == "" {
		t.Error("no version from llama-server --version")
	}

	for _, conv := range peerConvs() {
		want, err := plain.Render(conv, chat.Gen)
		if err != nil {
			t.Fatal(err)
		}
		var msgs []ollamaMessage
		for _, m := range conv {
			msgs = append(msgs, ollamaMessage{Role: string(m.Role), Content: m.Content})
		}
		body, _ := json.Marshal(map[string]any{"messages": msgs})
		resp, err := http.Post("http://"+tgt.addr+"/apply-template", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var got struct {
			Prompt string `json:"prompt"`
		}
		if err := json.Unmarshal(b, &got); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("/apply-template: %s %s (%v)", resp.Status, b, err)
		}
		if got.Prompt != want {
			t.Errorf("llama-server renders\n%q\nParley renders\n%q", got.Prompt, want)
		}
	}

	if err := warmup(ctx, tgt, 1); err != nil {
		t.Fatal(err)
	}
	st := runStream(ctx, tgt, 16, 2, 1)
	if st.Err != "" || len(st.Runs) != 2 {
		t.Fatalf("stream: %+v", st)
	}
	for _, r := range st.Runs {
		if r.Tokens < 2 || r.Tokens > 16 || r.TTFT <= 0 || r.rate() <= 0 || r.PromptTokens < 5 {
			t.Errorf("stream run %+v", r)
		}
	}
	c := runConversations(ctx, tgt, 0, 4, 3, 8, 1) // 4 at once: a kept-alive connection failed here once (see startLlamaServer)
	if len(c.Errors) > 0 {
		t.Fatalf("conversations: %v", c.Errors)
	}
	for i, sess := range c.Turns {
		if len(sess) != 3 {
			t.Fatalf("session %d: %d turns", i, len(sess))
		}
		for k, r := range sess {
			if r.Tokens < 1 || r.Tokens > 8 || r.TTFT <= 0 || r.Text == "" {
				t.Errorf("session %d turn %d: %+v", i, k, r)
			}
			if k > 0 && (r.PromptTokens <= sess[k-1].PromptTokens || r.CachedTokens <= 0) {
				t.Errorf("session %d turn %d: prompt %d tokens (%d cached), turn before %d: the history did not grow or was not found in the cache",
					i, k, r.PromptTokens, r.CachedTokens, sess[k-1].PromptTokens)
			}
		}
	}
	if err := p.exited(); err != nil {
		t.Fatal(err)
	}
}
