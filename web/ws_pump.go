package web

// The pump every WebSocket endpoint shares (the chat's conn and the
// Responses API's respSocket): the send queue, the one writer goroutine,
// pings, read deadlines, the reader's verdict on a failed read, and the
// close handshake. The endpoint's handler goroutine is the one reader.

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"go.uber.org/zap"
)

// pump is one upgraded socket's reader/writer machinery. Every write goes
// through send and the writer goroutine (gorilla allows one concurrent
// writer); the handler reads with read.
type pump struct {
	srv *Server
	ws  *websocket.Conn
	log *zap.Logger

	send chan []byte // text frames for the writer

	ctx       context.Context // ends when the connection ends
	cancel    context.CancelFunc
	closeOnce sync.Once
	closeCode int // set once, before ctx ends
	closeText string

	// rd is the reader's deadline; the writer ends it when it has ended.
	rd        *readDeadline
	readLimit int64 // bytes per message, as the upgrade set it
}

// newPump makes the pump of ws, whose context is a child of parent. The
// caller starts writer and reads with read.
func (s *Server) newPump(parent context.Context, ws *websocket.Conn, readLimit int64, log *zap.Logger) pump {
	ctx, cancel := context.WithCancel(parent)
	return pump{
		srv: s, ws: ws, log: log,
		send:      make(chan []byte, s.cfg.SendBuffer),
		ctx:       ctx,
		cancel:    cancel,
		rd:        &readDeadline{ws: ws, pongWait: s.cfg.PongWait},
		readLimit: readLimit,
	}
}

// close ends the connection with a close code: the writer sends the close
// frame, the reader and the work derived from ctx stop. Safe to call many
// times; the first wins.
func (c *pump) close(code int, text string) {
	c.closeOnce.Do(func() {
		c.closeCode, c.closeText = code, text
		c.cancel()
	})
}

// read reads the next message. On a failed read it reports false, having
// logged it and closed the pump with the code it calls for.
func (c *pump) read() (mt int, data []byte, ok bool) {
	mt, data, err := c.ws.ReadMessage()
	if err != nil {
		c.readFailed(err)
		return 0, nil, false
	}
	c.rd.extend()
	return mt, data, true
}

// readFailed is the reader's verdict on a failed read.
func (c *pump) readFailed(err error) {
	var ne net.Error
	switch {
	case errors.Is(err, websocket.ErrReadLimit):
		// gorilla has already sent 1009.
		c.srv.refused(refusedMessageSize)
		c.log.Warn("message over the size limit", zap.Int64("limit", c.readLimit))
		c.close(websocket.CloseMessageTooBig, "")
	case websocket.IsCloseError(err, websocket.CloseNormalClosure, websocket.CloseGoingAway, websocket.CloseNoStatusReceived):
	case c.ctx.Err() != nil:
		// We are closing: the writer ended the read (see readDeadline.end).
	case errors.As(err, &ne) && ne.Timeout():
		// Nothing, not even a pong, for PongWait: the peer or its
		// network is gone. A close frame would go unanswered.
		c.log.Info("peer stopped answering pings: dropped", zap.Duration("pong_wait", c.srv.cfg.PongWait))
		c.close(websocket.CloseAbnormalClosure, "")
	case isProtocolError(err):
		// gorilla has already sent 1002.
		c.log.Warn("malformed frame", zap.Error(err))
		c.close(websocket.CloseProtocolError, "")
	default:
		c.log.Debug("read ended", zap.Error(err))
	}
}

// startWriter starts the writer goroutine; the channel closes when it
// has ended.
func (c *pump) startWriter() <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.writer()
	}()
	return done
}

// finish ends a closed pump: it waits for the writer (started by
// startWriter, whose channel is writerDone) to send the close frame, then
// for the peer's answer, and drops the TCP connection.
func (c *pump) finish(writerDone <-chan struct{}) {
	<-writerDone
	c.finishClose()
}

// finishClose waits briefly for the peer's close frame, then drops the TCP connection.
func (c *pump) finishClose() {
	c.ws.SetReadDeadline(time.Now().Add(closeGrace))
	for {
		if _, _, err := c.ws.NextReader(); err != nil {
			break
		}
	}
	c.ws.Close()
}

func (c *pump) sendJSON(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		c.log.Error("encode message", zap.Error(err))
		return
	}
	c.sendRaw(b)
}

func (c *pump) sendText(s string) { c.sendRaw([]byte(s)) }

// sendRaw queues a frame for the writer without ever blocking: a full
// buffer means the client stopped reading.
func (c *pump) sendRaw(b []byte) {
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
func (c *pump) sendWait(b []byte) bool {
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
func (c *pump) writer() {
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

func (c *pump) write(mt int, b []byte) error {
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
