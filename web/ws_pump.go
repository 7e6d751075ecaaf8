package web

// The chat connection's pump: the send queue, the one writer goroutine,
// pings, read deadlines, and the close handshake.

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"strings"
	"time"

	"github.com/gorilla/websocket"
	"go.uber.org/zap"
)

// close ends the connection with a close code: the writer sends the close
// frame, the reader and worker stop. Safe to call many times; the first wins.
func (c *conn) close(code int, text string) {
	c.closeOnce.Do(func() {
		c.closeCode, c.closeText = code, text
		c.cancel()
		c.cancelTurn()
	})
}

// finishClose waits briefly for the peer's close frame, then drops the TCP connection.
func (c *conn) finishClose() {
	c.ws.SetReadDeadline(time.Now().Add(closeGrace))
	for {
		if _, _, err := c.ws.NextReader(); err != nil {
			break
		}
	}
	c.ws.Close()
}

func (c *conn) sendJSON(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		c.log.Error("encode message", zap.Error(err))
		return
	}
	c.sendRaw(b)
}

func (c *conn) sendText(s string) { c.sendRaw([]byte(s)) }

// sendRaw queues a frame for the writer without ever blocking: a full
// buffer means the client stopped reading.
func (c *conn) sendRaw(b []byte) {
	if c.ctx.Err() != nil {
		return
	}
	select {
	case c.send <- b:
	default:
		if c.log != nil {
			c.log.Warn("client too slow: disconnecting", zap.Int("buffered", len(c.send)))
		}
		c.close(closeTooSlow, "client too slow")
	}
}

// sendWait queues a frame for the writer, waiting up to WriteWait for room;
// a client that leaves none for that long is too slow. Only the worker
// waits here: the reader never blocks on the client's reading.
func (c *conn) sendWait(b []byte) bool {
	if c.ctx.Err() != nil {
		return false
	}
	select {
	case c.send <- b:
		return true
	default:
	}
	t := time.NewTimer(c.srv.cfg.WriteWait)
	defer t.Stop()
	select {
	case c.send <- b:
		return true
	case <-c.ctx.Done():
		return false
	case <-t.C:
		c.log.Warn("client too slow: disconnecting", zap.Int("buffered", len(c.send)))
		c.close(closeTooSlow, "client too slow")
		return false
	}
}

// writer is the only goroutine that writes to the socket (besides gorilla's
// own control frames). It drains queued frames, pings, and on close sends
// the close frame.
func (c *conn) writer() {
	// Once the writer is done (close frame sent, or the socket failed), the
	// reader must not wait for a pong wait: give it closeGrace for the
	// peer's close frame.
	defer c.rd.end()
	pings := time.NewTicker(c.srv.pingPeriod())
	defer pings.Stop()
	for {
		select {
		case b := <-c.send:
			if err := c.write(websocket.TextMessage, b); err != nil {
				c.close(websocket.CloseAbnormalClosure, "")
				return
			}
		case <-pings.C:
			if err := ping(c.ws, c.srv.cfg.WriteWait); err != nil {
				c.close(websocket.CloseAbnormalClosure, "")
				return
			}
		case <-c.ctx.Done():
			// Flush what is queued (the error or the sentinel that explains the close).
			for {
				select {
				case b := <-c.send:
					if c.write(websocket.TextMessage, b) != nil {
						return
					}
					continue
				default:
				}
				break
			}
			if c.closeCode != websocket.CloseAbnormalClosure {
				writeClose(c.ws, c.closeCode, c.closeText, c.srv.cfg.WriteWait)
			}
			return
		}
	}
}

func (c *conn) write(mt int, b []byte) error {
	c.ws.SetWriteDeadline(time.Now().Add(c.srv.cfg.WriteWait))
	return c.ws.WriteMessage(mt, b)
}

// isProtocolError reports whether a read error is gorilla's verdict on a
// malformed frame (after which it has sent close 1002), as opposed to a
// close, a timeout or a broken socket. gorilla has no type for these.
func isProtocolError(err error) bool {
	var ce *websocket.CloseError
	var ne net.Error
	if errors.As(err, &ce) || errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return false
	}
	return strings.HasPrefix(err.Error(), "websocket: ")
}
