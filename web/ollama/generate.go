package ollama

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
	"github.com/parley-chat/parley/web/internal/apicore"
)

// POST /api/generate: a prompt rendered with the model's chat template
// (system as its system message), or with raw: true sent as it is. The
// legacy context array (the token ids of an earlier exchange, which the last
// object returns) is validated against the vocabulary and the context
// window and put before the prompt. Ollama's template field (a Go template)
// is refused: Parley renders the model's own chat template, and raw: true
// takes a prompt the client formatted itself.

type ollamaGenerateRequest struct {
	ollamaCommon
	Prompt   string   `json:"prompt"`
	Suffix   string   `json:"suffix"`
	System   string   `json:"system"`
	Template string   `json:"template"`
	Raw      bool     `json:"raw"`
	Context  []int    `json:"context"`
	Images   []string `json:"images"`
}

// detokenizer gives the text of a token (*llm.Engine, the server's
// Tokenizer, has it).
type detokenizer interface {
	TokenText(id int) string
}

// Generate is POST /api/generate.
func (s *API) Generate(c echo.Context) error {
	call := &ollamaCall{start: time.Now()}
	body, err := apicore.ReadBody(c)
	if err != nil {
		return err
	}
	var req ollamaGenerateRequest
	if err := decodeOllama(body, &req); err != nil {
		return err
	}
	patch, err := s.parseOllamaCommon(c, &req.ollamaCommon, call)
	if err != nil {
		return err
	}
	if err := checkGenerateFields(&req); err != nil {
		return err
	}
	if err := s.resolveOllama(patch, call); err != nil {
		return err
	}
	model := s.ollamaModelName(call.facts.Model)
	call.text = func(piece string) ollamaChunk {
		return ollamaChunk{Model: model, CreatedAt: ollamaNow(), Response: &piece}
	}
	call.thought = func(piece string) ollamaChunk {
		empty := ""
		return ollamaChunk{Model: model, CreatedAt: ollamaNow(), Response: &empty, Thinking: piece}
	}
	if req.Prompt == "" {
		// Ollama's way to load a model: a generate with no prompt.
		return s.ollamaLoaded(c, call)
	}
	prefix, err := s.contextText(c.Request().Context(), call.facts.Model, req.Context)
	if err != nil {
		return err
	}
	var images []parley.ImagePart
	batch := s.core.Images(c.Request().Context())
	for i, src := range req.Images {
		im, err := batch.Base64(fmt.Sprintf("images[%d]", i), src)
		if err != nil {
			return err
		}
		images = append(images, im)
	}
	var a *apicore.Call
	switch {
	case req.Raw:
		a, err = s.core.StartCompletion(c, call.facts, "ollama-generate", prefix+req.Prompt, call.params)
	case prefix == "":
		a, err = s.core.StartChat(c, call.facts, "ollama-generate", "", generateMessages(&req, images), call.params)
	default:
		a, err = s.startContinued(c, prefix, generateMessages(&req, nil), call)
	}
	if err != nil {
		return renameOllama(err)
	}
	call.finish = func(last *ollamaChunk, reply string) {
		last.Context = s.contextOf(c.Request().Context(), call.facts.Model, a.Rep.Prompt()+reply)
	}
	return s.ollamaRespond(c, a, call)
}

// checkGenerateFields refuses what Parley cannot do with a generate
// request rather than ignoring it.
func checkGenerateFields(req *ollamaGenerateRequest) error {
	switch {
	case req.Template != "":
		return parley.FieldErrorf("template", "is not supported: Parley renders the model's own chat template; send raw: true with a prompt you formatted")
	case req.Suffix != "":
		return parley.FieldErrorf("suffix", "is not supported: Parley does no fill-in-the-middle")
	case len(req.Images) > 0 && (req.Raw || len(req.Context) > 0):
		return parley.FieldErrorf("images", "are taken with a templated prompt only, not with raw or context")
	case req.Prompt == "" && len(req.Context) > 0:
		return parley.FieldErrorf("prompt", "must not be empty when context is given")
	}
	return nil
}

func generateMessages(req *ollamaGenerateRequest, images []parley.ImagePart) []parley.Message {
	var msgs []parley.Message
	if req.System != "" {
		msgs = append(msgs, parley.Message{Role: parley.RoleSystem, Content: req.System})
	}
	return append(msgs, parley.Message{Role: parley.RoleUser, Content: req.Prompt, Images: images})
}

// startContinued starts a templated prompt that follows an earlier
// exchange's text (the context array's): the prompt is the template's
// rendering of msgs after prefix, with the template's end-of-turn stops.
func (s *API) startContinued(c echo.Context, prefix string, msgs []parley.Message, call *ollamaCall) (*apicore.Call, error) {
	t, ok := s.core.TemplateFor(call.facts.Model)
	if !ok {
		return nil, parley.FieldErrorf("context", "is not supported by this server")
	}
	// The rendered prompt goes to the tokenizer as it is, so a message
	// must not spell out a control token (a role marker would forge a
	// turn); Reply, used without context, neutralizes them instead.
	for _, m := range msgs {
		for _, ct := range s.loadedModel(call.facts.Model).ControlTokens {
			if ct != "" && strings.Contains(m.Content, ct) {
				field := "prompt"
				if m.Role == parley.RoleSystem {
					field = "system"
				}
				return nil, parley.FieldErrorf(field, "must not contain the control token %q when context is given (send raw: true to format the prompt yourself)", ct)
			}
		}
	}
	rendered, err := t.Render(msgs, chat.Gen)
	if err != nil {
		return nil, fmt.Errorf("render prompt: %w", err)
	}
	p := call.params
	p.Stop = append(append([]string(nil), p.Stop...), t.Stops()...)
	return s.core.StartCompletion(c, call.facts, "ollama-generate", prefix+rendered, p)
}

// contextText is the text of a context array, checked: every id is in the
// vocabulary and the whole fits the context window. A leading BOS is
// dropped (the tokenizer adds its own). model is the request's.
func (s *API) contextText(ctx context.Context, model string, ids []int) (string, error) {
	if len(ids) == 0 {
		return "", nil
	}
	info := s.loadedModel(model)
	tok, release, err := s.core.TokenizerFor(ctx, model)
	if err != nil {
		return "", err
	}
	defer release()
	dt, ok := tok.(detokenizer)
	if !ok || info.VocabSize <= 0 {
		return "", parley.FieldErrorf("context", "is not supported by this server")
	}
	if len(ids) >= info.ContextLength {
		return "", parley.FieldErrorf("context", "holds %d tokens; the context window holds %d, the new prompt and the reply included", len(ids), info.ContextLength)
	}
	var b strings.Builder
	for i, id := range ids {
		if id < 0 || id >= info.VocabSize {
			return "", parley.FieldErrorf(fmt.Sprintf("context[%d]", i), "token id %d is not in the model's vocabulary of %d", id, info.VocabSize)
		}
		piece := dt.TokenText(id)
		if i == 0 && info.BOSToken != "" && piece == info.BOSToken {
			continue
		}
		b.WriteString(piece)
	}
	return b.String(), nil
}

// contextOf is the context array a reply returns: the token ids of its
// prompt (the context it continued included) and its text. nil when there
// is no tokenizer or the text does not tokenize. model is the request's.
func (s *API) contextOf(ctx context.Context, model, text string) []int {
	tok, release, err := s.core.TokenizerFor(ctx, model)
	if err != nil || tok == nil {
		return nil
	}
	defer release()
	ids, err := tok.Tokenize(text)
	if err != nil {
		return nil
	}
	return ids
}
