package media

import "net/netip"

// DecodeRGB is the child's decode, in process, for the fuzz target.
var DecodeRGB = decodeRGB

// Started is how many children the decoder has started.
func (s *Decoder) Started() int64 { return s.pool.Started() }

// WithExempt lets one address through the address check: the tests' "remote" host is served on loopback.
func WithExempt(ap netip.AddrPort) FetchOption {
	return func(f *Fetcher) { f.exempt = func(a netip.AddrPort) bool { return a == ap } }
}
