package web

import (
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"go.uber.org/zap"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// bodyDeadline gives a request that has a body (a Content-Length, or
// chunked) cfg.BodyTimeout to deliver it: a read deadline on the
// connection, lifted by apicore.ReadBody once the body is in. A body that never
// ends or falls short of its length then fails its read (and the
// connection closes) instead of holding a goroutine and a socket forever.
// Requests without a body (the WebSocket upgrade, GETs) are untouched.
func (s *Server) bodyDeadline(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if r := c.Request(); r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody {
			_ = http.NewResponseController(c.Response()).SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout))
		}
		return next(c)
	}
}

// tagClient names the request's caller in its context (apicore.WithFacts):
// its client (userClient: its user, or its address, IPv6 per /64), for
// every per-client limit (the session layer stamps it on the sessions the
// request creates, the engine caps the grammar samplers one client's
// requests hold), and the user its API key maps to, whose sessions are the
// only ones the request reaches; and its cache scope. A request without an
// accepted key is refused later by RequireKey (or the socket's accept),
// where a route needs one. Handlers take these once (apicore.FactsOf) and
// pass them on as arguments and fields.
func (s *Server) tagClient(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		addr := clientKey(r)
		user := ""
		if u, ok := s.identify(r); ok {
			user = u
		}
		c.SetRequest(r.WithContext(apicore.WithFacts(r.Context(), apicore.Facts{
			Caller: parley.Caller{User: user, Client: apicore.UserClient(addr, user)},
			Scope:  s.cacheScope(user, addr),
		})))
		return next(c)
	}
}

// cacheScope is the cache scope of user's requests from client
// (Config.CachePerClient): every reply's request carries it
// (parley.ReplyRequest.Scope), those of work that outlives its HTTP
// request (a chat socket's, a background response's) included.
func (s *Server) cacheScope(user, client string) string {
	if s.cfg.CachePerClient {
		return parley.ClientCacheScope(user, client)
	}
	return parley.UserCacheScope(user)
}

// limitListener bounds the connections open at once, in all and per client
// address. One over the limit is answered 503 (429 over the per-address
// limit) and closed at once, rather than left in the backlog, so a client
// learns why. Connections count until they close, hijacked WebSockets
// included.
type limitListener struct {
	net.Listener
	log     *zap.Logger
	slot    chan struct{} // one per open connection; cap = the limit
	refused int           // since the last warning; owned by Accept's goroutine
	warned  time.Time

	perIPMax int
	count    func(cause string) // counts a refusal in the metrics
	mu       sync.Mutex
	perIP    map[string]int // open connections by client key; guarded by mu
}

func newLimitListener(ln net.Listener, n, perIP int, log *zap.Logger, count func(string)) net.Listener {
	return &limitListener{Listener: ln, log: log, slot: make(chan struct{}, n),
		perIPMax: perIP, perIP: map[string]int{}, count: count}
}

// connKey is the client key of a connection, by the same function as every
// other per-client limit (clientKey): its IPv4 address, or its IPv6 /64.
func connKey(c net.Conn) string { return remoteKey(c.RemoteAddr().String()) }

// takeIP counts a connection of key; false when key is at its limit.
func (l *limitListener) takeIP(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.perIPMax > 0 && l.perIP[key] >= l.perIPMax {
		return false
	}
	l.perIP[key]++
	return true
}

func (l *limitListener) releaseIP(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.perIP[key]--; l.perIP[key] <= 0 {
		delete(l.perIP, key)
	}
}

// fullResponse is what a connection over the limit reads before it closes;
// perIPResponse, one over the per-address limit.
const (
	fullResponse  = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nRetry-After: 1\r\nContent-Length: 46\r\n\r\nthe server has too many open connections now\r\n"
	perIPResponse = "HTTP/1.1 429 Too Many Requests\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nRetry-After: 1\r\nContent-Length: 45\r\n\r\ntoo many open connections from your address\r\n"
)

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		key := connKey(c)
		if !l.takeIP(key) {
			l.answer(c, perIPResponse)
			if l.count != nil {
				l.count(refusedHTTPConnsPerIP)
			}
			continue
		}
		select {
		case l.slot <- struct{}{}:
			return &limitConn{Conn: c, release: func() { <-l.slot; l.releaseIP(key) }}, nil
		default:
		}
		l.releaseIP(key)
		// Over the limit: answer without blocking the accept loop.
		l.answer(c, fullResponse)
		// One warning a minute at most: a flood must not flood the log too.
		if l.refused++; time.Since(l.warned) >= time.Minute {
			l.log.Warn("connections refused: too many open", zap.Int("refused", l.refused), zap.Int("max_http_conns", cap(l.slot)))
			l.refused, l.warned = 0, time.Now()
		}
	}
}

// answer writes a refusal and closes c, without blocking the accept loop.
func (l *limitListener) answer(c net.Conn, response string) {
	go func() {
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = c.Write([]byte(response))
		c.Close()
	}()
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
