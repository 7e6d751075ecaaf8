package wsock

import (
	"net/http"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// ping sends a ping within wait. Control frames may be written
// concurrently with the socket's one writer (gorilla allows it).
func ping(ws *websocket.Conn, wait time.Duration) error {
	return ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(wait))
}

// WriteClose sends a close frame with code and text within wait.
func WriteClose(ws *websocket.Conn, code int, text string, wait time.Duration) error {
	return ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, text), time.Now().Add(wait))
}

// readDeadline moves a socket's read deadline: a pong wait ahead on every
// message and every pong, until end. mu orders the changes: once ended,
// the deadline is only ever shortened, so a late pong cannot keep a
// closing socket's reader blocked.
type readDeadline struct {
	ws       *websocket.Conn
	pongWait time.Duration

	mu     sync.Mutex
	ending bool // guarded by mu
}

// start sets the first deadline and lets every pong extend it. It must be
// called from the reader before its first read.
func (d *readDeadline) start() {
	d.extend()
	d.ws.SetPongHandler(func(string) error {
		d.extend()
		return nil
	})
}

// extend pushes the read deadline a pong wait ahead, unless the socket is
// closing.
func (d *readDeadline) extend() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.ending {
		d.ws.SetReadDeadline(time.Now().Add(d.pongWait))
	}
}

// end bounds the reader's wait once the socket closes: it sees the peer's
// close frame within CloseGrace, or times out. Without it a peer that
// never answers our close frame (one that stopped reading, say) would hold
// its connection, and its place under the caps, for a whole pong wait.
func (d *readDeadline) end() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ending = true
	d.ws.SetReadDeadline(time.Now().Add(CloseGrace))
}

// Socket is an open WebSocket that the server's drain closes.
type Socket interface {
	Replying() bool // a reply or response is running on it
	Close(code int, text string)
}

// Lifecycle is the server's side of every socket: one accept step before
// the upgrade (drain check, origin, connection caps), the upgrade, and
// tracking for the drain.
type Lifecycle interface {
	// Accept is the check every socket endpoint makes before it upgrades:
	// refused while the server drains, to a client without the API key
	// (when authorize is set), cross-origin, and over the connection caps.
	// On a nil error the caller holds one admission for ip and must
	// Release it.
	Accept(r *http.Request, authorize bool) (ip string, err error)
	// Admit takes one admission for ip under the connection caps, as a
	// socket does (a background response holds one); every nil return is
	// paired with one Release.
	Admit(ip string) error
	Release(ip string)
	// Upgrade upgrades an accepted request with the response headers hdr
	// and caps one message at readLimit bytes. On false the upgrader has
	// answered the client and there is nothing left to do.
	Upgrade(w http.ResponseWriter, r *http.Request, hdr http.Header, readLimit int64) (*websocket.Conn, bool)
	// TrackOrRefuse registers sk, the socket over ws, for the drain. Once
	// the server drains it closes ws with 1001 instead and reports false.
	TrackOrRefuse(sk Socket, ws *websocket.Conn) bool
	Untrack(sk Socket)
	// Settings are the pumps' bounds.
	Settings() Settings
}
