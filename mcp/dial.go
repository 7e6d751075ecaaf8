package mcp

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"syscall"
	"time"
)

// ErrForbiddenAddress is the error of a connection to an address the
// operator did not allow: loopback, private, link-local (the cloud metadata
// service's among them), unspecified, multicast or reserved.
var ErrForbiddenAddress = errors.New("address not allowed")

// forbiddenPrefixes are the ranges netip's predicates miss: this network,
// shared address space (carrier NAT), IETF protocol assignments, benchmark
// networks, reserved, and the NAT64 and 6to4 prefixes (checked again on
// the IPv4 address they embed).
var forbiddenPrefixes = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("240.0.0.0/4"),
}

var (
	nat64  = netip.MustParsePrefix("64:ff9b::/96")
	sixTo4 = netip.MustParsePrefix("2002::/16")
)

// PublicAddress reports whether ip is an address Parley may connect to
// without the operator's leave: not loopback, private, link-local,
// unspecified, multicast or reserved, also when an IPv6 address embeds an
// IPv4 one (mapped, NAT64, 6to4).
func PublicAddress(ip netip.Addr) bool {
	ip = ip.Unmap()
	if !ip.IsValid() || ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() ||
		ip.IsInterfaceLocalMulticast() || ip.IsMulticast() || ip.IsUnspecified() {
		return false
	}
	for _, p := range forbiddenPrefixes {
		if p.Contains(ip) {
			return false
		}
	}
	if ip.Is6() {
		b := ip.As16()
		switch {
		case nat64.Contains(ip):
			return PublicAddress(netip.AddrFrom4([4]byte(b[12:16])))
		case sixTo4.Contains(ip):
			return PublicAddress(netip.AddrFrom4([4]byte(b[2:6])))
		}
	}
	return true
}

// checkDial is a net.Dialer Control function: it runs after the name is
// resolved, on the very address the socket connects to, so a name that
// resolves to a public address when checked and a private one when used
// (DNS rebinding) is caught, and so is every redirect's target.
func checkDial(network, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return fmt.Errorf("dial %s: %w", address, err)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return fmt.Errorf("dial %s: %w", address, err)
	}
	if !PublicAddress(ip) {
		return fmt.Errorf("dial %s: %w (a loopback, private, link-local or reserved address; the operator may allow it with allow_private)", ip, ErrForbiddenAddress)
	}
	return nil
}

// maxRedirects bounds the redirects one request follows.
const maxRedirects = 3

// httpClient returns the client Parley talks to one HTTP server with:
// direct connections only (no proxy from the environment, which would
// dial in Parley's place), every dialled address checked unless
// allowPrivate, redirects only within the server's own origin (the
// headers with its secrets are added to every request), and response
// bodies other than event streams capped at maxBody bytes.
func httpClient(origin *url.URL, headers map[string]string, allowPrivate bool, maxBody int64) *http.Client {
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	if !allowPrivate {
		d.Control = checkDial
	}
	tr := &http.Transport{
		Proxy:                  nil,
		DialContext:            d.DialContext,
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           8,
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    10 * time.Second,
		ResponseHeaderTimeout:  0, // a call's context bounds it
		MaxResponseHeaderBytes: 64 << 10,
	}
	return &http.Client{
		Transport: &headerTransport{base: tr, origin: origin, headers: headers, maxBody: maxBody},
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= maxRedirects {
				return fmt.Errorf("more than %d redirects", maxRedirects)
			}
			if req.URL.Scheme != origin.Scheme || req.URL.Host != origin.Host {
				return fmt.Errorf("redirect to another origin (%s://%s) refused", req.URL.Scheme, req.URL.Host)
			}
			return nil
		},
	}
}

// headerTransport adds the server's configured headers to requests for its
// origin, and caps the bodies of responses.
type headerTransport struct {
	base    http.RoundTripper
	origin  *url.URL
	headers map[string]string
	maxBody int64
}

func (t *headerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if len(t.headers) > 0 && req.URL.Scheme == t.origin.Scheme && req.URL.Host == t.origin.Host {
		req = req.Clone(req.Context())
		for k, v := range t.headers {
			req.Header.Set(k, v)
		}
	}
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	wroteHTTP(req)
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt != "text/event-stream" && t.maxBody > 0 {
		// Event streams are capped per event by the SDK (MaxEventSize);
		// anything else is read whole, so it is capped here.
		resp.Body = &cappedBody{r: resp.Body, left: t.maxBody}
	}
	return resp, nil
}

// errBodyTooLarge ends a response body over the cap.
var errBodyTooLarge = errors.New("the server's response is over max_frame_bytes")

// cappedBody fails a read past its cap instead of truncating quietly.
type cappedBody struct {
	r    io.ReadCloser
	left int64
	over bool
}

func (b *cappedBody) Read(p []byte) (int, error) {
	if b.over {
		return 0, errBodyTooLarge
	}
	// One byte past the cap tells a body of exactly the cap from a longer one.
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.r.Read(p)
	if int64(n) > b.left {
		b.over = true
		return int(b.left), errBodyTooLarge
	}
	b.left -= int64(n)
	return n, err
}

func (b *cappedBody) Close() error { return b.r.Close() }
