package media

import (
	"encoding/base64"
	"fmt"
	"strings"
)

// ParseSource returns the bytes of an image given as a request gives it: a data: URL (data:image/png;base64,...)
// or bare base64 (Ollama's images, Anthropic's base64 source). Base64 may use the standard or the URL alphabet,
// with or without padding, with white space between; its decoded size is checked against maxBytes before it is
// decoded. An http(s) URL is refused with ErrRemoteOff (Fetcher fetches those where a policy allows), any other
// URL with ErrRemote; bad base64 or a data: URL that is not base64 with ErrEncoding.
func ParseSource(src string, maxBytes int64) ([]byte, error) {
	if scheme, ok := urlScheme(src); ok {
		switch scheme {
		case "data":
			return parseDataURL(src, maxBytes)
		case "http", "https":
			return nil, fmt.Errorf("%w: only data: URLs are accepted", ErrRemoteOff)
		}
		return nil, fmt.Errorf("%w: %s: URLs are not accepted", ErrRemote, scheme)
	}
	return decodeBase64(src, maxBytes)
}

// urlScheme returns the lower-cased scheme of s when s starts with one (letters, then letters, digits, + - .,
// then a colon). Base64 never holds a colon, so this never takes base64 for a URL.
func urlScheme(s string) (string, bool) {
	for i := 0; i < len(s) && i < 32; i++ {
		c := s[i]
		switch {
		case c == ':' && i > 0:
			return strings.ToLower(s[:i]), true
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case i > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return "", false
		}
	}
	return "", false
}

// parseDataURL reads data:[<media type>][;param=value]*;base64,<data>. The declared media type must be an image
// type, or none, or application/octet-stream; the format itself is read from the bytes (Sniff), never taken from
// the declaration, which clients often get wrong.
func parseDataURL(src string, maxBytes int64) ([]byte, error) {
	meta, payload, ok := strings.Cut(src[len("data:"):], ",")
	if !ok {
		return nil, fmt.Errorf("%w: a data: URL without a comma", ErrEncoding)
	}
	params := strings.Split(meta, ";")
	mt := strings.ToLower(strings.TrimSpace(params[0]))
	if mt != "" && mt != "application/octet-stream" && !strings.HasPrefix(mt, "image/") {
		return nil, fmt.Errorf("%w: a data: URL of type %q, not an image", ErrFormat, printable([]byte(mt[:min(len(mt), 64)])))
	}
	if !strings.EqualFold(strings.TrimSpace(params[len(params)-1]), "base64") || len(params) == 1 {
		return nil, fmt.Errorf("%w: a data: URL must be base64 (;base64,)", ErrEncoding)
	}
	return decodeBase64(payload, maxBytes)
}

// decodeBase64 decodes s, refusing it with ErrTooLarge before decoding when its decoded size would pass maxBytes.
func decodeBase64(s string, maxBytes int64) ([]byte, error) {
	n, urlSafe := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case ' ', '\t', '\r', '\n', '=':
		case '-', '_':
			urlSafe = true
			n++
		default:
			n++
		}
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: no image data", ErrEncoding)
	}
	if size := int64(n) * 3 / 4; size > maxBytes {
		return nil, fmt.Errorf("%w: about %d bytes, more than %d", ErrTooLarge, size, maxBytes)
	}
	clean, padded := make([]byte, 0, n), false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case ' ', '\t', '\r', '\n':
		case '=':
			padded = true
		default:
			if padded {
				return nil, fmt.Errorf("%w: data after the padding", ErrEncoding)
			}
			clean = append(clean, c)
		}
	}
	enc := base64.RawStdEncoding
	if urlSafe {
		enc = base64.RawURLEncoding
	}
	out := make([]byte, enc.DecodedLen(len(clean)))
	m, err := enc.Decode(out, clean)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrEncoding, err)
	}
	return out[:m], nil
}
