package media_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parley-chat/parley/media"
)

func TestCheckAddr(t *testing.T) {
	blocked := map[string]string{
		"127.0.0.1":                "loopback",
		"127.8.9.10":               "loopback",
		"::1":                      "loopback",
		"::ffff:127.0.0.1":         "loopback",
		"10.1.2.3":                 "private",
		"172.16.0.1":               "private",
		"192.168.1.1":              "private",
		"fd12::1":                  "private",
		"169.254.169.254":          "metadata",
		"fd00:ec2::254":            "metadata",
		"169.254.1.1":              "link-local",
		"fe80::1":                  "link-local",
		"100.100.100.200":          "carrier-grade NAT",
		"0.0.0.0":                  "unspecified",
		"::":                       "unspecified",
		"0.1.2.3":                  "this-network",
		"224.0.0.1":                "multicast",
		"ff02::1":                  "multicast",
		"255.255.255.255":          "broadcast",
		"240.1.2.3":                "reserved",
		"64:ff9b::7f00:1":          "loopback", // NAT64 of 127.0.0.1
		"64:ff9b::a9fe:a9fe":       "metadata", // NAT64 of 169.254.169.254
		"2002:7f00:1::1":           "loopback", // 6to4 of 127.0.0.1
		"2002:c0a8:101::1":         "private",  // 6to4 of 192.168.1.1
		"2001:0:4136:e378::1":      "Teredo",
		"::7f00:1":                 "IPv4-compatible",
		"198.18.0.1":               "benchmarking",
		"192.0.2.1":                "documentation",
		"2001:db8::1":              "documentation",
		"fec0::1":                  "site-local",
		"192.0.0.8":                "IETF",
		"64:ff9b:1::1":             "local NAT64",
		"100::1":                   "discard",
		"::ffff:169.254.169.254":   "metadata",
		"::ffff:10.0.0.1":          "private",
		"fe80::1%eth0":             "link-local",
		"64:ff9b::8.8.8.8%foo":     "",
		"2606:4700:4700::1111%eth": "",
	}
	for s, want := range blocked {
		err := media.CheckAddr(netip.MustParseAddr(s))
		if want == "" {
			if err != nil {
				t.Errorf("%s: %v; want allowed", s, err)
			}
			continue
		}
		if !errors.Is(err, media.ErrRemote) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want ErrRemote saying %q", s, err, want)
		}
	}
	for _, s := range []string{"8.8.8.8", "1.1.1.1", "93.184.215.14", "2606:4700:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1"} {
		if err := media.CheckAddr(netip.MustParseAddr(s)); err != nil {
			t.Errorf("%s: %v; want allowed", s, err)
		}
	}
}

// counting is an HTTP server that counts its requests: a refused fetch must never reach it.
type counting struct {
	*httptest.Server
	hits atomic.Int64
	addr netip.AddrPort
	port string
}

func serve(t *testing.T, h http.HandlerFunc) *counting {
	t.Helper()
	c := &counting{}
	c.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.hits.Add(1)
		h(w, r)
	}))
	t.Cleanup(c.Close)
	c.addr = netip.MustParseAddrPort(c.Listener.Addr().String())
	c.port = fmt.Sprint(c.addr.Port())
	return c
}

// lookup resolves the tests' names: good.test to the exempt server, evil.test and rebind.test to loopback,
// inside.test to a private address and loopback, and nothing else.
func lookup(_ context.Context, host string) ([]netip.Addr, error) {
	switch strings.TrimSuffix(strings.ToLower(host), ".") { // as a real resolver reads a name
	case "good.test", "evil.test":
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	case "v6.test":
		return []netip.Addr{netip.MustParseAddr("::1")}, nil
	case "inside.test":
		return []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("127.0.0.1")}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func TestFetchIsOffByDefault(t *testing.T) {
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) {})
	for _, f := range []*media.Fetcher{nil, media.NewFetcher(media.FetchPolicy{})} {
		if _, err := f.Fetch(context.Background(), srv.URL); !errors.Is(err, media.ErrRemoteOff) {
			t.Errorf("%v; want ErrRemoteOff", err)
		}
	}
	if srv.hits.Load() != 0 {
		t.Errorf("the server got %d requests", srv.hits.Load())
	}
}

// Loopback, by address or by a name that resolves to it, is refused even when the allowlist names it; the server
// never sees a request.
func TestFetchRefusesLoopbackAfterResolution(t *testing.T) {
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("secret")) })
	f := media.NewFetcher(media.FetchPolicy{Allow: []string{
		"127.0.0.1:" + srv.port, "localhost:" + srv.port, "evil.test:" + srv.port, "v6.test:" + srv.port,
		"inside.test:" + srv.port, "[::1]:" + srv.port, "2130706433:" + srv.port,
	}}, media.WithLookup(lookup))
	cases := map[string]string{
		"http://127.0.0.1:" + srv.port + "/":    "loopback",
		"http://evil.test:" + srv.port + "/":    "loopback address (evil.test resolves to it)",
		"http://EVIL.test.:" + srv.port + "/":   "loopback",
		"http://v6.test:" + srv.port + "/":      "loopback",
		"http://inside.test:" + srv.port + "/":  "private", // every address refused; the first reason is given
		"http://[::1]:" + srv.port + "/":        "loopback",
		"http://localhost:" + srv.port + "/":    "no such host", // the test resolver knows no localhost
		"http://2130706433:" + srv.port + "/":   "",             // 127.0.0.1 as a number: not a name the resolver knows
		"http://127.0.0.1:" + srv.port + "/x.p": "loopback",
	}
	for u, want := range cases {
		_, err := f.Fetch(context.Background(), u)
		if !errors.Is(err, media.ErrRemote) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want ErrRemote saying %q", u, err, want)
		}
	}
	if srv.hits.Load() != 0 {
		t.Errorf("the loopback server got %d requests", srv.hits.Load())
	}
}

func TestFetchChecksTheURL(t *testing.T) {
	f := media.NewFetcher(media.FetchPolicy{Allow: []string{"images.example.com", "*.cdn.example.com", "pics.example.com:8443"}},
		media.WithLookup(lookup))
	cases := map[string]string{
		"ftp://images.example.com/a.png":              "ftp: URLs are not fetched",
		"file:///etc/passwd":                          "file: URLs are not fetched",
		"http://user:pw@images.example.com/a.png":     "credentials",
		"http://other.example.com/a.png":              "other.example.com:80 is not an allowed image host",
		"http://images.example.com:8080/a.png":        "images.example.com:8080 is not an allowed",
		"http://cdn.example.com/a.png":                "cdn.example.com:80 is not an allowed", // *. is below, not the name
		"http://evilcdn.example.com/a.png":            "not an allowed",
		"https://pics.example.com/a.png":              "pics.example.com:443 is not an allowed",
		"http://images.example.com.evil.test/a.png":   "not an allowed",
		"http:///a.png":                               "without a host",
		"http://images.example.com/a.png":             "no such host", // allowed; the test resolver knows no such name
		"https://x.cdn.example.com/a.png":             "no such host",
		"https://pics.example.com:8443/a.png":         "no such host",
		"http://[::1]%25eth0/":                        "invalid port",
		"http://images.example.com\x00.evil.test/a.p": "invalid",
	}
	for u, want := range cases {
		_, err := f.Fetch(context.Background(), u)
		if !errors.Is(err, media.ErrRemote) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want ErrRemote saying %q", u, err, want)
		}
	}
}

// A fetch from an allowed host succeeds; every redirect is checked again (its host, its resolved address), and
// sizes and time are capped.
func TestFetchRedirectsSizesAndTime(t *testing.T) {
	png := encodePNG(t, pattern(5, 3))
	evil := serve(t, func(w http.ResponseWriter, r *http.Request) { w.Write(png) })
	stall := make(chan struct{})
	defer close(stall)
	good := serve(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/cat.png":
			w.Write(png)
		case "/to-evil":
			http.Redirect(w, r, "http://evil.test:"+evil.port+"/", http.StatusFound)
		case "/to-loopback":
			http.Redirect(w, r, "http://127.0.0.1:"+evil.port+"/", http.StatusFound)
		case "/to-elsewhere":
			http.Redirect(w, r, "http://other.example.com/", http.StatusFound)
		case "/to-file":
			http.Redirect(w, r, "file:///etc/passwd", http.StatusFound)
		case "/to-self":
			http.Redirect(w, r, "/cat.png", http.StatusFound)
		case "/loop":
			http.Redirect(w, r, "/loop", http.StatusFound)
		case "/big":
			w.Write(bytes.Repeat([]byte{0}, 101))
		case "/big-chunked":
			for range 101 {
				w.Write([]byte{0})
				w.(http.Flusher).Flush()
			}
		case "/missing":
			http.NotFound(w, r)
		case "/stall":
			<-stall
		}
	})
	// good.test resolves to loopback: the exemption stands in for a public address, for good's port only.
	policy := media.FetchPolicy{Allow: []string{"good.test:" + good.port, "evil.test:" + evil.port, "127.0.0.1:" + evil.port}, MaxBytes: 100}
	f := media.NewFetcher(policy, media.WithLookup(lookup), media.WithExempt(good.addr))
	base := "http://good.test:" + good.port

	policy.MaxBytes = 1 << 20
	big := media.NewFetcher(policy, media.WithLookup(lookup), media.WithExempt(good.addr))
	for _, path := range []string{"/cat.png", "/to-self"} {
		got, err := big.Fetch(context.Background(), base+path)
		if err != nil || !bytes.Equal(got, png) {
			t.Errorf("%s: %d bytes, %v", path, len(got), err)
		}
	}
	cases := map[string]struct {
		want error
		says string
	}{
		"/to-evil":      {media.ErrRemote, "loopback address (evil.test resolves to it)"},
		"/to-loopback":  {media.ErrRemote, "loopback"},
		"/to-elsewhere": {media.ErrRemote, "redirect: remote image refused: other.example.com:80 is not an allowed image host"},
		"/to-file":      {media.ErrRemote, "file: URLs are not fetched"},
		"/loop":         {media.ErrRemote, "more than 3 redirects"},
		"/big":          {media.ErrTooLarge, "101 bytes, more than 100"},
		"/big-chunked":  {media.ErrTooLarge, "more than 100 bytes"},
		"/missing":      {media.ErrRemote, "404"},
	}
	for path, c := range cases {
		_, err := f.Fetch(context.Background(), base+path)
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v; want %v saying %q", path, err, c.want, c.says)
		}
	}
	if evil.hits.Load() != 0 {
		t.Errorf("the loopback server got %d requests through redirects", evil.hits.Load())
	}
	// A server that never answers is given up on. (The limit is the test's subject; the server never answers, so no
	// machine is slow enough to pass it.)
	policy.Timeout = 200 * time.Millisecond
	slow := media.NewFetcher(policy, media.WithLookup(lookup), media.WithExempt(good.addr))
	if _, err := slow.Fetch(context.Background(), base+"/stall"); !errors.Is(err, media.ErrRemote) || !strings.Contains(err.Error(), "within") {
		t.Errorf("a stalled server: %v", err)
	}
}
