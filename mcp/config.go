package mcp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"
)

// Defaults for the Config fields left zero.
const (
	DefaultCallTimeout    = 60 * time.Second
	DefaultStartTimeout   = 60 * time.Second // npx may fetch a package the first time
	DefaultIdleTimeout    = 10 * time.Minute
	DefaultMaxResultBytes = 64 << 10
	DefaultMaxFrameBytes  = 4 << 20
	DefaultMaxSessions    = 64
	DefaultMaxTools       = 128
	// stderrTail is how many bytes of a stdio server's stderr are kept (the
	// last ones), to log when it exits.
	stderrTail = 8 << 10
	// maxConfigBytes bounds the configuration file.
	maxConfigBytes = 1 << 20
)

// Config is the operator's MCP configuration, read from a JSON file:
//
//	{
//	  "servers": {
//	    "everything": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-everything"]},
//	    "search": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer ${SEARCH_TOKEN}"}}
//	  },
//	  "users": {
//	    "*":     {"everything": ["echo", "get-sum"]},
//	    "alice": {"everything": ["*"], "search": ["*"]}
//	  },
//	  "call_timeout": "30s"
//	}
//
// "${NAME}" in a header, an env value or an argument is replaced by the
// environment variable NAME of the Parley process when the file is read:
// the file need not hold the secret. Those values are secrets: they are
// never logged, and any tool result or error that holds one has it masked
// before the model or the user sees it.
type Config struct {
	Servers map[string]ServerConfig `json:"servers"`
	// Users maps a user (the name an API key maps to; "*" for every user
	// not listed, the anonymous one included) to the servers it may use and,
	// per server, the tools ("*": all of them).
	Users map[string]map[string][]string `json:"users"`

	CallTimeout    Duration `json:"call_timeout"`     // one tool call, from sending to the result
	StartTimeout   Duration `json:"start_timeout"`    // starting a server and listing its tools
	IdleTimeout    Duration `json:"idle_timeout"`     // a user's unused session is closed after it
	MaxResultBytes int      `json:"max_result_bytes"` // the text of one result the model reads
	MaxFrameBytes  int      `json:"max_frame_bytes"`  // one message a server sends; larger ends its session
	MaxSessions    int      `json:"max_sessions"`     // open server sessions, all users together
	MaxTools       int      `json:"max_tools"`        // tools listed per server (the rest are left out)

	// fromEnv are the values "${NAME}" references resolved to.
	fromEnv []string
}

// ServerConfig is one MCP server: a command Parley starts (stdio) or a URL
// it connects to (Streamable HTTP).
type ServerConfig struct {
	Command string            `json:"command,omitempty"`
	Args    []string          `json:"args,omitempty"`
	Env     map[string]string `json:"env,omitempty"` // the server's environment, beside PATH, HOME, LANG and TMPDIR
	Dir     string            `json:"dir,omitempty"` // its working directory

	URL     string            `json:"url,omitempty"`
	Headers map[string]string `json:"headers,omitempty"` // sent with every request to URL
	// AllowPrivate lets Parley connect to URL at a loopback, private,
	// link-local or metadata address (a server beside Parley); without it
	// such an address is refused when dialled.
	AllowPrivate bool `json:"allow_private,omitempty"`

	// Shared runs one session for all users instead of one per user: only
	// for servers that keep no state a user could see another's in.
	Shared bool `json:"shared,omitempty"`
	// CallTimeout overrides Config.CallTimeout for this server.
	CallTimeout Duration `json:"call_timeout,omitempty"`
}

// Duration is a time.Duration written as "30s" in JSON.
type Duration time.Duration

// UnmarshalJSON reads "30s" or a number of seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var n float64
		if err := json.Unmarshal(b, &n); err != nil {
			return fmt.Errorf("a duration is \"30s\" or a number of seconds, got %s", b)
		}
		*d = Duration(n * float64(time.Second))
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// labelRe is what a server's label may be: it appears in tool names and
// on the wire (server_label).
var labelRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// envRef is a "${NAME}" reference to Parley's environment.
var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// LoadConfig reads and checks the configuration file at path, resolving
// "${NAME}" references with getenv (os.Getenv when nil).
func LoadConfig(path string, getenv func(string) string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("mcp config: %w", err)
	}
	defer f.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(io.LimitReader(f, maxConfigBytes+1)); err != nil {
		return nil, fmt.Errorf("mcp config: %w", err)
	}
	if buf.Len() > maxConfigBytes {
		return nil, fmt.Errorf("mcp config: %s is over %d bytes", path, maxConfigBytes)
	}
	return ParseConfig(buf.Bytes(), getenv)
}

// ParseConfig parses and checks a configuration (see Config), resolving
// "${NAME}" references with getenv (os.Getenv when nil).
func ParseConfig(data []byte, getenv func(string) string) (*Config, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var c Config
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("mcp config: %w", err)
	}
	if err := c.resolve(getenv); err != nil {
		return nil, fmt.Errorf("mcp config: %w", err)
	}
	if err := c.check(); err != nil {
		return nil, fmt.Errorf("mcp config: %w", err)
	}
	c.defaults()
	return &c, nil
}

// resolve replaces "${NAME}" references in the fields that may hold
// secrets; a reference to an unset variable is an error, not "".
func (c *Config) resolve(getenv func(string) string) error {
	var missing []string
	sub := func(s string) string {
		return envRef.ReplaceAllStringFunc(s, func(ref string) string {
			name := envRef.FindStringSubmatch(ref)[1]
			v := getenv(name)
			if v == "" {
				missing = append(missing, name)
			}
			c.fromEnv = append(c.fromEnv, v)
			return v
		})
	}
	for label, s := range c.Servers {
		s.Args = slices.Clone(s.Args)
		for i := range s.Args {
			s.Args[i] = sub(s.Args[i])
		}
		s.Env = resolveMap(s.Env, sub)
		s.Headers = resolveMap(s.Headers, sub)
		c.Servers[label] = s
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return fmt.Errorf("environment variables named in the file are unset: %s", strings.Join(slices.Compact(missing), ", "))
	}
	return nil
}

func resolveMap(m map[string]string, sub func(string) string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = sub(v)
	}
	return out
}

// check refuses what cannot work: a server with both or neither of command
// and url, a URL that is not http(s), a policy naming an unknown server.
func (c *Config) check() error {
	for label, s := range c.Servers {
		if !labelRe.MatchString(label) {
			return fmt.Errorf("server label %q: must be 1 to 64 letters, digits, _ or -", label)
		}
		switch {
		case s.Command != "" && s.URL != "":
			return fmt.Errorf("server %q: give a command or a url, not both", label)
		case s.Command == "" && s.URL == "":
			return fmt.Errorf("server %q: give a command (stdio) or a url (Streamable HTTP)", label)
		case s.URL != "":
			u, err := url.Parse(s.URL)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return fmt.Errorf("server %q: url must be an http or https URL", label)
			}
			if u.User != nil {
				return fmt.Errorf("server %q: put credentials in headers, not in the url", label)
			}
		}
		for k := range s.Headers {
			if k == "" || strings.ContainsAny(k, " :\r\n") {
				return fmt.Errorf("server %q: header name %q is not valid", label, k)
			}
		}
		if s.CallTimeout < 0 {
			return fmt.Errorf("server %q: call_timeout must not be negative", label)
		}
	}
	for user, servers := range c.Users {
		for label, tools := range servers {
			if _, ok := c.Servers[label]; !ok {
				return fmt.Errorf("users[%q] names server %q, which is not configured", user, label)
			}
			if len(tools) == 0 {
				return fmt.Errorf("users[%q][%q]: list the tools, or [\"*\"] for all", user, label)
			}
		}
	}
	for _, n := range []struct {
		name string
		v    int
	}{{"max_result_bytes", c.MaxResultBytes}, {"max_frame_bytes", c.MaxFrameBytes}, {"max_sessions", c.MaxSessions}, {"max_tools", c.MaxTools}} {
		if n.v < 0 {
			return fmt.Errorf("%s must not be negative", n.name)
		}
	}
	if c.CallTimeout < 0 || c.StartTimeout < 0 || c.IdleTimeout < 0 {
		return fmt.Errorf("timeouts must not be negative")
	}
	return nil
}

func (c *Config) defaults() {
	set := func(d *Duration, v time.Duration) {
		if *d == 0 {
			*d = Duration(v)
		}
	}
	set(&c.CallTimeout, DefaultCallTimeout)
	set(&c.StartTimeout, DefaultStartTimeout)
	set(&c.IdleTimeout, DefaultIdleTimeout)
	setInt := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	setInt(&c.MaxResultBytes, DefaultMaxResultBytes)
	setInt(&c.MaxFrameBytes, DefaultMaxFrameBytes)
	setInt(&c.MaxSessions, DefaultMaxSessions)
	setInt(&c.MaxTools, DefaultMaxTools)
}

// policy returns the servers user may use, with their tools (nil: all).
func (c *Config) policy(user string) map[string][]string {
	p, ok := c.Users[user]
	if !ok {
		p = c.Users["*"]
	}
	return p
}

// allowedServers returns the labels of the servers user may use, sorted.
func (c *Config) allowedServers(user string) []string {
	var out []string
	for label := range c.policy(user) {
		out = append(out, label)
	}
	sort.Strings(out)
	return out
}

// allowed reports whether user may call tool on server.
func (c *Config) allowed(user, server, tool string) bool {
	tools, ok := c.policy(user)[server]
	return ok && (slices.Contains(tools, "*") || slices.Contains(tools, tool))
}

// secrets returns every value that came from the environment or sits in a
// header or an env entry: what must never reach a log, the model or a user.
// Values shorter than 6 bytes are left out: masking them would garble
// ordinary text, and they protect nothing.
func (c *Config) secrets() []string {
	var out []string
	add := func(v string) {
		if len(v) >= 6 {
			out = append(out, v)
		}
	}
	for _, v := range c.fromEnv {
		add(v)
	}
	for _, s := range c.Servers {
		for _, v := range s.Headers {
			add(v)
			// "Bearer <token>": the token alone is secret too.
			if _, tok, ok := strings.Cut(v, " "); ok {
				add(tok)
			}
		}
		for _, v := range s.Env {
			add(v)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) }) // longest first: mask whole values
	return slices.Compact(out)
}
