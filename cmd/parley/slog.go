package main

import (
	"context"
	"log/slog"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// slogToZap carries what the llama.cpp binding logs through log/slog (the
// CPU features it was built for, at its first load) into Parley's zap
// logger, so a normal start prints structured lines only. It is enabled
// from slog's Info up, as slog's default handler is: the binding asks the
// default logger whether to print llama.cpp's own messages, and Parley
// routes those elsewhere (llm.SetNativeLogger).
type slogToZap struct {
	log    *zap.Logger
	fields []zap.Field
	group  string
}

func (h *slogToZap) Enabled(_ context.Context, l slog.Level) bool {
	return l >= slog.LevelInfo && h.log.Core().Enabled(zapLevel(l))
}

func (h *slogToZap) Handle(_ context.Context, r slog.Record) error {
	fields := append([]zap.Field(nil), h.fields...)
	r.Attrs(func(a slog.Attr) bool {
		fields = appendAttr(fields, h.group, a)
		return true
	})
	if ce := h.log.Check(zapLevel(r.Level), r.Message); ce != nil {
		ce.Write(fields...)
	}
	return nil
}

func (h *slogToZap) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	c.fields = append([]zap.Field(nil), h.fields...)
	for _, a := range attrs {
		c.fields = appendAttr(c.fields, h.group, a)
	}
	return &c
}

func (h *slogToZap) WithGroup(name string) slog.Handler {
	c := *h
	c.group = joinKey(h.group, name)
	return &c
}

// appendAttr flattens a (its groups' keys joined with dots) into fields.
func appendAttr(fields []zap.Field, prefix string, a slog.Attr) []zap.Field {
	v := a.Value.Resolve()
	if v.Kind() == slog.KindGroup {
		for _, g := range v.Group() {
			fields = appendAttr(fields, joinKey(prefix, a.Key), g)
		}
		return fields
	}
	if a.Key == "" {
		return fields
	}
	return append(fields, zap.Any(joinKey(prefix, a.Key), v.Any()))
}

func joinKey(prefix, key string) string {
	switch {
	case prefix == "":
		return key
	case key == "":
		return prefix
	}
	return prefix + "." + key
}

func zapLevel(l slog.Level) zapcore.Level {
	switch {
	case l >= slog.LevelError:
		return zapcore.ErrorLevel
	case l >= slog.LevelWarn:
		return zapcore.WarnLevel
	case l >= slog.LevelInfo:
		return zapcore.InfoLevel
	}
	return zapcore.DebugLevel
}
