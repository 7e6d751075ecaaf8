package web_test

// Tests of the server's limits on a real server with the real tiny model:
// protocol hygiene on raw frames, pings, connection caps, the prompt-token
// cap, per-connection queues and their order, slow and vanished clients,
// and the drain on Close.

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web"
)

// longGrammar keeps stories260K from ending a reply early: end of
// generation is not allowed before 400 characters, so a reply runs to its
// max_tokens (at most 400 tokens, each at least one character).
const longGrammar = `root ::= [a-z ]{400,}`

// rawConn is a WebSocket client written by hand on a TCP connection, so a
// test can send frames gorilla would never send, never answer a ping, or
// never read.
type rawConn struct {
	net.Conn
	br *bufio.Reader
}

// rawDial connects and upgrades path. rcvbuf > 0 shrinks the socket's
// receive buffer before connecting, so a client that stops reading fills
// the server's buffers quickly.
func rawDial(tb testing.TB, addr, path string, rcvbuf int) *rawConn {
	tb.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if rcvbuf > 0 {
		d.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvbuf)
			})
			return errors.Join(err, serr)
		}
	}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { nc.Close() })
	fmt.Fprintf(nc, "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", path, addr)
	br := bufio.NewReader(nc)
	nc.SetReadDeadline(time.Now().Add(hangWait))
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		tb.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusSwitchingProtocols {
		tb.Fatalf("upgrade: status %d", res.StatusCode)
	}
	nc.SetReadDeadline(time.Time{})
	return &rawConn{Conn: nc, br: br}
}

// frame writes one frame: b0 is FIN/RSV/opcode as sent, the payload is
// masked when mask is set (clients must mask).
func (c *rawConn) frame(tb testing.TB, b0 byte, mask bool, payload []byte) {
	tb.Helper()
	hdr := []byte{b0}
	m := byte(0)
	if mask {
		m = 0x80
	}
	switch n := len(payload); {
	case n < 126:
		hdr = append(hdr, m|byte(n))
	case n < 1<<16:
		hdr = append(hdr, m|126, byte(n>>8), byte(n))
	default:
		hdr = binary.BigEndian.AppendUint64(append(hdr, m|127), uint64(n))
	}
	body := append([]byte(nil), payload...)
	if mask {
		key := [4]byte{0x12, 0x34, 0x56, 0x78}
		hdr = append(hdr, key[:]...)
		for i := range body {
			body[i] ^= key[i%4]
		}
	}
	if _, err := c.Write(append(hdr, body...)); err != nil {
		tb.Fatalf("write frame: %v", err)
	}
}

// text sends a masked text frame.
func (c *rawConn) text(tb testing.TB, s string) { c.frame(tb, 0x81, true, []byte(s)) }

// next reads one frame from the server: its opcode and payload.
func (c *rawConn) next() (op byte, payload []byte, err error) {
	var h [2]byte
	if _, err := io.ReadFull(c.br, h[:]); err != nil {
		return 0, nil, err
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var b [2]byte
		if _, err := io.ReadFull(c.br, b[:]); err != nil {
			return 0, nil, err
		}
		n = uint64(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		if _, err := io.ReadFull(c.br, b[:]); err != nil {
			return 0, nil, err
		}
		n = binary.BigEndian.Uint64(b[:])
	}
	payload = make([]byte, n)
	_, err = io.ReadFull(c.br, payload)
	return h[0] & 0x0f, payload, err
}

// closeFrame reads frames until a close frame and returns its code, or -1
// when the connection ends without one.
func (c *rawConn) closeFrame(tb testing.TB, within time.Duration) int {
	tb.Helper()
	c.SetReadDeadline(time.Now().Add(within))
	for {
		op, p, err := c.next()
		if err != nil {
			return -1
		}
		if op == 0x8 {
			if len(p) < 2 {
				return websocket.CloseNoStatusReceived
			}
			return int(binary.BigEndian.Uint16(p))
		}
	}
}

// TestMalformedFrameCloses1002: frames that break RFC 6455 get close 1002
// (gorilla's verdict), are logged, and leave the server serving.
func TestMalformedFrameCloses1002(t *testing.T) {
	h := openStack(t, stackOpts{})
	cases := []struct {
		name    string
		b0      byte
		mask    bool
		payload []byte
	}{
		{"reserved bit RSV2", 0x80 | 0x20 | 0x1, true, []byte("hi")},
		{"reserved bit RSV1 without compression", 0x80 | 0x40 | 0x1, true, []byte("hi")},
		{"unmasked client frame", 0x81, false, []byte("hi")},
		{"unknown opcode", 0x80 | 0x3, true, []byte("hi")},
		{"continuation without a start", 0x80 | 0x0, true, []byte("hi")},
		{"fragmented ping", 0x09, true, []byte("hi")},
		{"control frame over 125 bytes", 0x89, true, []byte(strings.Repeat("p", 126))},
		{"close frame with a reserved code", 0x88, true, []byte{0x03, 0xEC}}, // 1004
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rc := rawDial(t, h.srv.Addr(), "/", 0)
			c0 := h.logged("malformed frame")
			rc.frame(t, c.b0, c.mask, c.payload)
			if got := rc.closeFrame(t, 5*time.Second); got != websocket.CloseProtocolError {
				t.Fatalf("close code %d, want 1002", got)
			}
			if !waitFor(hangWait, func() bool { return h.logged("malformed frame") > c0 }) {
				t.Error("no log line for the malformed frame")
			}
		})
	}
	ws := dial(t, h.url, nil)
	ws.WriteMessage(websocket.TextMessage, []byte("Hello"))
	if len(readReply(t, ws)) == 0 {
		t.Fatal("no reply after malformed frames")
	}
	if !waitFor(hangWait, func() bool { return h.srv.OpenConns() == 1 }) {
		t.Fatalf("%d connections open, want only the last one", h.srv.OpenConns())
	}
}

// TestPeerWithoutPongsIsDropped: a peer that answers no ping is dropped
// within the pong wait (no close handshake: it would go unanswered), while
// a quiet peer that answers pings stays connected for many pong waits.
func TestPeerWithoutPongsIsDropped(t *testing.T) {
	const pongWait = time.Second
	h := openStack(t, stackOpts{cfg: func(c *web.Config) { c.PongWait = pongWait }})

	// The lively peer: gorilla answers pings while its read loop runs.
	alive := dial(t, h.url, nil)
	pings := make(chan struct{}, 100)
	alive.SetPingHandler(func(data string) error {
		pings <- struct{}{}
		return alive.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(time.Second))
	})
	readErr := make(chan error, 1)
	replies := make(chan string, 1)
	go func() {
		readErr <- readAnswers(alive, func(pieces []string) { replies <- strings.Join(pieces, "") })
	}()

	// The silent peer reads (and so sees the pings) but never answers.
	start := time.Now()
	rc := rawDial(t, h.srv.Addr(), "/", 0)
	rc.SetReadDeadline(time.Now().Add(hangWait))
	sawPing := false
	var err error
	for {
		var op byte
		op, _, err = rc.next()
		if err != nil {
			break
		}
		if op == 0x9 {
			sawPing = true
		}
		if op == 0x8 {
			t.Fatal("a peer that stopped answering got a close frame; it is dropped without one")
		}
	}
	took := time.Since(start)
	if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("silent peer: %v after %v, want the server to drop it", err, took)
	}
	if !sawPing {
		t.Error("no ping before the drop")
	}
	// Dropped by the pong wait, not before it. (How much after it depends
	// on the machine's load: the drop itself is the event checked.)
	if took < pongWait*9/10 {
		t.Errorf("silent peer dropped after %v, before the %v pong wait", took, pongWait)
	}
	if h.logged("peer stopped answering pings: dropped") == 0 {
		t.Error("no log line for the drop")
	}

	// The lively peer outlives several pong waits and still chats: pings
	// come every half of the pong wait, so its sixth ping is past three
	// pong waits, however slowly the machine runs them.
	for seen := 0; seen < 6; {
		select {
		case <-pings:
			seen++
		case err := <-readErr:
			t.Fatalf("lively peer dropped after %d pings: %v", seen, err)
		case <-time.After(hangWait):
			t.Fatalf("lively peer saw %d pings in %v, want one every %v", seen, hangWait, pongWait/2)
		}
	}
	alive.WriteMessage(websocket.TextMessage, []byte("Hello"))
	select {
	case r := <-replies:
		if strings.TrimSpace(r) == "" {
			t.Fatal("empty reply")
		}
	case err := <-readErr:
		t.Fatal(err)
	case <-time.After(hangWait):
		t.Fatal("no reply")
	}
	alive.Close()
	<-readErr
}

// TestConnectionCapsRefuseBeforeUpgrade: past the per-address cap a client
// gets 429, past the global cap 503, both before any upgrade, with a JSON
// error body and a log line; closing a connection frees its place.
func TestConnectionCapsRefuseBeforeUpgrade(t *testing.T) {
	h := openStack(t, stackOpts{cfg: func(c *web.Config) { c.MaxConns = 3; c.MaxConnsPerIP = 2 }})
	from := func(ip string) *websocket.Dialer {
		return &websocket.Dialer{NetDialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}).DialContext}
	}
	try := func(ip string) (*websocket.Conn, int, string) {
		ws, res, err := from(ip).Dial(h.url, nil)
		if err == nil {
			t.Cleanup(func() { ws.Close() })
			return ws, http.StatusSwitchingProtocols, ""
		}
		if res == nil {
			t.Fatalf("dial from %s: %v", ip, err)
		}
		var body web.ErrorBody
		json.NewDecoder(res.Body).Decode(&body)
		res.Body.Close()
		return nil, res.StatusCode, body.Error.Code
	}
	a1, st, _ := try("127.0.0.1")
	_, st2, _ := try("127.0.0.1")
	if st != 101 || st2 != 101 {
		t.Fatalf("first two connections: %d %d", st, st2)
	}
	if _, st, code := try("127.0.0.1"); st != http.StatusTooManyRequests || code != parley.ERateLimited {
		t.Fatalf("third from one address: %d %q, want 429 rate_limited", st, code)
	}
	if _, st, _ := try("127.0.0.2"); st != 101 {
		t.Fatalf("another address under the global cap: %d", st)
	}
	if _, st, code := try("127.0.0.2"); st != http.StatusServiceUnavailable || code != parley.EBusy {
		t.Fatalf("past the global cap: %d %q, want 503 busy", st, code)
	}
	refused := h.logs.FilterMessage("connection refused").All()
	if len(refused) != 2 {
		t.Fatalf("%d refusal log lines, want 2", len(refused))
	}
	if got := refused[0].ContextMap()["remote"]; got != "127.0.0.1" {
		t.Errorf("refusal logged for remote %v", got)
	}
	// A closed connection gives its place back.
	a1.Close()
	if !waitFor(hangWait, func() bool { _, st, _ := try("127.0.0.1"); return st == 101 }) {
		t.Fatal("a closed connection did not free its place")
	}
}

// TestPromptTokenCap: a prompt over MaxPromptTokens is refused with
// too_large (text: a line then the sentinel; JSON: an error event) before
// it takes a slot; prompts under the cap are answered.
func TestPromptTokenCap(t *testing.T) {
	h := openStack(t, stackOpts{tokenizer: true, cfg: func(c *web.Config) { c.MaxPromptTokens = 32 }})
	long := strings.Repeat("Lily went to the park. ", 20) // well over 32 tokens, well under the context
	before := h.engine.Stats().PromptEvaluated

	ws := dial(t, h.url, nil)
	ws.WriteMessage(websocket.TextMessage, []byte(long))
	got := readReply(t, ws)
	if len(got) != 1 || !strings.HasPrefix(got[0], "Error: the prompt is ") || !strings.Contains(got[0], "at most 32") {
		t.Fatalf("over the cap: %q", got)
	}
	if h.engine.Stats().PromptEvaluated != before {
		t.Fatal("a refused prompt reached the engine")
	}
	ws.WriteMessage(websocket.TextMessage, []byte("Lily went to the park."))
	if got := readReply(t, ws); len(got) == 0 || strings.HasPrefix(got[0], "Error:") {
		t.Fatalf("under the cap: %q", got)
	}

	js := dial(t, h.url+"/ws?format=json", nil)
	readJSON(t, js)
	js.WriteJSON(map[string]any{"type": "prompt", "content": long})
	if m := readJSON(t, js); m.Type != "error" || m.Code != parley.ETooLarge {
		t.Fatalf("JSON mode over the cap: %+v", m)
	}
	// The reader logs a refusal just after queueing its answer.
	refusals := func() int {
		return h.logs.FilterMessage("prompt refused").FilterField(zap.String("cause", "prompt_tokens")).Len()
	}
	if !waitFor(hangWait, func() bool { return refusals() >= 2 }) || refusals() != 2 {
		t.Fatalf("%d log lines for refused prompts, want 2", refusals())
	}
}

// TestQueueAndRateCapsAnswerInOrder: prompts past the per-connection queue
// or the rate limit are refused, each with exactly one answer (text: an
// error line then the sentinel), and the k-th answer answers the k-th
// prompt: a refusal never lands inside a reply that is streaming, and a
// reply is the one to the prompt in its place.
func TestQueueAndRateCapsAnswerInOrder(t *testing.T) {
	cases := []struct {
		name    string
		cfg     func(*web.Config)
		prompts int
		// At least minReplies and at most maxReplies prompts are answered
		// with replies (when the running prompt leaves the queue, making
		// room for one more, is a race).
		minReplies, maxReplies int
		refusal                string // the others get this error
		cause                  string // logged once per run of refusals
	}{
		{"queue full", func(c *web.Config) { c.MaxQueuedPrompts = 2 }, 10, 2, 9, "Error: too many prompts waiting on this connection (at most 2)", "queue_full"},
		{"rate limited", func(c *web.Config) { c.PromptsPerMinute = 3 }, 6, 3, 3, "Error: too many prompts: at most 3 per minute", "rate_limited"},
	}
	// asked is the number in the newest "Tom had N dogs" of a rendered prompt.
	asked := func(prompt string) int {
		var n int
		fmt.Sscanf(prompt[strings.LastIndex(prompt, "Tom had ")+len("Tom had "):], "%d", &n)
		return n
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := openStack(t, stackOpts{cfg: func(cfg *web.Config) {
				cfg.Defaults.MaxTokens = 300
				cfg.Defaults.Grammar = longGrammar // each reply streams for a while
				c.cfg(cfg)
			}})
			ws := dial(t, h.url, nil)
			for i := range c.prompts {
				ws.WriteMessage(websocket.TextMessage, []byte(fmt.Sprintf("Tom had %d dogs", i+1)))
			}
			var answered []int // the prompts answered with a reply, in answer order
			runs := 0          // runs of consecutive refusals
			for i := range c.prompts {
				ans := readReply(t, ws)
				text := strings.Join(ans, "")
				if strings.HasPrefix(text, "Error:") {
					if len(ans) != 1 || ans[0] != c.refusal {
						t.Fatalf("answer %d: want a reply or %q, got %q", i+1, c.refusal, ans)
					}
					if len(answered) == 0 || answered[len(answered)-1] == i {
						runs++ // the previous answer was a reply
					}
					continue
				}
				if len(ans) < 10 || strings.Contains(text, "Error:") {
					t.Fatalf("answer %d: want a streamed reply, got %d pieces %q", i+1, len(ans), text)
				}
				answered = append(answered, i+1)
			}
			if n := len(answered); n < c.minReplies || n > c.maxReplies || answered[0] != 1 {
				t.Fatalf("prompts %v got replies, want the first and %d to %d in all", answered, c.minReplies, c.maxReplies)
			}
			// Each reply answered the prompt in its place.
			ran := h.sessions.Prompts()
			if len(ran) != len(answered) {
				t.Fatalf("%d turns ran, %d replies arrived", len(ran), len(answered))
			}
			for k, p := range ran {
				if asked(p) != answered[k] {
					t.Fatalf("reply %d answered prompt %d, but the turn was for prompt %d", k+1, answered[k], asked(p))
				}
			}
			logged := func() int {
				return h.logs.FilterMessage("prompt refused").FilterField(zap.String("cause", c.cause)).Len()
			}
			if waitFor(hangWait, func() bool { return logged() >= runs }); logged() != runs || runs == 0 {
				t.Errorf("%d log lines for %d runs of refusals, want one per run", logged(), runs)
			}
		})
	}
}

// TestJSONErrorsWaitForTheReply: in JSON mode too, the answer to a bad
// message sent while a reply streams comes after that reply's done event.
func TestJSONErrorsWaitForTheReply(t *testing.T) {
	h := openStack(t, stackOpts{})
	ws := dial(t, h.url+"/ws?format=json", nil)
	readJSON(t, ws)
	ws.WriteJSON(map[string]any{"type": "prompt", "content": "Once upon a time", "params": map[string]any{"max_tokens": 200, "grammar": longGrammar}})
	ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"dance"}`))
	toks, done := readUntilDone(t, ws)
	if done.Type != "done" || len(toks) != 200 {
		t.Fatalf("reply interrupted: %d tokens then %+v", len(toks), done)
	}
	if m := readJSON(t, ws); m.Type != "error" || m.Code != parley.EInvalid || !strings.Contains(m.Message, "dance") {
		t.Fatalf("after the reply: %+v", m)
	}
}

// TestSlowClientIsDroppedAndItsReplyCancelled: a client that stops reading
// fills the kernel's buffers and then the bounded send buffer; it is
// closed, its generation cancelled (the slot frees, tokens stop), and no
// goroutine of its connection survives.
func TestSlowClientIsDroppedAndItsReplyCancelled(t *testing.T) {
	h := openStack(t, stackOpts{parallel: 1, sndbuf: 4096, cfg: func(c *web.Config) {
		c.SendBuffer = 16
		c.WriteWait = 300 * time.Millisecond
	}})
	ignore := goleak.IgnoreCurrent()
	before := h.engine.Stats()

	const prompts, maxTokens = 8, 400
	rc := rawDial(t, h.srv.Addr(), "/ws?format=json", 4096)
	for i := range prompts {
		b, _ := json.Marshal(map[string]any{"type": "prompt", "content": fmt.Sprintf("Story %d", i),
			"params": map[string]any{"max_tokens": maxTokens, "grammar": longGrammar}})
		rc.text(t, string(b))
	}
	// The client never reads. Generation starts, the buffers fill, and the
	// server gives up on the client.
	if !waitFor(hangWait, func() bool { return h.logged("client too slow: disconnecting") > 0 }) {
		t.Fatalf("the client that stopped reading was never dropped; stats %+v", h.engine.Stats())
	}
	if !waitFor(hangWait, func() bool { return h.engine.Stats().SlotsBusy == 0 }) {
		t.Fatal("the slot stayed busy after the client was dropped")
	}
	if !waitFor(hangWait, func() bool { return h.srv.OpenConns() == 0 }) {
		t.Fatal("the connection stayed open")
	}
	after := h.engine.Stats()
	generated := after.TokensGenerated - before.TokensGenerated
	if generated >= prompts*maxTokens {
		t.Fatalf("all %d tokens were generated: nothing was cancelled", generated)
	}
	// No slot is busy, so no token can follow: the counter stays.
	if st := h.engine.Stats(); st.TokensGenerated != after.TokensGenerated || st.SlotsBusy != 0 {
		t.Fatalf("tokens are still being generated for a dropped client: %+v", st)
	}
	t.Logf("dropped after %d tokens", generated)

	// What the server sent ends: the socket reaches EOF once drained.
	rc.SetReadDeadline(time.Now().Add(hangWait))
	if _, err := io.Copy(io.Discard, rc); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("draining the dropped connection: %v", err)
	}
	goleak.VerifyNone(t, ignore)

	// The server serves the next client at once (a short reply: with a
	// send buffer of 16 frames and tiny socket buffers, even a reading
	// client can fall 16 frames behind).
	ws := dial(t, h.url+"/ws?format=json", nil)
	readJSON(t, ws)
	ws.WriteJSON(map[string]any{"type": "prompt", "content": "Hello", "params": map[string]any{"max_tokens": 8}})
	if _, done := readUntilDone(t, ws); done.Type != "done" {
		t.Fatalf("after the slow client: %+v", done)
	}
}

// TestDisconnectMidReplyFreesTheSlotAtOnce: a client that goes away in the
// middle of a reply frees its slot within a decode step or so, the next
// client is not kept waiting, and nothing of the connection lives on.
func TestDisconnectMidReplyFreesTheSlotAtOnce(t *testing.T) {
	h := openStack(t, stackOpts{parallel: 1})
	ignore := goleak.IgnoreCurrent()
	ws, _, err := websocket.DefaultDialer.Dial(h.url+"/ws?format=json", nil)
	if err != nil {
		t.Fatal(err)
	}
	readJSON(t, ws)
	ws.WriteJSON(map[string]any{"type": "prompt", "content": "Once upon a time", "params": map[string]any{"max_tokens": 400, "grammar": longGrammar}})
	if m := readJSON(t, ws); m.Type != "token" {
		t.Fatalf("want a token first, got %+v", m)
	}
	before := h.engine.Stats()
	if before.SlotsBusy != 1 {
		t.Fatal("the reply is not generating")
	}
	ws.UnderlyingConn().Close() // vanish: no close frame
	if !waitFor(hangWait, func() bool { return h.engine.Stats().SlotsBusy == 0 }) {
		t.Fatal("the slot stayed busy after the client vanished")
	}
	// Freed by the disconnect, not by the reply's end: the reply's 400
	// tokens were not all generated (counted, not timed).
	if n := h.engine.Stats().TokensGenerated - before.TokensGenerated; n >= 400 {
		t.Fatalf("the slot freed only after the whole reply (%d more tokens)", n)
	} else {
		t.Logf("slot free %d tokens after the disconnect", n)
	}
	if !waitFor(hangWait, func() bool { return h.srv.OpenConns() == 0 }) {
		t.Fatal("the connection stayed open")
	}
	goleak.VerifyNone(t, ignore)

	// The only slot serves a new client without queueing: it is free and
	// nothing waits for it when the prompt comes (the queue's state, not
	// queued_ms, which a busy machine's scheduling alone can raise).
	ws2 := dial(t, h.url+"/ws?format=json", nil)
	readJSON(t, ws2)
	if st := h.engine.Stats(); st.SlotsBusy != 0 || st.Queued != 0 {
		t.Fatalf("the slot is not free for the next client: %+v", st)
	}
	ws2.WriteJSON(map[string]any{"type": "prompt", "content": "Lily", "params": map[string]any{"max_tokens": 5}})
	if _, done := readUntilDone(t, ws2); done.Type != "done" {
		t.Fatalf("the next client: %+v", done)
	}
}

// TestDrainReplyInFlight: on Close a reply in flight either completes (its
// sentinel arrives, then 1001) when the drain deadline allows, or ends with
// 1001 when it does not; prompts queued behind it are answered "shutting
// down"; Close never hangs.
func TestDrainReplyInFlight(t *testing.T) {
	cases := []struct {
		name      string
		drain     time.Duration
		completes bool
	}{
		{"reply completes within the drain", hangWait, true},
		{"drain deadline cuts the reply", 50 * time.Millisecond, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := openStack(t, stackOpts{cfg: func(cfg *web.Config) {
				cfg.DrainTimeout = c.drain
				cfg.Defaults.MaxTokens = 400
				cfg.Defaults.Grammar = longGrammar
			}})
			ws := dial(t, h.url, nil)
			ws.WriteMessage(websocket.TextMessage, []byte("Once upon a time"))
			ws.WriteMessage(websocket.TextMessage, []byte("And then?"))
			ws.SetReadDeadline(time.Now().Add(hangWait))
			if _, first, err := ws.ReadMessage(); err != nil || string(first) == web.Sentinel {
				t.Fatalf("first piece: %q %v", first, err)
			}

			closed := make(chan error, 1)
			go func() { closed <- h.srv.Close(context.Background()) }()

			var answers [][]string
			var cerr *websocket.CloseError
			ws.SetReadDeadline(time.Now().Add(hangWait))
			if err := readAnswers(ws, func(a []string) { answers = append(answers, a) }); !errors.As(err, &cerr) {
				t.Fatalf("read: %v", err)
			}
			if cerr.Code != websocket.CloseGoingAway {
				t.Fatalf("close code %d, want 1001", cerr.Code)
			}
			select {
			case err := <-closed:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(c.drain + hangWait):
				t.Fatal("Close hangs")
			}
			if c.completes {
				// The running reply's sentinel, then the queued prompt's refusal.
				if len(answers) != 2 || len(answers[0]) < 50 || len(answers[1]) != 1 ||
					!strings.Contains(answers[1][0], "shutting down") {
					t.Fatalf("answers before 1001: %q", answers)
				}
			} else {
				// Cut by the drain deadline: no sentinel (a reply of 400
				// tokens outlasts 50 ms on any machine). How long Close
				// took past the deadline is the machine's, not checked.
				if len(answers) != 0 {
					t.Fatalf("the cut reply still ended with a sentinel: %q", answers)
				}
			}
			if h.engine.Stats().SlotsBusy != 0 {
				t.Fatal("a slot is still busy after Close")
			}
		})
	}
}

// TestHostGuard: by default only IP addresses, localhost names and the
// bind host may appear in the Host header, so a page on a rebinding domain
// (which sends its own name) reaches neither the page nor the WebSocket;
// an allow-list replaces the default.
func TestHostGuard(t *testing.T) {
	cases := []struct {
		name    string
		allowed []string
		host    string
		want    int
	}{
		{"IPv4", nil, "127.0.0.1:8000", http.StatusOK},
		{"IPv6", nil, "[::1]:8000", http.StatusOK},
		{"other IP", nil, "10.1.2.3", http.StatusOK},
		{"localhost", nil, "localhost:8000", http.StatusOK},
		{"localhost, trailing dot", nil, "LOCALHOST.:8000", http.StatusOK},
		{"a .localhost name", nil, "chat.localhost:8000", http.StatusOK},
		{"a rebinding name", nil, "evil.example:8000", http.StatusForbidden},
		{"a name that embeds an IP", nil, "127.0.0.1.nip.io:8000", http.StatusForbidden},
		{"a name ending in localhost", nil, "evillocalhost:8000", http.StatusForbidden},
		{"listed", []string{"chat.example"}, "chat.example:443", http.StatusOK},
		{"not listed", []string{"chat.example"}, "evil.example", http.StatusForbidden},
		{"any", []string{"*"}, "evil.example", http.StatusOK},
	}
	stacks := map[string]*stack{} // by allow-list
	for _, c := range cases {
		key := strings.Join(c.allowed, ",")
		if stacks[key] == nil {
			stacks[key] = openStack(t, stackOpts{cfg: func(cfg *web.Config) { cfg.AllowedHosts = c.allowed }})
		}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := stacks[strings.Join(c.allowed, ",")]
			req, _ := http.NewRequest(http.MethodGet, "http://"+h.srv.Addr()+"/", nil)
			req.Host = c.host
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != c.want {
				t.Fatalf("page: %d, want %d", res.StatusCode, c.want)
			}
			ws, res, err := websocket.DefaultDialer.Dial(h.url+"/ws", http.Header{"Host": {c.host}})
			if err == nil {
				ws.Close()
				if c.want != http.StatusOK {
					t.Fatal("WebSocket upgraded with a refused Host")
				}
			} else if res == nil || res.StatusCode != c.want {
				t.Fatalf("WebSocket: %v %v, want %d", err, res, c.want)
			}
		})
	}
}
