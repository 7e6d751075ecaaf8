package mcp_test

import (
	"net/netip"
	"testing"

	"github.com/parley-chat/parley/mcp"
)

func TestPublicAddress(t *testing.T) {
	for addr, want := range map[string]bool{
		"8.8.8.8":                true,
		"2606:4700::1111":        true,
		"127.0.0.1":              false,
		"10.1.2.3":               false,
		"172.16.0.1":             false,
		"192.168.1.1":            false,
		"169.254.169.254":        false, // cloud metadata
		"100.64.0.1":             false, // carrier NAT
		"0.0.0.0":                false,
		"224.0.0.1":              false,
		"255.255.255.255":        false,
		"::1":                    false,
		"::":                     false,
		"fe80::1":                false,
		"fd00:ec2::254":          false, // AWS metadata over IPv6
		"::ffff:127.0.0.1":       false, // mapped
		"::ffff:169.254.169.254": false,
		"64:ff9b::a9fe:a9fe":     false, // NAT64 of 169.254.169.254
		"64:ff9b::808:808":       true,  // NAT64 of 8.8.8.8
		"2002:7f00:1::":          false, // 6to4 of 127.0.0.1
	} {
		if got := mcp.PublicAddress(netip.MustParseAddr(addr)); got != want {
			t.Errorf("PublicAddress(%s) = %v, want %v", addr, got, want)
		}
	}
}
