package web_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/parley-chat/parley/web"
)

// rawChunked sends a raw HTTP/1.1 request and reads the chunked response
// by hand, so the test sees the chunks as the server framed them (Go's
// client would join them). It returns the status, the headers, every
// chunk's data and the trailers.
func rawChunked(tb testing.TB, addr, request string) (int, http.Header, []string, http.Header) {
	tb.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(hangWait))
	if _, err := io.WriteString(c, request); err != nil {
		tb.Fatal(err)
	}
	br := bufio.NewReader(c)
	readHeaders := func() http.Header {
		h := http.Header{}
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				tb.Fatalf("read headers: %v", err)
			}
			line = strings.TrimRight(line, "\r\n")
			if line == "" {
				return h
			}
			k, v, _ := strings.Cut(line, ":")
			h.Add(k, strings.TrimSpace(v))
		}
	}
	status, err := br.ReadString('\n')
	if err != nil {
		tb.Fatal(err)
	}
	code, _ := strconv.Atoi(strings.Fields(status)[1])
	hdr := readHeaders()
	if hdr.Get("Transfer-Encoding") != "chunked" {
		b, _ := io.ReadAll(br)
		return code, hdr, []string{string(b)}, nil
	}
	var chunks []string
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			tb.Fatalf("read chunk size: %v", err)
		}
		size, err := strconv.ParseInt(strings.TrimRight(line, "\r\n"), 16, 64)
		if err != nil {
			tb.Fatalf("chunk size %q: %v", line, err)
		}
		if size == 0 {
			return code, hdr, chunks, readHeaders()
		}
		data := make([]byte, size+2)
		if _, err := io.ReadFull(br, data); err != nil {
			tb.Fatal(err)
		}
		chunks = append(chunks, string(data[:size]))
	}
}

func TestPlainStream(t *testing.T) {
	s := mustOpenAPI(t, nil)
	addr := s.srv.Addr()
	q := url.Values{"prompt": {"Once upon a time"}, "max_tokens": {"16"}}
	code, hdr, chunks, trailers := rawChunked(t, addr,
		"POST /?"+q.Encode()+" HTTP/1.1\r\nHost: "+addr+"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	if code != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/plain") {
		t.Fatalf("status %d, headers %v", code, hdr)
	}
	// One flush per token: the reply arrives in many chunks, not one.
	if len(chunks) < 8 {
		t.Fatalf("%d chunks %q: the reply was not streamed token by token", len(chunks), chunks)
	}
	text := strings.Join(chunks, "")
	want := generate(t, s, "Once upon a time", map[string]any{"max_new_tokens": 16}).GeneratedText
	if text != want {
		t.Fatalf("plain stream %q, /generate %q", text, want)
	}
	if trailers.Get("X-Parley-Finish-Reason") != "length" || !strings.Contains(trailers.Get("X-Parley-Usage"), "completion=16") ||
		!strings.Contains(trailers.Get("X-Parley-Timings"), "ttft_ms=") {
		t.Fatalf("trailers %v", trailers)
	}

	// The prompt as the body, parameters in the query; Go's client reads
	// the trailers too.
	res := post(t, s.base+"/?max_tokens=16", "Once upon a time")
	body, err := io.ReadAll(res.Body)
	if err != nil || string(body) != want || res.Trailer.Get("X-Parley-Finish-Reason") != "length" {
		t.Fatalf("body prompt: %q %v, trailers %v", body, err, res.Trailer)
	}

	// A stop string given twice (two stop strings) ends the reply before the first.
	stop := strings.Fields(want)[3]
	res = post(t, s.base+"/?"+url.Values{"prompt": {"Once upon a time"}, "max_tokens": {"16"}, "stop": {"zzz", stop}}.Encode(), nil)
	body, _ = io.ReadAll(res.Body)
	if string(body) != want[:strings.Index(want, stop)] || res.Trailer.Get("X-Parley-Finish-Reason") != "stop" {
		t.Fatalf("stop %q: %q (%s)", stop, body, res.Trailer.Get("X-Parley-Finish-Reason"))
	}
}

func TestPlainValidation(t *testing.T) {
	s := mustOpenAPI(t, func(c *web.Config) { c.APIKey = "k3y" })
	auth := []string{"Authorization", "Bearer k3y"}
	cases := []struct {
		name   string
		query  string
		body   any
		status int
		field  string
	}{
		{"no prompt", "", nil, 400, "prompt"},
		{"blank prompt", "?prompt=%20", nil, 400, "prompt"},
		{"temperature a word", "?prompt=Hi&temperature=hot", nil, 400, "temperature"},
		{"temperature NaN", "?prompt=Hi&temperature=NaN", nil, 400, "temperature"},
		{"temperature negative", "?prompt=Hi&temperature=-0.5", nil, 400, "temperature"},
		{"max_tokens huge", "?prompt=Hi&max_tokens=99999999", nil, 400, "max_tokens"},
		{"max_tokens hex", "?prompt=Hi&max_tokens=0x10", nil, 400, "max_tokens"},
		{"top_p over 1", "?prompt=Hi&top_p=2", nil, 400, "top_p"},
		{"min_p negative", "?prompt=Hi&min_p=-1", nil, 400, "min_p"},
		{"presence_penalty huge", "?prompt=Hi&presence_penalty=1e6", nil, 400, "presence_penalty"},
		{"frequency_penalty a word", "?prompt=Hi&frequency_penalty=lots", nil, 400, "frequency_penalty"},
		{"repeat_last_n too small", "?prompt=Hi&repeat_last_n=-2", nil, 400, "repeat_last_n"},
		{"body not UTF-8", "", "\xff\xfe", 400, "prompt"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			wantFieldError(t, post(t, s.base+"/"+c.query, c.body, auth...), c.status, c.field)
		})
	}
	// The key is required.
	wantFieldError(t, post(t, s.base+"/?prompt=Hi", nil), http.StatusUnauthorized, "")
	res := post(t, s.base+"/?prompt=Hi&max_tokens=3", nil, auth...)
	if b, _ := io.ReadAll(res.Body); res.StatusCode != 200 || len(b) == 0 {
		t.Fatalf("with the key: %d %q", res.StatusCode, b)
	}
	// Query values are any text: a control character is a fine stop string.
	res = post(t, s.base+"/?prompt=Hi&max_tokens=3&stop=%01", nil, auth...)
	if b, _ := io.ReadAll(res.Body); res.StatusCode != 200 || len(b) == 0 {
		t.Fatalf("stop=%%01: %d %q", res.StatusCode, b)
	}
	// GET / is still the chat page.
	page, err := http.Get(s.base + "/")
	if err != nil {
		t.Fatal(err)
	}
	page.Body.Close()
	if page.StatusCode != 200 || !strings.HasPrefix(page.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /: %d %s", page.StatusCode, page.Header.Get("Content-Type"))
	}
}
