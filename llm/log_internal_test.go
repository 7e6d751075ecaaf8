package llm

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

func jsonLogger(buf *bytes.Buffer) *zap.Logger {
	return zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(buf), zapcore.DebugLevel))
}

// TestNativeLogCannotForgeLines: a native message carrying a forged JSON
// log line (as llama.cpp quotes grammar text) comes out as one escaped
// entry, capped, under either encoder.
func TestNativeLogCannotForgeLines(t *testing.T) {
	forged := "parse: error parsing grammar: x\n\n{\"level\":\"error\",\"msg\":\"admin logged in\"}\r\n" + strings.Repeat("A", 2000) + "\n"
	for _, enc := range []string{"json", "console"} {
		var buf bytes.Buffer
		log := jsonLogger(&buf)
		if enc == "console" {
			log = zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()), zapcore.AddSync(&buf), zapcore.DebugLevel))
		}
		l := &nativeLogger{log: log, tokens: nativeLogBurst, nowFunc: time.Now}
		l.write(4, forged)
		lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
		if len(lines) != 1 {
			t.Fatalf("%s: %d lines, want 1:\n%s", enc, len(lines), buf.String())
		}
		for _, line := range lines {
			if strings.HasPrefix(line, `{"level":"error","msg":"admin`) {
				t.Fatalf("%s: forged line came out raw", enc)
			}
		}
		if len(lines[0]) > 1024 || !strings.Contains(lines[0], "truncated") {
			t.Fatalf("%s: not capped: %d bytes", enc, len(lines[0]))
		}
		if enc == "json" {
			var m map[string]any
			if err := json.Unmarshal([]byte(lines[0]), &m); err != nil {
				t.Fatalf("not one JSON entry: %v", err)
			}
		}
	}
}

// TestNativeLogRateLimit: past the burst, messages are dropped and the
// count is reported with the next one after the refill.
func TestNativeLogRateLimit(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1000, 0)
	l := &nativeLogger{log: jsonLogger(&buf), tokens: nativeLogBurst, refilled: now, nowFunc: func() time.Time { return now }}
	for range 3 * nativeLogBurst {
		l.write(4, "boom\n")
	}
	if n := strings.Count(buf.String(), "\n"); n != nativeLogBurst {
		t.Fatalf("%d lines, want %d", n, nativeLogBurst)
	}
	now = now.Add(nativeLogRefill)
	l.write(4, "again")
	if !strings.Contains(buf.String(), `"dropped_before":100`) {
		t.Fatalf("dropped count not reported:\n%s", buf.String()[len(buf.String())-200:])
	}
	// Quiet levels are filtered unless verbose.
	buf.Reset()
	l.write(2, "info line")
	if buf.Len() != 0 {
		t.Fatalf("info logged when not verbose: %s", buf.String())
	}
}
