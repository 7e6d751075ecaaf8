package apicore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/chat"
	"github.com/parley-chat/parley/media"
)

// ImagePolicy is how the APIs take a request's images: under Limits (format, bytes, pixels, images per request),
// from data: URLs and base64, and from http(s) URLs only through Fetcher when it allows any host. Stats counts the
// images refused.
type ImagePolicy struct {
	Limits  media.Limits
	Fetcher *media.Fetcher // nil or allowing no host: remote URLs are refused
	Stats   *media.Stats   // nil: refusals are not counted
}

// ImageBatch takes the images of one request in order, each checked from its header (never decoded here: the chat
// layer decodes in the sandboxed child). Each refusal is a 400 naming the request part it came from.
type ImageBatch struct {
	ctx   context.Context
	batch *media.Batch
	fetch *media.Fetcher
	lim   media.Limits
	stats *media.Stats
	src   int64 // bytes of the images' sources taken, as the request carried them
}

// Images starts a request's images under the server's policy.
func (k *Core) Images(ctx context.Context) *ImageBatch {
	lim := k.ImagePolicy.Limits.WithDefaults()
	return &ImageBatch{ctx: ctx, batch: lim.NewBatch(), fetch: k.ImagePolicy.Fetcher, lim: lim, stats: k.ImagePolicy.Stats}
}

// URL takes an image given by URL (OpenAI's image_url, the Responses API's input_image): a data: URL, or an
// http(s) URL that the fetch policy allows.
func (b *ImageBatch) URL(part, src string) (parley.ImagePart, error) {
	b.src += int64(len(src))
	s := strings.TrimSpace(src)
	if len(s) > 8 && (strings.EqualFold(s[:7], "http://") || strings.EqualFold(s[:8], "https://")) {
		if !b.fetch.Enabled() {
			b.stats.RefusedFor(media.ReasonRemoteOff)
			return parley.ImagePart{}, chat.ImageError(part, fmt.Errorf("%w: only data: URLs are accepted (the server's --image-url-allow names no host)", media.ErrRemoteOff))
		}
		data, err := b.fetch.Fetch(b.ctx, s)
		if err != nil {
			if b.ctx.Err() == nil {
				b.stats.Refused(err)
			}
			return parley.ImagePart{}, chat.ImageError(part, err)
		}
		im, err := b.add(b.batch.AddBytes(part, data))
		im.Part = part
		return im, err
	}
	im, err := b.add(b.batch.Add(part, s))
	im.Part = part
	return im, err
}

// Base64 takes an image given as bare base64 (Ollama's images, Anthropic's base64 source); a data: URL is taken
// too, as clients send one where base64 is asked for.
func (b *ImageBatch) Base64(part, data string) (parley.ImagePart, error) {
	b.src += int64(len(data))
	im, err := b.add(b.batch.Add(part, data))
	im.Part = part
	return im, err
}

// SourceBytes is the bytes of the images b was given, as the request
// carried them (their data: URLs, base64 or http(s) URLs): how far the
// request's images may take it past a cap on the rest of it.
func (b *ImageBatch) SourceBytes() int64 { return b.src }

func (b *ImageBatch) add(im *media.Image, err error) (parley.ImagePart, error) {
	if err != nil {
		b.stats.Refused(err)
		var pe *media.PartError
		part := ""
		if errors.As(err, &pe) {
			part = pe.Part
		}
		return parley.ImagePart{}, chat.ImageError(part, err)
	}
	return parley.ImagePart{SHA256: media.HashString(im.Hash), MediaType: im.MediaType(), Data: im.Data}, nil
}

// ParseContentParts takes a message's content: a string, or an array of parts whose types are among textTypes
// (their text joined) or imageTypes ("image_url" as OpenAI's chat sends it, "input_image" as the Responses API
// does). Images come back in order, each with its place among the text (parley.ImagePart.Offset).
func ParseContentParts(raw json.RawMessage, field string, images *ImageBatch, textTypes []string, imageTypes ...string) (string, []parley.ImagePart, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '[' || len(imageTypes) == 0 {
		s, err := ParseContent(raw, field, textTypes...)
		return s, nil, err
	}
	var parts []struct {
		Type     string          `json:"type"`
		Text     *string         `json:"text"`
		ImageURL json.RawMessage `json:"image_url"`
		FileID   string          `json:"file_id"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", nil, parley.FieldErrorf(field, "must be a string or an array of content parts")
	}
	var b strings.Builder
	var out []parley.ImagePart
	for i, p := range parts {
		f := fmt.Sprintf("%s[%d]", field, i)
		switch {
		case slices.Contains(textTypes, p.Type):
			if p.Text == nil {
				return "", nil, parley.FieldErrorf(f+".text", "is required")
			}
			b.WriteString(*p.Text)
		case slices.Contains(imageTypes, p.Type):
			url, err := ImageURL(p.ImageURL, f)
			if err != nil {
				return "", nil, err
			}
			if url == "" {
				if p.FileID != "" {
					return "", nil, parley.FieldErrorf(f+".file_id", "files are not kept here: send the image as a data: URL")
				}
				return "", nil, parley.FieldErrorf(f+".image_url", "is required")
			}
			im, err := images.URL(f, url)
			if err != nil {
				return "", nil, err
			}
			im.Offset = b.Len()
			out = append(out, im)
		default:
			return "", nil, parley.FieldErrorf(f, "only text and image parts are supported, got type %q", p.Type)
		}
	}
	return b.String(), out, nil
}

// ImageURL reads an image_url field: a string (the Responses API) or {"url": ..., "detail": ...} (chat).
func ImageURL(raw json.RawMessage, field string) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", parley.FieldErrorf(field+".image_url", "invalid string")
		}
		return s, nil
	}
	var o struct {
		URL string `json:"url"`
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		return "", parley.FieldErrorf(field+".image_url", "must be a URL or an object with a url")
	}
	return o.URL, nil
}
