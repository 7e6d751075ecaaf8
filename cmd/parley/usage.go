package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// flagTopics orders `parley --help` and the flags tables of
// docs/operations.md (TestFlagsTableMatchesHelp keeps the two equal): every
// flag belongs to exactly one topic.
var flagTopics = []struct {
	title string
	flags []string
}{
	{"Model", []string{"model", "model-sha256", "model-cache", "ollama-models", "mmproj", "template", "version"}},
	{"Several models", []string{"models", "models-file", "max-loaded-models", "max-models-memory", "keep-alive", "client-keep-alive", "min-residency"}},
	{"Engine and performance", []string{"engine", "engine-lib", "ctx", "threads", "parallel", "cache-slots", "batch", "queue", "queue-per-client",
		"slots-per-client", "poll", "thread-pool", "huge-pages", "flash-attn", "gpu-layers", "kv-unified", "kv-cache-type", "step-budget", "draft", "draft-max", "draft-model"}},
	{"KV swap", []string{"kv-cache-ram", "kv-cache-disk", "kv-cache-shared", "kv-cache-shared-bytes", "kv-cache-shared-wait", "kv-cache-min-free"}},
	{"Sampling defaults", []string{"max-tokens", "max-tokens-limit", "system-prompt", "temperature", "top-k", "top-p", "min-p",
		"repeat-penalty", "repeat-last-n", "seed"}},
	{"Sessions and store", []string{"store", "data-dir", "session-ttl", "max-sessions", "max-session-bytes", "evict-idle-floor", "max-sessions-per-client",
		"session-creates-per-minute", "max-unused-per-client", "max-store-bytes", "client-store-share"}},
	{"Access", []string{"addr", "api-key", "user", "users", "cache-scope", "allowed-origins", "allowed-hosts"}},
	{"Tools on the server", []string{"mcp-config"}},
	{"Images", []string{"image-max-bytes", "image-max-pixels", "image-max-side", "image-max-per-request", "image-max-per-conversation", "image-max-bytes-per-conversation",
		"image-formats", "image-url-allow", "image-url-timeout", "image-url-max-redirects", "image-decode-timeout", "image-decode-memory",
		"image-decode-workers", "image-cache-bytes"}},
	{"Limits", []string{"max-message-bytes", "max-conns", "max-conns-per-ip", "max-http-conns", "max-http-conns-per-ip",
		"prompts-per-minute", "max-prompt-tokens", "max-queued-prompts", "max-body-bytes-inflight", "body-timeout",
		"resume-grace", "resume-buffer", "drain-timeout"}},
	{"Logging", []string{"log-format", "log-level", "llama-log"}},
}

// envName is the environment variable of a flag: --max-tokens is
// PARLEY_MAX_TOKENS. --version has none (it is a command, not a setting).
func envName(flagName string) string {
	if flagName == "version" {
		return ""
	}
	return "PARLEY_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// printUsage writes `parley --help`: the flags by topic, each with its
// environment variable and default.
func printUsage(fs *flag.FlagSet, w io.Writer) {
	fmt.Fprintln(w, "Usage: parley [flags]")
	fmt.Fprintln(w, "       parley store check|repair FILE   check or repair a session file (--data-dir/sessions.db)")
	fmt.Fprintln(w, "       parley healthcheck [URL]         exit 0 when /health answers 200")
	fmt.Fprintln(w, "\nEvery flag can also be set by its environment variable; a flag on the command line wins.")
	for _, t := range flagTopics {
		fmt.Fprintf(w, "\n%s:\n", t.title)
		for _, name := range t.flags {
			f := fs.Lookup(name)
			if f == nil {
				continue
			}
			typ, usage := flag.UnquoteUsage(f)
			line := "  --" + name
			if typ != "" {
				line += " " + typ
			}
			if env := envName(name); env != "" {
				line += "  (" + env + ")"
			}
			fmt.Fprintln(w, line)
			if def := f.DefValue; def != "" && def != "0" && def != "false" && !strings.Contains(usage, "default") {
				usage += " (default " + def + ")"
			}
			fmt.Fprintf(w, "        %s\n", usage)
		}
	}
}
