package web

// The server's side of every WebSocket endpoint (the chat socket's and the
// Responses API's): one accept step before the upgrade (drain check,
// origin, connection caps), the upgrade, and tracking for Close. The pump
// that runs a socket is internal/wsock's.

import (
	"context"
	"net/http"
	"time"

	"github.com/gorilla/websocket"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/wsock"
)

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
func (s *Server) trackOrRefuse(sk wsock.Socket, ws *websocket.Conn) bool {
	if s.track(sk) {
		return true
	}
	_ = wsock.WriteClose(ws, websocket.CloseGoingAway, "server shutting down", s.cfg.WriteWait)
	ws.Close()
	return false
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

// track registers an upgraded socket for Close to drain; false once the
// server is draining (the caller closes it with 1001).
func (s *Server) track(c wsock.Socket) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining.Load() {
		return false
	}
	s.conns[c] = struct{}{}
	s.connWG.Add(1)
	return true
}

func (s *Server) untrack(c wsock.Socket) {
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

// pumpSettings are the bounds of every socket's pump.
func (s *Server) pumpSettings() wsock.Settings {
	return wsock.Settings{SendBuffer: s.cfg.SendBuffer, PongWait: s.cfg.PongWait, WriteWait: s.cfg.WriteWait,
		Refused: s.refused, CountRefusal: s.countRefusal, Bodies: s.bodies, MaxMessageBytes: s.cfg.MaxMessageBytes}
}

// pingPeriod is how often a socket pings its peer (wsock.Settings.PingPeriod).
func (s *Server) pingPeriod() time.Duration { return s.pumpSettings().PingPeriod() }

// newPump makes the pump of ws, whose context is a child of parent.
func (s *Server) newPump(parent context.Context, ws *websocket.Conn, readLimit int64, log *zap.Logger) *wsock.Pump {
	return wsock.NewPump(s.pumpSettings(), parent, ws, readLimit, log)
}

// sockets is the server as the socket endpoints of the families see it.
type sockets struct{ s *Server }

func (k sockets) Accept(r *http.Request, authorize bool) (string, error) {
	return k.s.accept(r, authorize)
}
func (k sockets) Admit(ip string) error { return k.s.admit(ip) }
func (k sockets) Release(ip string)     { k.s.releaseIP(ip) }
func (k sockets) Upgrade(w http.ResponseWriter, r *http.Request, hdr http.Header, readLimit int64) (*websocket.Conn, bool) {
	return k.s.upgrade(w, r, hdr, readLimit)
}
func (k sockets) TrackOrRefuse(sk wsock.Socket, ws *websocket.Conn) bool {
	return k.s.trackOrRefuse(sk, ws)
}
func (k sockets) Untrack(sk wsock.Socket)  { k.s.untrack(sk) }
func (k sockets) Settings() wsock.Settings { return k.s.pumpSettings() }
