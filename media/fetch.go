package media

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Fetching an image URL on a client's behalf is how servers are made to reach what only they can reach (their
// loopback, their network, a cloud's metadata service). So a Fetcher fetches only when its policy names hosts, only
// from those hosts, and judges the address of every connection after DNS resolution: it resolves the name itself,
// refuses the addresses CheckAddr refuses, and dials the very address it checked (so a name that resolves
// differently a moment later, DNS rebinding, changes nothing); the dialer checks the address again at connect time.
// Every redirect is a new request under the same rules. Proxies from the environment are not used (a proxy would
// reach the addresses on the Fetcher's behalf). The whole fetch, redirects included, is bounded in time and bytes.

// Fetch defaults.
const (
	DefaultFetchTimeout = 10 * time.Second
	DefaultMaxRedirects = 3
	// maxHeaderBytes bounds a response's headers.
	maxHeaderBytes = 64 << 10
)

// FetchPolicy says whether and where remote image URLs are fetched. The zero value fetches nothing.
type FetchPolicy struct {
	// Allow are the hosts images may come from: "images.example.com", "*.example.com" (any name under it, not the
	// name itself), each with an optional ":port"; without one, only the scheme's default port. Empty: no URL is
	// fetched (ErrRemoteOff).
	Allow        []string
	MaxBytes     int64         // bytes per image (default DefaultMaxBytes)
	Timeout      time.Duration // the whole fetch, redirects included (default DefaultFetchTimeout)
	MaxRedirects int           // default DefaultMaxRedirects
}

// Fetcher fetches remote images under a FetchPolicy. Safe for concurrent use.
type Fetcher struct {
	policy FetchPolicy
	client *http.Client
	lookup func(ctx context.Context, host string) ([]netip.Addr, error)
	// exempt lets one address through CheckAddr (tests serve the "remote" host on loopback); nil in the server.
	exempt func(netip.AddrPort) bool
}

// FetchOption configures a Fetcher.
type FetchOption func(*Fetcher)

// WithLookup sets how host names are resolved (default: the system resolver).
func WithLookup(lookup func(ctx context.Context, host string) ([]netip.Addr, error)) FetchOption {
	return func(f *Fetcher) { f.lookup = lookup }
}

// NewFetcher returns a Fetcher for p.
func NewFetcher(p FetchPolicy, opts ...FetchOption) *Fetcher {
	if p.MaxBytes <= 0 {
		p.MaxBytes = DefaultMaxBytes
	}
	if p.Timeout <= 0 {
		p.Timeout = DefaultFetchTimeout
	}
	if p.MaxRedirects <= 0 {
		p.MaxRedirects = DefaultMaxRedirects
	}
	f := &Fetcher{policy: p, lookup: func(ctx context.Context, host string) ([]netip.Addr, error) {
		return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	}}
	for _, o := range opts {
		o(f)
	}
	tr := &http.Transport{
		Proxy:                  nil,
		DialContext:            f.dial,
		TLSHandshakeTimeout:    p.Timeout,
		ResponseHeaderTimeout:  p.Timeout,
		MaxResponseHeaderBytes: maxHeaderBytes,
		MaxIdleConns:           16,
		IdleConnTimeout:        30 * time.Second,
		ForceAttemptHTTP2:      true,
	}
	f.client = &http.Client{Transport: tr, CheckRedirect: f.checkRedirect}
	return f
}

// Enabled reports whether the policy fetches anything.
func (f *Fetcher) Enabled() bool { return f != nil && len(f.policy.Allow) > 0 }

// Fetch returns the body of the image at rawURL, an http or https URL on an allowed host. A refusal wraps
// ErrRemoteOff (no hosts are allowed), ErrRemote (the URL, a redirect, an address, the status) or ErrTooLarge. The
// body is not checked as an image: Limits.Check does that.
func (f *Fetcher) Fetch(ctx context.Context, rawURL string) ([]byte, error) {
	if !f.Enabled() {
		return nil, fmt.Errorf("%w: only data: URLs are accepted", ErrRemoteOff)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrRemote, err)
	}
	if err := f.checkURL(u); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, f.policy.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrRemote, err)
	}
	req.Header.Set("Accept", "image/png, image/jpeg, image/webp, image/gif")
	resp, err := f.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL is the client's own
		}
		if errors.Is(err, ErrRemote) {
			return nil, err
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("%w: no answer within %v", ErrRemote, f.policy.Timeout)
		}
		return nil, fmt.Errorf("%w: %v", ErrRemote, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%w: the server answered %s", ErrRemote, resp.Status)
	}
	if resp.ContentLength > f.policy.MaxBytes {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", ErrTooLarge, resp.ContentLength, f.policy.MaxBytes)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, f.policy.MaxBytes+1))
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("%w: the image did not arrive within %v", ErrRemote, f.policy.Timeout)
		}
		return nil, fmt.Errorf("%w: read the image: %v", ErrRemote, err)
	}
	if int64(len(body)) > f.policy.MaxBytes {
		return nil, fmt.Errorf("%w: more than %d bytes", ErrTooLarge, f.policy.MaxBytes)
	}
	return body, nil
}

// checkURL refuses a URL that is not http(s), that carries credentials, or whose host and port the policy does not
// allow.
func (f *Fetcher) checkURL(u *url.URL) error {
	scheme := strings.ToLower(u.Scheme)
	if scheme != "http" && scheme != "https" {
		return fmt.Errorf("%w: %s: URLs are not fetched", ErrRemote, scheme)
	}
	if u.User != nil {
		return fmt.Errorf("%w: a URL with credentials", ErrRemote)
	}
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	if host == "" {
		return fmt.Errorf("%w: a URL without a host", ErrRemote)
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[scheme]
	}
	if !f.allowed(host, port, scheme) {
		return fmt.Errorf("%w: %s is not an allowed image host", ErrRemote, net.JoinHostPort(host, port))
	}
	return nil
}

// allowed reports whether an Allow entry names host (lower case, no trailing dot) and port.
func (f *Fetcher) allowed(host, port, scheme string) bool {
	defaultPort := map[string]string{"http": "80", "https": "443"}[scheme]
	for _, e := range f.policy.Allow {
		e = strings.ToLower(strings.TrimSpace(e))
		eh, ep := e, defaultPort
		if h, p, err := net.SplitHostPort(e); err == nil {
			eh, ep = h, p
		}
		eh = strings.TrimSuffix(eh, ".")
		if ep != port {
			continue
		}
		if suffix, ok := strings.CutPrefix(eh, "*."); ok {
			if strings.HasSuffix(host, "."+suffix) {
				return true
			}
			continue
		}
		if host == eh {
			return true
		}
	}
	return false
}

// checkRedirect applies the policy to every redirect: its URL, and a limit on how many.
func (f *Fetcher) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) > f.policy.MaxRedirects {
		return fmt.Errorf("%w: more than %d redirects", ErrRemote, f.policy.MaxRedirects)
	}
	if via[len(via)-1].URL.Scheme == "https" && req.URL.Scheme != "https" {
		return fmt.Errorf("%w: a redirect from https to %s", ErrRemote, req.URL.Scheme)
	}
	if err := f.checkURL(req.URL); err != nil {
		return fmt.Errorf("redirect: %w", err)
	}
	return nil
}

// dial resolves addr's host, drops the addresses CheckAddr refuses, and connects to the first of the rest that
// answers; the dialer's Control checks the connected address once more.
func (f *Fetcher) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("%w: port %q", ErrRemote, portStr)
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else if addrs, err = f.lookup(ctx, host); err != nil {
		return nil, fmt.Errorf("%w: resolve %s: %v", ErrRemote, host, err)
	}
	d := net.Dialer{Control: f.control}
	var firstErr error
	for _, a := range addrs {
		ap := netip.AddrPortFrom(a.Unmap(), uint16(port))
		if err := f.check(ap); err != nil {
			firstErr = cmpErr(firstErr, fmt.Errorf("%w (%s resolves to it)", err, host))
			continue
		}
		c, err := d.DialContext(ctx, network, ap.String())
		if err == nil {
			return c, nil
		}
		firstErr = cmpErr(firstErr, err)
	}
	if firstErr == nil {
		firstErr = fmt.Errorf("%w: %s has no address", ErrRemote, host)
	}
	return nil, firstErr
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// control is the dialer's last check, on the address the socket connects to.
func (f *Fetcher) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: connect to %q", ErrRemote, address)
	}
	return f.check(ap)
}

func (f *Fetcher) check(ap netip.AddrPort) error {
	if f.exempt != nil && f.exempt(ap) {
		return nil
	}
	return CheckAddr(ap.Addr())
}
