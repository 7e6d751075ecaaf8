package web

import (
	"net"
	"net/http"
	"testing"
)

// TestClientKeyGroupsIPv6By64: every per-client limit keys on clientKey,
// which is an IPv4 address whole and an IPv6 address's /64, so a host
// cannot become 2^64 clients by picking addresses in its prefix.
func TestClientKeyGroupsIPv6By64(t *testing.T) {
	for _, tc := range []struct{ remote, want string }{
		{"192.0.2.7:5000", "192.0.2.7"},
		{"[2001:db8:1:2:3:4:5:6]:443", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:ffff:ffff:ffff:ffff]:1", "2001:db8:1:2::/64"},
		{"[2001:db8:1:3::1]:1", "2001:db8:1:3::/64"},
		{"[::1]:8000", "::/64"},
		{"[fe80::1%eth0]:80", "fe80::/64"},
		{"[::ffff:192.0.2.7]:80", "192.0.2.7"}, // IPv4-mapped: the IPv4 client
		{"@", "@"},                             // a unix socket's peer: its own key
	} {
		r := &http.Request{RemoteAddr: tc.remote}
		if got := clientKey(r); got != tc.want {
			t.Errorf("clientKey(%q) = %q, want %q", tc.remote, got, tc.want)
		}
		// The per-address TCP cap keys a connection the same way.
		if got := connKey(peerConn{remote: tc.remote}); got != tc.want {
			t.Errorf("connKey(%q) = %q, want %q", tc.remote, got, tc.want)
		}
	}
}

// peerConn is a connection that only knows its peer's address.
type peerConn struct {
	net.Conn
	remote string
}

func (c peerConn) RemoteAddr() net.Addr { return textAddr(c.remote) }

type textAddr string

func (a textAddr) Network() string { return "tcp" }
func (a textAddr) String() string  { return string(a) }
