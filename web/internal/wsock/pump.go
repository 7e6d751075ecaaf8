// Package wsock is the lifecycle every WebSocket endpoint shares (the chat
// socket's and the Responses API's): the pump (the send queue, the one
// writer goroutine, pings, read deadlines, the reader's verdict on a failed
// read, and the close handshake), the size caps of messages that carry
// images and what their bytes hold of the body budget (message.go), and
// the server's side of a socket (Lifecycle: admission, upgrade, tracking
// for the drain).
package wsock

// The pump every WebSocket endpoint shares (the chat's connection and the
// Responses API's socket): the send queue, the one writer goroutine,
// pings, read deadlines, the reader's verdict on a failed read, and the
// Close handshake. The endpoint's handler goroutine is the one reader.

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

// Pump is one upgraded socket's reader/writer machinery. Every write goes
// through the send queue and the writer goroutine (gorilla allows one
// concurrent writer); the handler reads with Read.
type Pump struct {
	set Settings
	ws  *websocket.Conn
	Log *zap.Logger

	send chan []byte // text frames for the writer

	Ctx       context.Context // ends when the connection ends
	cancel    context.CancelFunc
	closeOnce sync.Once
	closeCode int // set once, before ctx ends
	closeText string

	// rd is the reader's deadline; the writer ends it when it has ended.
	rd        *readDeadline
	readLimit int64 // bytes per message, as the upgrade set it
}

// Settings are a pump's bounds, from the server's configuration.
type Settings struct {
	SendBuffer int           // frames queued for the writer
	PongWait   time.Duration // silence after which the peer is dropped; pings go out every half of it
	WriteWait  time.Duration // bound on every write
	// Refused counts a refusal under its cause (metrics), and
	// CountRefusal counts err under its own if it is a refusal.
	Refused      func(cause string)
	CountRefusal func(err error)
	// Bodies is the server's budget of request bodies in flight, which
	// the bytes of a message past Caps.Free are held from (ReadMessage);
	// nil: no budget.
	Bodies Budget
	// MaxMessageBytes is what one message holds without the budget (a
	// socket's Caps.Free), and the cap of one without images on the chat
	// socket.
	MaxMessageBytes int64
}

// PingPeriod is how often a socket pings its peer: half the pong wait,
// leaving the pong the other half to arrive before the read deadline (a
// tenth, as gorilla's example has it, dropped lively peers of a busy
// machine when the wait is short).
func (set Settings) PingPeriod() time.Duration { return set.PongWait / 2 }

// NewPump makes the pump of ws, whose context is a child of parent. The
// caller starts the writer (StartWriter) and reads with Read.
func NewPump(set Settings, parent context.Context, ws *websocket.Conn, readLimit int64, log *zap.Logger) *Pump {
	ctx, cancel := context.WithCancel(parent)
	return &Pump{
		set: set, ws: ws, Log: log,
		send:      make(chan []byte, set.SendBuffer),
		Ctx:       ctx,
		cancel:    cancel,
		rd:        &readDeadline{ws: ws, pongWait: set.PongWait},
		readLimit: readLimit,
	}
}

// StartReadDeadline sets the first read deadline and lets every pong
// extend it. The reader calls it before its first read.
func (c *Pump) StartReadDeadline() { c.rd.start() }

// CloseCode is the code the pump closed with; it is set before Ctx ends.
func (c *Pump) CloseCode() int { return c.closeCode }

// Close ends the connection with a close code: the writer sends the close
// frame, the reader and the work derived from ctx stop. Safe to call many
// times; the first wins.
func (c *Pump) Close(code int, text string) {
	c.closeOnce.Do(func() {
		c.closeCode, c.closeText = code, text
		c.cancel()
	})
}

// Read reads the next message. On a failed read it reports false, having
// logged it and closed the pump with the code it calls for.
func (c *Pump) Read() (mt int, data []byte, ok bool) {
	mt, data, err := c.ws.ReadMessage()
	if err != nil {
		c.readFailed(err)
		return 0, nil, false
	}
	c.rd.extend()
	return mt, data, true
}

// errMessageTooLarge is a message over readCapped's limit, read to its end
// and dropped.
var errMessageTooLarge = errors.New("message too large")

// readStep is how much readCapped reads at a time, and the least it grows
// a hold by.
const readStep = 64 << 10

// readCapped reads the next message as Read does, holding at most limit
// bytes of it: a longer message is read to its end and dropped, reported
// as dropped with errMessageTooLarge, and the connection lives on (the
// read limit set at the upgrade still closes it with 1009 past that). The
// bytes past free are held of hold's budget before they are held in
// memory, in steps of readStep or more; its refusal drops the message too,
// reported as dropped with the budget's error. hold keeps what it took,
// dropped or not. ok is false when the read failed (as Read's).
func (c *Pump) readCapped(limit, free int64, hold *Hold) (mt int, data []byte, dropped error, ok bool) {
	mt, r, err := c.ws.NextReader()
	if err != nil {
		c.readFailed(err)
		return 0, nil, nil, false
	}
	var buf []byte
	chunk := make([]byte, readStep)
	for {
		n, err := r.Read(chunk)
		if n > 0 && dropped == nil {
			size := int64(len(buf) + n)
			switch {
			case size > limit:
				dropped = errMessageTooLarge
			case size > free+hold.Bytes():
				dropped = hold.Grow(max(readStep, size-free-hold.Bytes()))
			}
			if dropped == nil {
				buf = append(buf, chunk[:n]...)
			} else {
				buf = nil // what is read from here on is dropped as it comes
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			c.readFailed(err)
			return 0, nil, nil, false
		}
	}
	c.rd.extend()
	return mt, buf, dropped, true
}

// refused counts a refusal under cause.
func (c *Pump) refused(cause string) {
	if c.set.Refused != nil {
		c.set.Refused(cause)
	}
}

// readFailed is the reader's verdict on a failed read.
func (c *Pump) readFailed(err error) {
	var ne net.Error
	switch {
	case errors.Is(err, websocket.ErrReadLimit):
		// gorilla has already sent 1009.
		c.refused(RefusedMessageSize)
		c.Log.Warn("message over the size limit", zap.Int64("limit", c.readLimit))
		c.Close(websocket.CloseMessageTooBig, "")
	case websocket.IsCloseError(err, websocket.CloseNormalClosure, websocket.CloseGoingAway, websocket.CloseNoStatusReceived):
	case c.Ctx.Err() != nil:
		// We are closing: the writer ended the read (see readDeadline.end).
	case errors.As(err, &ne) && ne.Timeout():
		// Nothing, not even a pong, for PongWait: the peer or its
		// network is gone. A close frame would go unanswered.
		c.Log.Info("peer stopped answering pings: dropped", zap.Duration("pong_wait", c.set.PongWait))
		c.Close(websocket.CloseAbnormalClosure, "")
	case isProtocolError(err):
		// gorilla has already sent 1002.
		c.Log.Warn("malformed frame", zap.Error(err))
		c.Close(websocket.CloseProtocolError, "")
	default:
		c.Log.Debug("read ended", zap.Error(err))
	}
}

// StartWriter starts the writer goroutine; the channel closes when it
// has ended.
func (c *Pump) StartWriter() <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.writer()
	}()
	return done
}

// Finish ends a closed pump: it waits for the writer (started by
// startWriter, whose channel is writerDone) to send the close frame, then
// for the peer's answer, and drops the TCP connection.
func (c *Pump) Finish(writerDone <-chan struct{}) {
	<-writerDone
	c.FinishClose()
}

// FinishClose waits briefly for the peer's close frame, then drops the TCP connection.
func (c *Pump) FinishClose() {
	c.ws.SetReadDeadline(time.Now().Add(CloseGrace))
	for {
		if _, _, err := c.ws.NextReader(); err != nil {
			break
		}
	}
	c.ws.Close()
}

func (c *Pump) SendJSON(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		c.Log.Error("encode message", zap.Error(err))
		return
	}
	c.SendRaw(b)
}

func (c *Pump) SendText(s string) { c.SendRaw([]byte(s)) }

// SendRaw queues a frame for the writer without ever blocking: a full
// buffer means the client stopped reading.
func (c *Pump) SendRaw(b []byte) {
	if c.Ctx.Err() != nil {
		return
	}
	select {
	case c.send <- b:
	default:
		if c.Log != nil {
			c.Log.Warn("client too slow: disconnecting", zap.Int("buffered", len(c.send)))
		}
		c.Close(CloseTooSlow, "client too slow")
	}
}

// SendWait queues a frame for the writer, waiting up to WriteWait for room;
// a client that leaves none for that long is too slow. Only the worker
// waits here: the reader never blocks on the client's reading.
func (c *Pump) SendWait(b []byte) bool {
	if c.Ctx.Err() != nil {
		return false
	}
	select {
	case c.send <- b:
		return true
	default:
	}
	t := time.NewTimer(c.set.WriteWait)
	defer t.Stop()
	select {
	case c.send <- b:
		return true
	case <-c.Ctx.Done():
		return false
	case <-t.C:
		c.Log.Warn("client too slow: disconnecting", zap.Int("buffered", len(c.send)))
		c.Close(CloseTooSlow, "client too slow")
		return false
	}
}

// writer is the only goroutine that writes to the socket (besides gorilla's
// own control frames). It drains queued frames, pings, and on close sends
// the close frame.
func (c *Pump) writer() {
	// Once the writer is done (close frame sent, or the socket failed), the
	// reader must not wait for a pong wait: give it CloseGrace for the
	// peer's close frame.
	defer c.rd.end()
	pings := time.NewTicker(c.set.PingPeriod())
	defer pings.Stop()
	for {
		select {
		case b := <-c.send:
			if err := c.write(websocket.TextMessage, b); err != nil {
				c.Close(websocket.CloseAbnormalClosure, "")
				return
			}
		case <-pings.C:
			if err := ping(c.ws, c.set.WriteWait); err != nil {
				c.Close(websocket.CloseAbnormalClosure, "")
				return
			}
		case <-c.Ctx.Done():
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
				WriteClose(c.ws, c.closeCode, c.closeText, c.set.WriteWait)
			}
			return
		}
	}
}

func (c *Pump) write(mt int, b []byte) error {
	c.ws.SetWriteDeadline(time.Now().Add(c.set.WriteWait))
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

const (
	// CloseGrace is how long we wait for the peer's close frame after
	// sending ours (and how long a closing reader may still block).
	CloseGrace = time.Second
	// CloseTooSlow is sent to a client that stopped reading (policy violation).
	CloseTooSlow = websocket.ClosePolicyViolation
	// RefusedMessageSize is the refusal cause of a message over the size
	// limit (closed with 1009), or over its cap (refused with too_large:
	// ReadMessage, CheckRest).
	RefusedMessageSize = "message_too_large"
)

// Cancel ends the pump's context without a close code (the handler's
// deferred cleanup).
func (c *Pump) Cancel() { c.cancel() }

// ExtendReadDeadline pushes the read deadline a pong wait ahead, as a
// message that arrives does.
func (c *Pump) ExtendReadDeadline() { c.rd.extend() }
