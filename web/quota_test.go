package web_test

// One client's creations cannot evict another's data: every API
// that creates a session, tried by one address against a small store and
// against the default limits, on the memory, bbolt and Redis stores. The
// clients are distinct loopback addresses (127.0.0.x), each a client of
// its own to the server.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/redistest"
	"github.com/parley-chat/parley/session"
	"github.com/parley-chat/parley/web"
)

// dialerFrom dials from the loopback address ip, so the server sees that client.
func dialerFrom(ip string) *net.Dialer {
	return &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
}

// httpFrom is an HTTP client whose requests come from ip.
func httpFrom(ip string) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: dialerFrom(ip).DialContext}}
}

// outcome is what one attempt to create a session got.
type outcome struct {
	ok     bool
	status int    // HTTP status, or the error event's status on a WebSocket
	retry  int    // seconds, from Retry-After or the error's retry_after
	msg    string // the error as the client reads it
}

func postFrom(tb testing.TB, ip, url string, body any) (outcome, []byte) {
	tb.Helper()
	j, _ := json.Marshal(body)
	res, err := httpFrom(ip).Post(url, "application/json", strings.NewReader(string(j)))
	if err != nil {
		tb.Fatalf("POST %s from %s: %v", url, ip, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	o := outcome{ok: res.StatusCode == http.StatusOK, status: res.StatusCode, msg: string(b)}
	o.retry, _ = strconv.Atoi(res.Header.Get("Retry-After"))
	return o, b
}

func getFrom(tb testing.TB, ip, url string) (int, []byte) {
	tb.Helper()
	res, err := httpFrom(ip).Get(url)
	if err != nil {
		tb.Fatalf("GET %s: %v", url, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

// creator is one API that creates a session: create makes one attempt
// from ip (a client keeps its state, such as the response it forks, in the
// closure newCreator made).
type creator struct {
	name       string
	newCreator func(tb testing.TB, s *stack, ip string) func() outcome
}

func newResponseFrom(tb testing.TB, s *stack, ip string, body map[string]any) (outcome, string) {
	o, b := postFrom(tb, ip, s.base+"/v1/responses", body)
	var r struct {
		ID string `json:"id"`
	}
	if o.ok {
		if err := json.Unmarshal(b, &r); err != nil {
			tb.Fatal(err)
		}
	}
	return o, r.ID
}

// wsOutcome reads what a new chat socket got: its session header, or the
// refusal (a readable line and the sentinel in text mode, an error event
// in JSON mode, then a close).
func wsOutcome(tb testing.TB, s *stack, ip, path string, jsonMode bool) outcome {
	tb.Helper()
	d := websocket.Dialer{NetDialContext: dialerFrom(ip).DialContext, HandshakeTimeout: 5 * time.Second}
	url := s.url + path
	if jsonMode {
		url += "?format=json"
	}
	ws, res, err := d.Dial(url, nil)
	if err != nil {
		tb.Fatalf("dial %s from %s: %v", url, ip, err)
	}
	defer ws.Close()
	ws.SetReadDeadline(time.Now().Add(hangWait))
	if res.Header.Get("X-Parley-Session") != "" {
		// A socket that never talks: a reset and a system prompt are not turns.
		if jsonMode {
			readJSON(tb, ws) // the session message
			for _, m := range []string{`{"type":"reset"}`, `{"type":"system","content":"hello"}`} {
				if err := ws.WriteMessage(websocket.TextMessage, []byte(m)); err != nil {
					tb.Fatal(err)
				}
			}
			readJSON(tb, ws) // the reset's session message
		}
		ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
		return outcome{ok: true}
	}
	if jsonMode {
		m := readJSON(tb, ws)
		if m.Type != "error" {
			tb.Fatalf("refused socket: %+v", m)
		}
		status := map[string]int{"rate_limited": 429, "store_full": 507}[m.Code]
		return outcome{status: status, retry: m.RetryAfter, msg: m.Message}
	}
	_, line, err := ws.ReadMessage()
	if err != nil {
		tb.Fatalf("refused socket: %v", err)
	}
	_, sentinel, err := ws.ReadMessage()
	if err != nil || string(sentinel) != web.Sentinel {
		tb.Fatalf("refused socket: %q then %q, %v", line, sentinel, err)
	}
	o := outcome{msg: string(line)}
	switch {
	case strings.Contains(o.msg, "too many new sessions"), strings.Contains(o.msg, "the most one client may"):
		o.status = 429
	case strings.Contains(o.msg, "store is full"):
		o.status = 507
	}
	if i := strings.Index(o.msg, "(try again in "); i >= 0 {
		fmt.Sscanf(o.msg[i:], "(try again in %d s)", &o.retry)
	}
	return o
}

func creators() []creator {
	return []creator{
		{"conversations", func(tb testing.TB, s *stack, ip string) func() outcome {
			return func() outcome {
				o, _ := postFrom(tb, ip, s.base+"/v1/conversations", map[string]any{})
				return o
			}
		}},
		{"responses", func(tb testing.TB, s *stack, ip string) func() outcome {
			return func() outcome {
				o, _ := newResponseFrom(tb, s, ip, map[string]any{"input": "Hi", "max_output_tokens": 2})
				return o
			}
		}},
		{"responses-fork", func(tb testing.TB, s *stack, ip string) func() outcome {
			var older string
			return func() outcome {
				if older == "" { // the first attempt creates the session to fork
					o, first := newResponseFrom(tb, s, ip, map[string]any{"input": "Hi", "max_output_tokens": 2})
					if o.ok {
						older = first
						if o2, _ := newResponseFrom(tb, s, ip, map[string]any{"previous_response_id": first, "input": "Again", "max_output_tokens": 2}); !o2.ok {
							tb.Fatalf("continuing a session was refused: %+v", o2)
						}
					}
					return o
				}
				o, _ := newResponseFrom(tb, s, ip, map[string]any{"previous_response_id": older, "input": "Fork", "max_output_tokens": 2})
				return o
			}
		}},
		{"chat-text", func(tb testing.TB, s *stack, ip string) func() outcome {
			return func() outcome { return wsOutcome(tb, s, ip, "/", false) }
		}},
		{"chat-json-ws", func(tb testing.TB, s *stack, ip string) func() outcome {
			return func() outcome { return wsOutcome(tb, s, ip, "/ws", true) }
		}},
		{"responses-websocket", func(tb testing.TB, s *stack, ip string) func() outcome {
			d := websocket.Dialer{NetDialContext: dialerFrom(ip).DialContext}
			ws, _, err := d.Dial(s.url+"/v1/responses", nil)
			if err != nil {
				tb.Fatal(err)
			}
			tb.Cleanup(func() { ws.Close() })
			return func() outcome {
				if err := ws.WriteJSON(map[string]any{"type": "response.create", "input": "Hi", "max_output_tokens": 2}); err != nil {
					tb.Fatal(err)
				}
				for {
					var m struct {
						Type       string `json:"type"`
						Status     int    `json:"status"`
						RetryAfter int    `json:"retry_after"`
						Message    string `json:"message"` // a refusal when the turn was stored
						Error      struct {
							Message string `json:"message"`
						} `json:"error"` // a refusal before the turn
					}
					ws.SetReadDeadline(time.Now().Add(hangWait))
					if err := ws.ReadJSON(&m); err != nil {
						tb.Fatal(err)
					}
					switch m.Type {
					case "response.completed", "response.incomplete":
						return outcome{ok: true}
					case "error":
						return outcome{status: m.Status, retry: m.RetryAfter, msg: m.Error.Message + m.Message}
					}
				}
			}
		}},
	}
}

// storeMakers open each kind of store with opts.
func storeMakers() map[string]func(tb testing.TB, opts ...session.StoreOption) session.Store {
	return map[string]func(tb testing.TB, opts ...session.StoreOption) session.Store{
		"memory": func(tb testing.TB, opts ...session.StoreOption) session.Store { return session.NewMemoryStore(opts...) },
		"bolt": func(tb testing.TB, opts ...session.StoreOption) session.Store {
			st, err := session.OpenBoltStore(filepath.Join(tb.TempDir(), "sessions.db"), opts...)
			if err != nil {
				tb.Fatal(err)
			}
			return st
		},
		"redis": func(tb testing.TB, opts ...session.StoreOption) session.Store {
			srv := redistest.Start(tb)
			st, err := session.OpenRedisStore(context.Background(), srv.URL(0), "t:", opts...)
			if err != nil {
				tb.Fatal(err)
			}
			return st
		},
	}
}

// victims are other clients' data: a conversation used through the
// Responses API, a chat that ran a turn, and a conversation created with
// items that has not run one yet.
type victims struct {
	respID, chatID, convID string
}

func makeVictims(tb testing.TB, s *stack) victims {
	tb.Helper()
	var v victims
	o, id := newResponseFrom(tb, s, "127.0.0.2", map[string]any{"input": "Once upon a time", "max_output_tokens": 4})
	if !o.ok {
		tb.Fatalf("victim response: %+v", o)
	}
	v.respID = id
	d := websocket.Dialer{NetDialContext: dialerFrom("127.0.0.3").DialContext}
	ws, res, err := d.Dial(s.url+"/", nil)
	if err != nil {
		tb.Fatal(err)
	}
	v.chatID = res.Header.Get("X-Parley-Session")
	if err := ws.WriteMessage(websocket.TextMessage, []byte("Once upon a time")); err != nil {
		tb.Fatal(err)
	}
	readReply(tb, ws)
	ws.Close()
	o, b := postFrom(tb, "127.0.0.4", s.base+"/v1/conversations", map[string]any{
		"items": []map[string]any{{"type": "message", "role": "user", "content": "kept for later"}}})
	if !o.ok {
		tb.Fatalf("victim conversation: %+v", o)
	}
	var c struct {
		ID string `json:"id"`
	}
	json.Unmarshal(b, &c)
	v.convID = c.ID
	return v
}

// check fails unless every victim is whole.
func (v victims) check(tb testing.TB, s *stack) {
	tb.Helper()
	if st, b := getFrom(tb, "127.0.0.2", s.base+"/v1/responses/"+v.respID); st != http.StatusOK {
		tb.Errorf("the victim's response: %d %s", st, b)
	}
	if st, b := getFrom(tb, "127.0.0.3", s.base+"/v1/conversations/"+v.chatID+"/items"); st != http.StatusOK || !strings.Contains(string(b), "Once upon a time") {
		tb.Errorf("the victim's chat: %d %s", st, b)
	}
	if st, b := getFrom(tb, "127.0.0.4", s.base+"/v1/conversations/"+v.convID+"/items"); st != http.StatusOK || !strings.Contains(string(b), "kept for later") {
		tb.Errorf("the victim's conversation: %d %s", st, b)
	}
}

// TestOneClientCannotEvictAnother: one address hammers each API that
// creates a session. With a small store (6 sessions, 3 per client) it gets
// its 3, then 429 with Retry-After, and a newcomer then gets 507 with
// Retry-After: the store is full and every session in it was used within
// the floor. With the default limits (30 creations a minute, 500 held,
// 10,000 in the store) the rate limit stops it at 30, long before it could
// fill the store. Either way every other client's data is whole.
func TestOneClientCannotEvictAnother(t *testing.T) {
	for kind, open := range storeMakers() {
		for _, c := range creators() {
			t.Run(kind+"/"+c.name+"/small", func(t *testing.T) {
				store := open(t, session.WithMaxSessions(6), session.WithMaxPerOwner(3), session.WithEvictFloor(session.DefaultEvictFloor))
				s := openStack(t, stackOpts{maxTokens: 4, store: store, svcOpts: []session.Option{session.WithClientLimits(1000, 0)},
					options: func(s *stack) []web.Option {
						return []web.Option{web.WithResponder(s.responder), web.WithModelInfo(s.engine.Info)}
					}})
				v := makeVictims(t, s)
				attempt := c.newCreator(t, s, "127.0.0.1")
				created := 0
				for i := range 12 {
					o := attempt()
					if o.ok {
						created++
						continue
					}
					if o.status != http.StatusTooManyRequests || o.retry <= 0 {
						t.Fatalf("attempt %d refused with %+v, want 429 with Retry-After", i, o)
					}
				}
				if created != 3 {
					t.Errorf("the attacker created %d sessions, want its 3", created)
				}
				if n := store.Len(); n > 6 {
					t.Errorf("store holds %d sessions, cap 6", n)
				}
				o, _ := postFrom(t, "127.0.0.9", s.base+"/v1/conversations", map[string]any{})
				if o.status != http.StatusInsufficientStorage || o.retry <= 0 || !strings.Contains(o.msg, "--max-sessions 6") {
					t.Errorf("a newcomer to the full store got %+v, want 507 with Retry-After naming the limit", o)
				}
				v.check(t, s)
			})
			t.Run(kind+"/"+c.name+"/default", func(t *testing.T) {
				store := open(t, session.WithMaxSessions(session.DefaultMaxSessions), session.WithMaxPerOwner(session.DefaultMaxPerOwner), session.WithEvictFloor(session.DefaultEvictFloor))
				frozen := time.Now()
				s := openStack(t, stackOpts{maxTokens: 4, store: store,
					svcOpts: []session.Option{session.WithClientLimits(session.DefaultCreatesPerMinute, 0), session.WithServiceClock(func() time.Time { return frozen })},
					options: func(s *stack) []web.Option {
						return []web.Option{web.WithResponder(s.responder), web.WithModelInfo(s.engine.Info)}
					}})
				v := makeVictims(t, s)
				attempt := c.newCreator(t, s, "127.0.0.1")
				created := 0
				for i := range session.DefaultCreatesPerMinute + 5 {
					o := attempt()
					if o.ok {
						created++
						continue
					}
					if o.status != http.StatusTooManyRequests || o.retry != 2 {
						t.Fatalf("attempt %d refused with %+v, want 429 with Retry-After 2", i, o)
					}
				}
				if created != session.DefaultCreatesPerMinute {
					t.Errorf("the attacker created %d sessions in a minute, want %d", created, session.DefaultCreatesPerMinute)
				}
				v.check(t, s)
			})
		}
	}
}

// TestIPv6ClientsGroupedBy64: through the real server on ::1, the sessions
// a client creates are owned by its /64, and the per-client connection cap
// counts the /64.
func TestIPv6ClientsGroupedBy64(t *testing.T) {
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	ln.Close()
	s := openStack(t, stackOpts{maxTokens: 4, cfg: func(c *web.Config) { c.Addr = "[::1]:0"; c.MaxConnsPerIP = 1 },
		options: func(s *stack) []web.Option {
			return []web.Option{web.WithResponder(s.responder), web.WithModelInfo(s.engine.Info)}
		}})
	o, b := postFrom(t, "::1", s.base+"/v1/conversations", map[string]any{})
	if !o.ok {
		t.Fatalf("create: %+v", o)
	}
	var c struct {
		ID string `json:"id"`
	}
	json.Unmarshal(b, &c)
	sess, err := s.sessions.Conversation(context.Background(), parley.Caller{}, strings.TrimPrefix(c.ID, session.ConversationPrefix))
	if err != nil || sess.Owner != "::/64" {
		t.Fatalf("owner %q, %v; want ::/64", sess.Owner, err)
	}
	ws := dial(t, s.url, nil)
	defer ws.Close()
	if st := upgradeStatus(t, s.url, nil); st != http.StatusTooManyRequests {
		t.Fatalf("a second socket from the same /64 got %d, want 429", st)
	}
}
