package chat

import (
	"sync"

	"go.uber.org/zap"

	"github.com/parley-chat/parley"
)

// autoTemplate holds the template loaded for the model's chat template, so that a GGUF's template is compiled and
// probed once, not on every reply. It reloads when the source changes (the engine loads after the Responder is
// built: until then the model has no template).
type autoTemplate struct {
	mu   sync.Mutex
	key  autoKey
	tmpl Template
}

type autoKey struct{ src, toolUse, bos, eos string }

func (a *autoTemplate) get(info parley.ModelInfo, override string, jr JinjaRenderer, log *zap.Logger) Template {
	src := info.ChatTemplate
	if override != "" {
		src = override
	}
	key := autoKey{src, info.ChatTemplates["tool_use"], info.BOSToken, info.EOSToken}
	if override != "" {
		key.toolUse = "" // the operator's template renders everything
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.tmpl == nil || a.key != key {
		a.tmpl, a.key = loadTemplate(key, info, jr, log), key
	}
	return a.tmpl
}

// loadTemplate returns the template for a model's chat template src: the Jinja template itself when it passes
// LoadJinja's probes, with the family DetectTemplate recognises as its fallback; the family alone when src is a
// family name, empty, or refused. It logs which renders.
func loadTemplate(key autoKey, info parley.ModelInfo, jr JinjaRenderer, log *zap.Logger) Template {
	src := key.src
	family := DetectTemplate(src)
	if family.Name() == NameZephyr && info.EOSToken != "" {
		family = zephyr(info.EOSToken) // Zephyr's turns end with the model's own EOS text
	}
	if src == "" || canonicalName(src) != "" {
		return family
	}
	t, err := LoadJinja(src, JinjaConfig{Renderer: jr, BOSToken: info.BOSToken, EOSToken: info.EOSToken,
		Fallback: family, Log: log, ToolUse: key.toolUse})
	if err != nil {
		log.Error("the model's chat template is refused; rendering with a hand-written family instead",
			zap.String("family", family.Name()), zap.Error(err))
		return family
	}
	log.Info("rendering with the model's own chat template", zap.String("template", NameJinja),
		zap.String("fallback", family.Name()), zap.Bool("tool_use_variant", t.toolUse != ""),
		zap.String("thinking", t.ThinkFormat().String()), zap.Strings("stops", t.Stops()))
	return t
}
