package media

import (
	"fmt"
	"net/netip"
)

// blockedPrefixes are the address ranges a remote image is never fetched from, beyond what netip.Addr's own
// predicates name (loopback, private, link-local, multicast, unspecified): ranges that reach this host, its network
// or a cloud's metadata service, or that are not public.
var blockedPrefixes = []struct {
	prefix netip.Prefix
	why    string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "a this-network address"},
	{netip.MustParsePrefix("100.64.0.0/10"), "a shared (carrier-grade NAT) address"}, // Alibaba's metadata is 100.100.100.200
	{netip.MustParsePrefix("192.0.0.0/24"), "an IETF protocol address"},
	{netip.MustParsePrefix("192.0.2.0/24"), "a documentation address"},
	{netip.MustParsePrefix("198.18.0.0/15"), "a benchmarking address"},
	{netip.MustParsePrefix("198.51.100.0/24"), "a documentation address"},
	{netip.MustParsePrefix("203.0.113.0/24"), "a documentation address"},
	{netip.MustParsePrefix("240.0.0.0/4"), "a reserved address"},
	{netip.MustParsePrefix("::/96"), "an IPv4-compatible address"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "a local NAT64 address"},
	{netip.MustParsePrefix("100::/64"), "a discard address"},
	{netip.MustParsePrefix("2001::/32"), "a Teredo address"},
	{netip.MustParsePrefix("2001:db8::/32"), "a documentation address"},
	{netip.MustParsePrefix("fec0::/10"), "a site-local address"},
}

var (
	nat64   = netip.MustParsePrefix("64:ff9b::/96")
	sixTo4  = netip.MustParsePrefix("2002::/16")
	awsIMDS = netip.MustParseAddr("fd00:ec2::254")
	imds    = netip.MustParseAddr("169.254.169.254")
)

// CheckAddr returns nil when a is a public unicast address that a remote image may be fetched from, and otherwise
// an error (ErrRemote) that says what a is: loopback, private, link-local (cloud metadata services live there),
// multicast, or another range that is not public. An IPv4 address inside IPv6 (mapped, NAT64, 6to4) is judged as
// the IPv4 address it carries.
func CheckAddr(a netip.Addr) error {
	if why := blockedWhy(a); why != "" {
		return fmt.Errorf("%w: %s is %s", ErrRemote, a, why)
	}
	return nil
}

func blockedWhy(a netip.Addr) string {
	if !a.IsValid() {
		return "not an address"
	}
	a = a.Unmap()
	if a.Is6() {
		b := a.As16()
		switch {
		case nat64.Contains(a):
			return blockedWhy(netip.AddrFrom4([4]byte(b[12:16])))
		case sixTo4.Contains(a):
			return blockedWhy(netip.AddrFrom4([4]byte(b[2:6])))
		}
	}
	switch {
	case a == imds || a == awsIMDS:
		return "a cloud metadata address"
	case a.IsLoopback():
		return "a loopback address"
	case a.IsUnspecified():
		return "the unspecified address"
	case a.IsPrivate():
		return "a private address"
	case a.IsLinkLocalUnicast():
		return "a link-local address"
	case a.IsMulticast(), a.IsLinkLocalMulticast(), a.IsInterfaceLocalMulticast():
		return "a multicast address"
	case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "the broadcast address"
	}
	for _, p := range blockedPrefixes {
		if p.prefix.Contains(a) {
			return p.why
		}
	}
	return ""
}
