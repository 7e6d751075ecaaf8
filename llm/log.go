package llm

import (
	"io"
	"log/slog"
)

// SetNativeLog decides which of llama.cpp's own log lines reach stderr. The
// binding prints a line only when slog's default logger enables its level,
// so this sets slog's default logger (writing to w): errors only, or
// everything when verbose. It is process-wide state: call it once, from main
// or a TestMain.
func SetNativeLog(w io.Writer, verbose bool) {
	level := slog.LevelError
	if verbose {
		level = slog.LevelDebug
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})))
}
