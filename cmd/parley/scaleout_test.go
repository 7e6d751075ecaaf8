package main

// The scale-out test: two replicas share conversations through a real
// redis-server, behind a real nginx that routes by session id (consistent
// hashing), all on loopback ports.

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/jsonmode"
	"github.com/parley-chat/parley/internal/proc"
	"github.com/parley-chat/parley/internal/redistest"
	"github.com/parley-chat/parley/internal/testbin"
)

// nginxConf routes WebSockets and HTTP to the replicas by the session query
// parameter, so a resumed session lands where its KV cache is warm; when
// that replica is down nginx passes the request to the next one.
const nginxConf = `worker_processes 1;
daemon off;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 128; }
http {
  access_log off;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  map $http_upgrade $connection_upgrade { default upgrade; '' close; }
  upstream parley {
    hash $arg_session consistent;
%[2]s  }
  server {
    listen %[3]s;
    location / {
      proxy_pass http://parley;
      proxy_http_version 1.1;
      proxy_set_header Host $http_host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection $connection_upgrade;
      proxy_connect_timeout 2s;
      proxy_read_timeout 1h;
      proxy_next_upstream error timeout;
    }
  }
}
`

// startNginx runs nginx in front of the replicas and waits until it answers.
func startNginx(t *testing.T, replicas ...*server) string {
	t.Helper()
	bin, err := exec.LookPath("nginx")
	if err != nil {
		if bin, err = exec.LookPath("/usr/sbin/nginx"); err != nil {
			t.Skip("nginx is not installed (apt-get install nginx): skipping the scale-out test")
		}
	}
	dir, addr := t.TempDir(), freeAddr(t)
	var ups strings.Builder
	for _, r := range replicas {
		fmt.Fprintf(&ups, "    server %s max_fails=1 fail_timeout=30s;\n", r.addr)
	}
	conf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(nginxConf, dir, ups.String(), addr)), 0o600); err != nil {
		t.Fatal(err)
	}
	var out proc.Buffer
	cmd := exec.Command(bin, "-p", dir, "-c", conf, "-e", filepath.Join(dir, "error.log"))
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = time.Second // the worker processes share the output pipe
	p, err := proc.Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// SIGTERM: the master stops its workers (SIGKILL would orphan them).
		p.Cmd.Process.Signal(syscall.SIGTERM)
		if exited, _ := p.WaitFor(5 * time.Second); !exited {
			p.Kill()
		}
		if t.Failed() {
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Logf("nginx:\n%s%s", out.String(), log)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), hangWait)
	defer cancel()
	if err := p.WaitHTTP(ctx, "http://"+addr+"/health"); err != nil {
		t.Fatalf("nginx did not answer: %v\n%s", err, out.String())
	}
	return addr
}

// turnsServed is the replica's parley_session_turns_total for kv_cache kv.
func turnsServed(t *testing.T, s *server, kv string) int {
	t.Helper()
	res, err := http.Get("http://" + s.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	prefix := `parley_session_turns_total{kv_cache="` + kv + `"} `
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), prefix); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	t.Fatalf("no %s in /metrics", prefix)
	return 0
}

func dialAt(t *testing.T, addr, query string) *websocket.Conn {
	t.Helper()
	ws, _, err := websocket.DefaultDialer.Dial("ws://"+addr+"/ws?format=json"+query, nil)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { ws.Close() })
	return ws
}

// resume opens the session at addr and checks it holds want.
func resume(t *testing.T, addr, id string, want []parley.Message) *websocket.Conn {
	t.Helper()
	ws := dialAt(t, addr, "&session="+id)
	m := read(t, ws)
	if m.Type != "session" || m.SessionID() != id || !m.Resumed || !equalMessages(m.Messages, want) {
		t.Fatalf("resume %s at %s: %+v\nwant messages %+v", id, addr, m, want)
	}
	return ws
}

func TestScaleOut(t *testing.T) {
	bin := testbin.Parley(t)
	rds := redistest.Start(t)
	args := []string{"--store", rds.URL(0), "--max-tokens", "16"}
	a, b := start(t, bin, args...), start(t, bin, args...)
	lb := startNginx(t, a, b)
	var hist []parley.Message
	add := func(prompt string, done jsonmode.Message) {
		t.Helper()
		if done.Type != "done" || done.FinishReason == "error" || done.Content == "" {
			t.Fatalf("reply to %q: %+v", prompt, done)
		}
		hist = append(hist, parley.Message{Role: parley.RoleUser, Content: prompt},
			parley.Message{Role: parley.RoleAssistant, Content: done.Content})
	}

	// A conversation moves between replicas with its whole history.
	ws := dialAt(t, a.addr, "")
	id := read(t, ws).SessionID()
	add("Lily found a red ball", turn(t, ws, "Lily found a red ball", nil))
	wsB := resume(t, b.addr, id, hist)
	rebuilt := turnsServed(t, b, "rebuilt")
	add("Where was it?", turn(t, wsB, "Where was it?", nil))
	if turnsServed(t, b, "rebuilt") != rebuilt+1 {
		t.Fatal("a turn resumed from another replica did not count as rebuilt")
	}
	resume(t, a.addr, id, hist)

	// Through nginx the session sticks to one replica: its cache stays warm.
	ws = resume(t, lb, id, hist)
	add("Then what?", turn(t, ws, "Then what?", nil))
	home, other := a, b
	if turnsServed(t, b, "warm")+turnsServed(t, b, "rebuilt") > rebuilt+1 {
		home, other = b, a
	}
	warm := turnsServed(t, home, "warm")
	ws = resume(t, lb, id, hist)
	add("And then?", turn(t, ws, "And then?", nil))
	if turnsServed(t, home, "warm") != warm+1 {
		t.Fatalf("the same session through nginx was not served warm by %s", home.addr)
	}

	// kill -9 the replica mid-reply: the client resumes through nginx on the
	// other one with every acknowledged turn, and goes on.
	ws.WriteJSON(map[string]any{"type": "prompt", "content": "Tell me everything",
		"params": map[string]any{"max_tokens": 400, "grammar": `root ::= [a-z ]{400,}`}})
	if m := read(t, ws); m.Type != "token" {
		t.Fatalf("want a token, got %+v", m)
	}
	if err := home.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	home.WaitFor(hangWait)
	// The turn in flight was stored when it was accepted: the
	// other replica shows its prompt and its reply so far, interrupted.
	ws = dialAt(t, lb, "&session="+id)
	m := read(t, ws)
	if n := len(hist); m.Type != "session" || !m.Resumed || len(m.Messages) != n+2 || !equalMessages(m.Messages[:n], hist) ||
		m.Messages[n].Content != "Tell me everything" || !m.Messages[n+1].Interrupted {
		t.Fatalf("resume after kill -9 of %s: %+v\nwant messages %+v, then the prompt in flight and its reply interrupted", home.addr, m, hist)
	}
	hist = m.Messages
	add("Is Lily happy?", turn(t, ws, "Is Lily happy?", nil))
	resume(t, other.addr, id, hist)

	// Redis killed and restarted (append-only, fsync always): nothing
	// acknowledged is lost.
	rds.Kill()
	rds.Restart(t)
	ws = resume(t, lb, id, hist)

	// Redis down: a prompt gets a clear error; when Redis is back the same
	// connection goes on.
	rds.Kill()
	ws.WriteJSON(map[string]any{"type": "prompt", "content": "Still there?"})
	if m := read(t, ws); m.Type != "error" || m.Code != parley.EUnavailable || !strings.Contains(m.Message, "session store") {
		t.Fatalf("with redis down: %+v", m)
	}
	if _, _, err := websocket.DefaultDialer.Dial("ws://"+lb+"/ws?format=json&session="+id, nil); err == nil {
		t.Fatal("resuming a session with redis down succeeded")
	}
	rds.Restart(t)
	add("Still there?", turn(t, ws, "Still there?", nil))
	resume(t, lb, id, hist)
}
