package web

// The lifecycle every WebSocket endpoint shares (the chat's, ws.go, and the
// Responses API's, api_responses_ws.go): one accept step before the upgrade
// (drain check, origin, connection caps), the upgrade, tracking for Close,
// and the ping cadence that keeps a quiet peer's read deadline moving.

import (
	"net/http"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
)

// pingPeriod is how often a socket pings its peer: 9/10 of the pong wait,
// leaving the pong a tenth of it to arrive before the read deadline.
func (s *Server) pingPeriod() time.Duration { return s.cfg.PongWait * 9 / 10 }

// accept is the check every socket endpoint makes before it upgrades:
// refused while the server drains, to a client without the API key (when
// authorize is set: the chat's routes are outside the API group whose
// middleware checks it), cross-origin, and over the connection caps. On a
// nil error the caller holds one admission for ip and must releaseIP it.
func (s *Server) accept(r *http.Request, authorize bool) (ip string, err error) {
	if s.draining.Load() {
		return "", parley.Errorf(parley.EUnavailable, "the server is shutting down")
	}
	if authorize && !s.authorized(r) {
		return "", parley.Errorf(parley.EUnauthorized, "missing or wrong API key")
	}
	if !s.checkOrigin(r) {
		s.log.Warn("cross-origin upgrade refused", zap.String("origin", r.Header.Get("Origin")))
		return "", parley.Errorf(parley.EForbidden, "cross-origin WebSocket upgrades are not allowed")
	}
	ip = clientKey(r)
	if err := s.admit(ip); err != nil {
		s.log.Warn("connection refused", zap.String("remote", ip), zap.Error(err))
		return "", err
	}
	return ip, nil
}

// upgrade upgrades an accepted request with the response headers hdr and
// caps the size of one message at readLimit bytes. On false the upgrader
// has answered the client and there is nothing left to do.
func (s *Server) upgrade(w http.ResponseWriter, r *http.Request, hdr http.Header, readLimit int64) (*websocket.Conn, bool) {
	ws, err := s.upgrader.Upgrade(w, r, hdr)
	if err != nil {
		return nil, false
	}
	ws.SetReadLimit(readLimit)
	return ws, true
}

// trackOrRefuse registers sk, the socket over ws, for Close to drain. Once
// the server drains it closes ws with 1001 instead and reports false.
func (s *Server) trackOrRefuse(sk socket, ws *websocket.Conn) bool {
	if s.track(sk) {
		return true
	}
	_ = writeClose(ws, websocket.CloseGoingAway, "server shutting down", s.cfg.WriteWait)
	ws.Close()
	return false
}

// ping sends a ping within wait. Control frames may be written
// concurrently with the socket's one writer (gorilla allows it).
func ping(ws *websocket.Conn, wait time.Duration) error {
	return ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(wait))
}

// writeClose sends a close frame with code and text within wait.
func writeClose(ws *websocket.Conn, code int, text string, wait time.Duration) error {
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
// close frame within closeGrace, or times out. Without it a peer that
// never answers our close frame (one that stopped reading, say) would hold
// its connection, and its place under the caps, for a whole pong wait.
func (d *readDeadline) end() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ending = true
	d.ws.SetReadDeadline(time.Now().Add(closeGrace))
}

// admit enforces the connection caps. It counts the connection from here
// (not from the upgrade), so a burst of simultaneous handshakes cannot
// overshoot the global cap. Every nil return is paired with one releaseIP.
func (s *Server) admit(ip string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.admitted >= s.cfg.MaxConns {
		return withCause(refusedConns, parley.Errorf(parley.EBusy, "too many open connections; try again later"))
	}
	if s.perIP[ip] >= s.cfg.MaxConnsPerIP {
		return withCause(refusedConnsPerIP, parley.Errorf(parley.ERateLimited, "too many open connections from your address"))
	}
	s.perIP[ip]++
	s.admitted++
	return nil
}

func (s *Server) releaseIP(ip string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.admitted--
	if s.perIP[ip]--; s.perIP[ip] <= 0 {
		delete(s.perIP, ip)
	}
}

// socket is an open WebSocket that Close drains: a chat connection (conn)
// or a Responses API socket (respSocket).
type socket interface {
	replying() bool // a reply or response is running on it
	close(code int, text string)
}

// track registers an upgraded socket for Close to drain; false once the
// server is draining (the caller closes it with 1001).
func (s *Server) track(c socket) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining.Load() {
		return false
	}
	s.conns[c] = struct{}{}
	s.connWG.Add(1)
	return true
}

func (s *Server) untrack(c socket) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.connWG.Done()
}

// OpenConns is the number of open WebSocket connections (chat and
// Responses API sockets).
func (s *Server) OpenConns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}
