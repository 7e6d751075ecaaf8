package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/parley-chat/parley/internal/proc"
)

// server is a server process the benchmark started. It runs in its own
// process group so that stopping it also stops its children (ollama serve
// starts an `ollama runner` process per loaded model).
type server struct {
	*proc.Proc
	name    string
	logPath string
	logFile *os.File
}

// startServer starts bin with args and env, its output going to logPath. The
// process is watched by one goroutine (proc.Start's), which ends when the
// process does; stop makes sure it does.
func startServer(name, bin string, args, env []string, logPath string) (*server, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("%s log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = proc.OwnGroup() // killed with the benchmark, even a killed one
	p, err := proc.Start(cmd)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return &server{Proc: p, name: name, logPath: logPath, logFile: f}, nil
}

// exited returns an error if the process has already ended.
func (s *server) exited() error {
	select {
	case <-s.Done():
		return fmt.Errorf("%s exited early (%v); see %s:\n%s", s.name, s.Err(), s.logPath, tail(s.logPath, 20))
	default:
		return nil
	}
}

// stop asks the process group to end (SIGTERM), waits up to grace, then
// kills it. Children left in the group after the leader exits are killed too.
func (s *server) stop(grace time.Duration) {
	pgid := s.Cmd.Process.Pid // Setpgid: the group id is the leader's pid
	select {
	case <-s.Done():
	default:
		syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-s.Done():
		case <-time.After(grace):
			syscall.Kill(-pgid, syscall.SIGKILL)
			<-s.Done()
		}
	}
	// The group id stays reserved while any member lives, so this reaches
	// only our own leftovers (ESRCH when there are none).
	syscall.Kill(-pgid, syscall.SIGKILL)
	s.logFile.Close()
}

// tail returns the last n lines of a file, for error messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitHTTP waits until url answers 200; when the server exits first, the
// error carries the end of its log.
func (s *server) waitHTTP(ctx context.Context, url string) error {
	err := s.WaitHTTP(ctx, url)
	if errors.Is(err, proc.ErrExited) {
		return s.exited()
	}
	if err != nil {
		return fmt.Errorf("%s not ready at %s: %w; see %s", s.name, url, err, s.logPath)
	}
	return nil
}

// serverConfig is what both servers are given, so they do the same work.
type serverConfig struct {
	model     string // GGUF path
	ctx       int    // tokens per session (slot)
	parallel  int    // sessions that generate at once
	threads   int
	flashAttn string // off, on or auto: parley --flash-attn and OLLAMA_FLASH_ATTENTION
	gpuLayers string // parley --gpu-layers (Ollama offloads what fits by itself)
	maxReply  int    // largest reply cap the workloads ask for
	scratch   string
	stops     []string // stop strings of Parley's plain transcript
}

// startParley runs `parley --model ... --parallel N --threads T` on a free
// loopback port and waits for /health. Sessions are stored in a scratch
// data directory (the default durable store, so each turn pays its commit, as
// in production), never in the user's.
func startParley(ctx context.Context, bin string, sc serverConfig, extra []string) (*server, string, error) {
	addr, err := proc.FreeAddr()
	if err != nil {
		return nil, "", err
	}
	dataDir := filepath.Join(sc.scratch, "parley-data")
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return nil, "", err
	}
	args := []string{
		"--model", sc.model,
		"--addr", addr,
		"--ctx", strconv.Itoa(sc.ctx),
		"--parallel", strconv.Itoa(sc.parallel),
		"--threads", strconv.Itoa(sc.threads),
		"--flash-attn", sc.flashAttn,
		"--gpu-layers", sc.gpuLayers,
		"--max-tokens", strconv.Itoa(sc.maxReply),
		"--log-format", "json",
		"--data-dir", dataDir,
		// Every bench session comes from one address: the per-client
		// session limits (and its share of the store's bytes) would refuse
		// the later ones.
		"--session-creates-per-minute", "0", "--max-sessions-per-client", "0", "--client-store-share", "1",
	}
	args = append(args, extra...)
	env := filterEnv(os.Environ(), "PARLEY_")
	p, err := startServer("parley", bin, args, env, filepath.Join(sc.scratch, "parley-"+filepath.Base(sc.model)+".log"))
	if err != nil {
		return nil, "", err
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := p.waitHTTP(wctx, "http://"+addr+"/health"); err != nil {
		p.stop(5 * time.Second)
		return nil, "", err
	}
	return p, addr, nil
}

// ollamaEnv is the environment of every ollama process of one run: a
// loopback address, a scratch model store and HOME (ollama writes a key pair
// under $HOME/.ollama), the same parallelism as Parley, models kept loaded,
// and no calls to ollama.com. Inherited OLLAMA_* variables are dropped so a
// user's settings cannot change what is measured.
func ollamaEnv(addr string, sc serverConfig) []string {
	env := filterEnv(os.Environ(), "OLLAMA_", "HOME=")
	switch sc.flashAttn {
	case "on":
		env = append(env, "OLLAMA_FLASH_ATTENTION=1")
	case "off":
		env = append(env, "OLLAMA_FLASH_ATTENTION=0")
	}
	return append(env,
		"HOME="+filepath.Join(sc.scratch, "ollama-home"),
		"OLLAMA_HOST="+addr,
		"OLLAMA_MODELS="+filepath.Join(sc.scratch, "ollama-models"),
		"OLLAMA_NUM_PARALLEL="+strconv.Itoa(sc.parallel),
		"OLLAMA_CONTEXT_LENGTH="+strconv.Itoa(sc.ctx),
		"OLLAMA_MAX_LOADED_MODELS=1",
		"OLLAMA_KEEP_ALIVE=-1",
		"OLLAMA_NO_CLOUD=1",
		"GIN_MODE=release",
	)
}

// startOllama runs `ollama serve` on a free loopback port and imports the
// model with `ollama create NAME -f Modelfile` (offline: the CLI uploads the
// GGUF to the local server as a blob).
func startOllama(ctx context.Context, bin string, sc serverConfig) (*server, ollamaTarget, error) {
	var t ollamaTarget
	addr, err := proc.FreeAddr()
	if err != nil {
		return nil, t, err
	}
	env := ollamaEnv(addr, sc)
	for _, d := range []string{"ollama-home", "ollama-models"} {
		if err := os.MkdirAll(filepath.Join(sc.scratch, d), 0o755); err != nil {
			return nil, t, err
		}
	}
	p, err := startServer("ollama", bin, []string{"serve"}, env, filepath.Join(sc.scratch, "ollama-"+filepath.Base(sc.model)+".log"))
	if err != nil {
		return nil, t, err
	}
	fail := func(err error) (*server, ollamaTarget, error) {
		p.stop(10 * time.Second)
		return nil, t, err
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := p.waitHTTP(wctx, "http://"+addr+"/api/version"); err != nil {
		return fail(err)
	}

	name := "parley-bench-" + strings.ToLower(strings.TrimSuffix(filepath.Base(sc.model), filepath.Ext(sc.model)))
	mf := filepath.Join(sc.scratch, name+".Modelfile")
	if err := os.WriteFile(mf, []byte(modelfile(sc)), 0o644); err != nil {
		return fail(err)
	}
	cctx, ccancel := context.WithTimeout(ctx, 3*time.Minute)
	defer ccancel()
	create := exec.CommandContext(cctx, bin, "create", name, "-f", mf)
	create.Env = env
	if out, err := create.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("ollama create %s: %w\n%s", name, err, lastLine(string(out))))
	}
	t = ollamaTarget{addr: addr, model: name, ctx: sc.ctx, threads: sc.threads, stops: sc.stops, client: &http.Client{
		Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true},
	}}
	return p, t, nil
}

// modelfile imports sc.model with a template that renders a conversation
// exactly as Parley's plain transcript does for a model without a chat
// template ("User: ..." and "Assistant: ..." paragraphs separated by a blank
// line, ending with "Assistant:"). Without a TEMPLATE, Ollama would use
// "{{ .Prompt }}", which drops the earlier turns' replies from the prompt.
// The PARAMETER lines repeat the per-request options so that the first load
// already has the right context and threads; the stop strings travel with
// each request (options.stop).
func modelfile(sc serverConfig) string {
	var b strings.Builder
	fmt.Fprintf(&b, "FROM %s\n", sc.model)
	fmt.Fprintf(&b, "TEMPLATE \"\"\"%s\"\"\"\n", ollamaPlainTemplate)
	fmt.Fprintf(&b, "PARAMETER num_ctx %d\nPARAMETER num_thread %d\nPARAMETER temperature 0\nPARAMETER repeat_penalty 1\n", sc.ctx, sc.threads)
	return b.String()
}

// ollamaPlainTemplate is an Ollama (Go text/template) rendering of Parley's
// plain transcript, chat.TemplateByName(chat.NamePlain), for conversations
// whose messages carry no surrounding whitespace (the benchmark's prompts, and
// replies, which it trims as Parley stores them). A test renders both.
const ollamaPlainTemplate = `{{- range $i, $m := .Messages }}{{ if $i }}

{{ end }}{{ if eq $m.Role "system" }}System: {{ else if eq $m.Role "assistant" }}Assistant: {{ else }}User: {{ end }}{{ $m.Content }}{{ end }}

Assistant:`

// filterEnv drops variables whose "NAME=" starts with any of the prefixes.
func filterEnv(env []string, prefixes ...string) []string {
	var out []string
next:
	for _, kv := range env {
		for _, p := range prefixes {
			if strings.HasPrefix(kv, p) {
				continue next
			}
		}
		out = append(out, kv)
	}
	return out
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexAny(s, "\r\n"); i >= 0 {
		return s[i+1:]
	}
	return s
}
