package llm

/*
// llama.h is not included here (its include path belongs to the binding);
// these match its declarations: ggml_log_level is a C enum (an int).
typedef void (*parley_log_fn)(int level, const char *text, void *user_data);
extern void llama_log_set(parley_log_fn cb, void *user_data);
extern void parleyNativeLog(int level, char *text, void *user_data);
static void parley_route_native_log(void) { llama_log_set((parley_log_fn)parleyNativeLog, 0); }
*/
import "C"

import (
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Native log lines are client-influenced (llama.cpp quotes grammar text in
// some errors), so each is escaped, capped and rate-limited.
const (
	maxNativeLogBytes = 512             // of one message, before escaping
	nativeLogBurst    = 50              // messages let through at once
	nativeLogRefill   = 5 * time.Second // ... and refilled this often
)

// nativeLog is where llama.cpp's log callback writes. It is process-wide
// because llama.cpp's callback is: SetNativeLogger replaces it.
var nativeLog atomic.Pointer[nativeLogger]

type nativeLogger struct {
	log     *zap.Logger
	verbose bool

	mu       sync.Mutex
	level    zapcore.Level // of the last message, for llama.cpp's continuation lines
	tokens   int
	refilled time.Time
	dropped  int
	nowFunc  func() time.Time
}

// SetNativeLogger routes llama.cpp's (and ggml's) own log through log:
// errors only, everything when verbose. Each message is one
// log entry with its control characters escaped (no raw line reaches the
// output), cut at 512 bytes, and at most 50 per 5 seconds pass (the number
// dropped is reported with the next one). It is process-wide state: call it
// once, from main or a TestMain.
func SetNativeLogger(log *zap.Logger, verbose bool) {
	nativeLog.Store(&nativeLogger{log: log, verbose: verbose, tokens: nativeLogBurst, nowFunc: time.Now})
	C.parley_route_native_log()
}

// SetNativeLog is SetNativeLogger with a JSON logger writing to w.
func SetNativeLog(w io.Writer, verbose bool) {
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	SetNativeLogger(zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.AddSync(w), zapcore.DebugLevel)), verbose)
}

//export parleyNativeLog
func parleyNativeLog(level C.int, text *C.char, _ unsafe.Pointer) {
	l := nativeLog.Load()
	if l == nil || text == nil {
		return
	}
	// Read at most the cap (plus one byte to know it was cut), never the
	// whole of a huge C string.
	n := 0
	for n <= maxNativeLogBytes && *(*byte)(unsafe.Add(unsafe.Pointer(text), n)) != 0 {
		n++
	}
	l.write(int(level), C.GoStringN(text, C.int(n)))
}

// write logs one native message at llama.cpp's level (ggml_log_level).
func (l *nativeLogger) write(level int, msg string) {
	l.mu.Lock()
	lvl := l.level
	switch level {
	case 1:
		lvl = zapcore.DebugLevel
	case 2:
		lvl = zapcore.InfoLevel
	case 3:
		lvl = zapcore.WarnLevel
	case 4:
		lvl = zapcore.ErrorLevel
	case 5: // continuation: the previous level
	default:
		lvl = zapcore.InfoLevel
	}
	l.level = lvl
	if !l.verbose && lvl < zapcore.ErrorLevel {
		l.mu.Unlock()
		return
	}
	now := l.nowFunc()
	if now.Sub(l.refilled) >= nativeLogRefill {
		l.tokens, l.refilled = nativeLogBurst, now
	}
	if l.tokens == 0 {
		l.dropped++
		l.mu.Unlock()
		return
	}
	l.tokens--
	dropped := l.dropped
	l.dropped = 0
	l.mu.Unlock()

	msg, cut := escapeNative(msg)
	if msg == "" {
		return
	}
	fields := []zap.Field{}
	if cut {
		fields = append(fields, zap.Bool("truncated", true))
	}
	if dropped > 0 {
		fields = append(fields, zap.Int("dropped_before", dropped))
	}
	if ce := l.log.Check(lvl, msg); ce != nil {
		ce.Write(fields...)
	}
}

// escapeNative trims the trailing newline, cuts msg at maxNativeLogBytes
// and escapes every control character and
// invalid byte, so a message is always one line of printable text
// whatever the output encoder.
func escapeNative(msg string) (string, bool) {
	cut := false
	if len(msg) > maxNativeLogBytes {
		msg, cut = msg[:maxNativeLogBytes], true
		// A character cut in two is escaped byte by byte below.
	}
	for len(msg) > 0 && (msg[len(msg)-1] == '\n' || msg[len(msg)-1] == '\r') {
		msg = msg[:len(msg)-1]
	}
	q := strconv.QuoteToGraphic(msg)
	return q[1 : len(q)-1], cut
}
