package web_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/parley-chat/parley/web"
)

// rawRequest writes head (and body) on a fresh TCP connection and returns
// the status of the answer and how long it took, failing past limit.
func rawRequest(t *testing.T, addr, req string, limit time.Duration) (int, time.Duration) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(limit))
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer within %s: %v", limit, err)
	}
	res.Body.Close()
	return res.StatusCode, time.Since(start)
}

// TestBodyTimeout: a chunked body that never ends and a body shorter than
// its Content-Length are answered 400 once the body timeout passes (never
// before it: the body would end otherwise, so the answer itself is the
// check, however late a busy machine sends it), and a normal request still
// works.
func TestBodyTimeout(t *testing.T) {
	s := mustOpenAPI(t, func(c *web.Config) { c.BodyTimeout = 300 * time.Millisecond })
	addr := strings.TrimPrefix(s.base, "http://")
	head := "POST /v1/chat/completions HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/json\r\n"
	for name, req := range map[string]string{
		"never-ending chunked": head + "Transfer-Encoding: chunked\r\n\r\n5\r\n{\"mes\r\n",
		"short Content-Length": head + "Content-Length: 100\r\n\r\n{\"messages\":",
	} {
		status, took := rawRequest(t, addr, req, hangWait)
		if status != http.StatusBadRequest || took < 300*time.Millisecond {
			t.Errorf("%s: status %d after %s, want 400 after the 300ms body timeout", name, status, took)
		}
	}
	res := post(t, s.base+"/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": "Once"}}, "max_tokens": 4})
	if res.StatusCode != http.StatusOK {
		t.Fatalf("normal request: %d", res.StatusCode)
	}
}

// TestMaxHTTPConns: past the limit a connection is answered 503 at once;
// when one closes, a new one is served.
func TestMaxHTTPConns(t *testing.T) {
	s := mustOpenAPI(t, func(c *web.Config) { c.MaxHTTPConns = 2 })
	addr := strings.TrimPrefix(s.base, "http://")
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		// An answer on it: the server has accepted it (and keeps it open).
		io.WriteString(c, "GET /health HTTP/1.1\r\nHost: "+addr+"\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(hangWait))
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || res.StatusCode != http.StatusOK {
			t.Fatalf("held connection %d: %v %v", len(held), res, err)
		}
		res.Body.Close()
	}
	status, _ := rawRequest(t, addr, "GET /health HTTP/1.1\r\nHost: "+addr+"\r\n\r\n", hangWait)
	if status != http.StatusServiceUnavailable {
		t.Fatalf("over the limit: status %d, want 503", status)
	}
	held[0].Close()
	eventually(t, "a slot frees", func() bool {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return false
		}
		defer c.Close()
		io.WriteString(c, "GET /health HTTP/1.1\r\nHost: "+addr+"\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(time.Second))
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	})
	held[1].Close()
}
