package web

import (
	"net"
	"net/http"
	"net/netip"
)

// ipv6ClientBits is the prefix that names one IPv6 client: a /64 is what
// one subscriber (one LAN) gets, and a host picks its addresses in it at
// will, so counting whole addresses would count one client 2^64 times.
const ipv6ClientBits = 64

// clientKey names the client a request comes from, for every per-client
// limit (open connections, sessions created and held): its IPv4 address, or
// its IPv6 /64 ("2001:db8:1:2::/64"). The address is the TCP peer's; no
// forwarding header is trusted. An IPv4-mapped IPv6 address is its IPv4
// address.
func clientKey(r *http.Request) string { return remoteKey(r.RemoteAddr) }

// remoteKey is clientKey for a peer's host:port (a request's RemoteAddr, a
// connection's RemoteAddr().String()).
func remoteKey(hostport string) string {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	return addrKey(host)
}

// addrKey is clientKey for one address as text; text that is not an
// address is its own key.
func addrKey(host string) string {
	a, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	a = a.Unmap().WithZone("")
	if a.Is4() {
		return a.String()
	}
	p, err := a.Prefix(ipv6ClientBits)
	if err != nil {
		return a.String()
	}
	return p.String()
}
