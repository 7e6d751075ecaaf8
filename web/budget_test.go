package web_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-chat/parley/session"
	"github.com/parley-chat/parley/web"
)

// fullDisk is a store whose writes fail, while switched on, the way a full
// disk fails them; reads go through.
type fullDisk struct {
	session.Store
	mu   sync.Mutex
	full bool
}

func (f *fullDisk) set(full bool) {
	f.mu.Lock()
	f.full = full
	f.mu.Unlock()
}

func (f *fullDisk) Put(ctx context.Context, s *session.Session) error {
	f.mu.Lock()
	full := f.full
	f.mu.Unlock()
	if full {
		return fmt.Errorf("put session: %w", &os.PathError{Op: "write", Path: "sessions.db", Err: syscall.ENOSPC})
	}
	return f.Store.Put(ctx, s)
}

// TestStoreFullOverTheWire: with the store's disk full, a write answers 507
// store_full on HTTP and a readable error then the sentinel on a text-mode
// WebSocket (never 500 internal); a conversation stored before stays
// readable and whole, and writes work again once the disk has room.
func TestStoreFullOverTheWire(t *testing.T) {
	disk := &fullDisk{}
	s := openStack(t, stackOpts{maxTokens: 8, wrapStore: func(st session.Store) session.Store { disk.Store = st; return disk },
		options: func(s *stack) []web.Option {
			return []web.Option{web.WithResponder(s.responder), web.WithModelInfo(s.engine.Info)}
		}})
	res := post(t, s.base+"/v1/conversations", map[string]any{"items": []map[string]any{{"type": "message", "role": "user", "content": "Lily had a ball"}}})
	var conv struct{ ID string }
	decodeBody(t, res, http.StatusOK, &conv)
	ws := dial(t, s.url, nil)

	disk.set(true)
	res = post(t, s.base+"/v1/conversations", map[string]any{})
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusInsufficientStorage || !strings.Contains(string(body), "store_full") || !strings.Contains(string(body), "disk is full") {
		t.Fatalf("create on a full disk: %d %s, want 507 store_full", res.StatusCode, body)
	}
	res = post(t, s.base+"/v1/responses", map[string]any{"conversation": conv.ID, "input": "and then?", "max_output_tokens": 8})
	body, _ = io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusInsufficientStorage {
		t.Fatalf("a turn on a full disk: %d %s, want 507", res.StatusCode, body)
	}
	ws.WriteMessage(websocket.TextMessage, []byte("Once upon a time"))
	pieces := readReply(t, ws)
	if last := pieces[len(pieces)-1]; !strings.Contains(last, "disk is full") {
		t.Fatalf("text mode on a full disk: %q, want a readable error before the sentinel", pieces)
	}
	// Reads work, and the stored conversation is whole.
	got, err := http.Get(s.base + "/v1/conversations/" + conv.ID + "/items")
	if err != nil {
		t.Fatal(err)
	}
	items, _ := io.ReadAll(got.Body)
	got.Body.Close()
	if got.StatusCode != http.StatusOK || !strings.Contains(string(items), "Lily had a ball") || strings.Contains(string(items), "and then?") {
		t.Fatalf("read on a full disk: %d %s", got.StatusCode, items)
	}
	disk.set(false)
	res = post(t, s.base+"/v1/responses", map[string]any{"conversation": conv.ID, "input": "and then?", "max_output_tokens": 8})
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("a turn once the disk has room: %d", res.StatusCode)
	}
}

// holdBody opens a connection from local address from (nil: any), sends a
// request announcing size bytes and sends all of them but the last, and
// returns the connection with a reader of its answer (if one comes).
func holdBody(t *testing.T, addr string, from net.IP, size int) (net.Conn, *bufio.Reader) {
	t.Helper()
	d := net.Dialer{}
	if from != nil {
		d.LocalAddr = &net.TCPAddr{IP: from}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", addr, size)
	go func() { c.Write(make([]byte, size-1)) }() // a refused one is not read: do not block on it
	return c, bufio.NewReader(c)
}

// answered returns the status of an answer that comes within d, or 0.
func answered(c net.Conn, r *bufio.Reader, d time.Duration) (int, http.Header) {
	c.SetReadDeadline(time.Now().Add(d))
	res, err := http.ReadResponse(r, nil)
	if err != nil {
		return 0, nil
	}
	res.Body.Close()
	return res.StatusCode, res.Header
}

// TestBodyBudget: unfinished bodies hold the body budget, not more: from
// one address, past a quarter of it the next body is refused at once with
// 429 and Retry-After; from many addresses, past the whole of it with 503;
// once the held bodies end, bodies are accepted again.
func TestBodyBudget(t *testing.T) {
	const mib = 1 << 20
	s := mustOpenAPI(t, func(c *web.Config) { c.MaxBodyBytesInflight = 16 * mib; c.BodyTimeout = 20 * time.Second })
	addr := strings.TrimPrefix(s.base, "http://")

	// Each held body is in the budget before the next is sent: its bytes
	// show in /metrics (the event, not a pause). A body answered
	// (refused) early would not be counted.
	inflight := func(what string, n int) {
		t.Helper()
		eventually(t, fmt.Sprintf("%s: %d MiB of bodies in flight", what, n), func() bool {
			return scrape(t, s.base).value(t, "parley_body_bytes_inflight") == float64(n*mib)
		})
	}
	// One address: its share is a quarter, 4 MiB: four bodies of 1 MiB.
	var held []net.Conn
	for i := range 4 {
		c, _ := holdBody(t, addr, nil, mib)
		inflight(fmt.Sprintf("a body within the share (%d)", i), i+1)
		held = append(held, c)
	}
	c, r := holdBody(t, addr, nil, mib)
	st, hdr := answered(c, r, hangWait)
	if st != http.StatusTooManyRequests || hdr.Get("Retry-After") == "" {
		t.Fatalf("one address past its share: %d %v, want 429 with Retry-After", st, hdr)
	}
	// Many addresses (127.0.0.2, ...): the whole budget, 16 MiB.
	for i := range 12 {
		c, _ := holdBody(t, addr, net.IPv4(127, 0, 0, byte(2+i/3)), mib)
		inflight(fmt.Sprintf("body %d within the budget", i), 5+i)
		held = append(held, c)
	}
	c, r = holdBody(t, addr, net.IPv4(127, 0, 0, 9), mib)
	st, hdr = answered(c, r, hangWait)
	if st != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" {
		t.Fatalf("past the whole budget: %d %v, want 503 with Retry-After", st, hdr)
	}
	// Counted before the held bodies end: a request while they are being
	// released may be refused too, and is not what this counts.
	m := scrape(t, s.base)
	if m.value(t, "parley_refusals_total", "cause", "body_budget") != 1 || m.value(t, "parley_refusals_total", "cause", "body_budget_share") != 1 ||
		m.value(t, "parley_body_budget_bytes") != 16*mib {
		t.Errorf("/metrics of the body budget: refusals %v %v, budget %v",
			m.value(t, "parley_refusals_total", "cause", "body_budget"), m.value(t, "parley_refusals_total", "cause", "body_budget_share"),
			m.value(t, "parley_body_budget_bytes"))
	}
	for _, c := range held {
		c.Close()
	}
	eventually(t, "the budget comes back", func() bool {
		res := post(t, s.base+"/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": "Once"}}, "max_tokens": 4})
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	})
	eventually(t, "no body bytes in flight once every body ended", func() bool {
		return scrape(t, s.base).value(t, "parley_body_bytes_inflight") == 0
	})
}

// TestHTTPConnsPerIP: past the per-address cap a connection is answered 429
// with Retry-After at once; another address still connects.
func TestHTTPConnsPerIP(t *testing.T) {
	s := mustOpenAPI(t, func(c *web.Config) { c.MaxHTTPConnsPerIP = 2 })
	addr := strings.TrimPrefix(s.base, "http://")
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// An answer on it: the server has accepted it (and keeps it open).
		io.WriteString(c, "GET /health HTTP/1.1\r\nHost: "+addr+"\r\n\r\n")
		if st, _ := answered(c, bufio.NewReader(c), hangWait); st != http.StatusOK {
			t.Fatalf("held connection: status %d", st)
		}
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, hdr := answered(c, bufio.NewReader(c), hangWait)
	if st != http.StatusTooManyRequests || hdr.Get("Retry-After") == "" {
		t.Fatalf("third connection from one address: %d %v, want 429", st, hdr)
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	c2, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	fmt.Fprintf(c2, "GET /health HTTP/1.1\r\nHost: %s\r\n\r\n", addr)
	if st, _ := answered(c2, bufio.NewReader(c2), hangWait); st != http.StatusOK {
		t.Fatalf("another address: %d", st)
	}
}
