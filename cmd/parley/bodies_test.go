package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parley-chat/parley/internal/testbin"
)

// rssBytes is the resident set size of process pid (VmRSS).
func rssBytes(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// unfinishedBodies opens n connections, spread over addresses 127.0.0.2 and
// up (perAddr each), each announcing a body of size bytes and sending all of
// it but the last byte, and waits until the server has had time to read
// what it accepts. It returns the connections, still open.
func unfinishedBodies(t *testing.T, addr string, n, perAddr, size int) []net.Conn {
	t.Helper()
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	for i := range n {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1+byte(i/perAddr/250), 2+byte(i/perAddr%250))}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
		wg.Go(func() {
			fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", addr, size)
			c.SetWriteDeadline(time.Now().Add(10 * time.Second))
			c.Write(make([]byte, size-1)) // a refused body is not read: the write may fail
		})
	}
	wg.Wait()
	// Room for the server to read what it accepted before RSS is read: on a
	// busy machine it may have read less, which only lowers the growth the
	// test bounds from above (it cannot fail the test).
	time.Sleep(time.Second)
	return conns
}

// refusedCount waits until at least want of conns have been refused (503 or
// 429: over the body budget, answered before the body is read) rather than
// left waiting for the rest of their body, and returns how many were by
// then. It waits for the answers, not for a time: the read
// deadline only catches a server that never answers. The accepted bodies
// are answered only at the body timeout (60 s), and not as refusals.
func refusedCount(conns []net.Conn, want int) int {
	if want <= 0 {
		return 0
	}
	refused := make(chan bool, len(conns))
	for _, c := range conns {
		go func() {
			c.SetReadDeadline(time.Now().Add(2 * time.Minute))
			line, err := bufio.NewReader(c).ReadString('\n')
			refused <- err == nil && (strings.HasPrefix(line, "HTTP/1.1 503 ") || strings.HasPrefix(line, "HTTP/1.1 429 "))
		}()
	}
	n := 0
	for range conns {
		if <-refused {
			if n++; n == want {
				break
			}
		}
	}
	return n // the readers still waiting end when the caller closes conns
}

// TestUnfinishedBodiesRSS: 120 clients from 30 addresses each announce a
// 1 MiB body and send all of it but the last byte. The server's resident
// memory grows by about the body budget (16 MiB here), not by the 120 MiB
// the bodies would take, because bodies past the budget are refused before
// they are read; and after the clients go, the memory is given back.
func TestUnfinishedBodiesRSS(t *testing.T) {
	const mib = 1 << 20
	bin := testbin.Parley(t)
	for _, tc := range []struct {
		name   string
		budget int64
		check  bool
	}{
		{"budget 16 MiB", 16 * mib, true},
		{"no budget", 1 << 40, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !tc.check && testing.Short() {
				t.Skip("the comparison without a budget only reports figures")
			}
			s := start(t, bin, "--store", "memory", "--body-timeout", "60s",
				"--max-body-bytes-inflight", strconv.FormatInt(tc.budget, 10), "--max-http-conns-per-ip", "1000")
			pid := s.Cmd.Process.Pid
			base := rssBytes(t, pid)
			conns := unfinishedBodies(t, s.addr, 120, 4, mib)
			held := rssBytes(t, pid)
			want := 0
			if tc.check {
				want = 120 - int(tc.budget/mib)
			}
			refused := refusedCount(conns, want)
			for _, c := range conns {
				c.Close()
			}
			var after int64
			deadline := time.Now().Add(time.Minute) // polls for the event; the bound catches a hang
			for {
				time.Sleep(500 * time.Millisecond)
				if after = rssBytes(t, pid); after < base+8*mib || time.Now().After(deadline) {
					break
				}
			}
			growth := held - base
			t.Logf("%s: RSS %.1f MiB at rest, %.1f MiB with 120 unfinished 1 MiB bodies (+%.1f MiB, %.0f KiB per body; %d refused), %.1f MiB after they closed",
				tc.name, float64(base)/mib, float64(held)/mib, float64(growth)/mib, float64(growth)/1024/120, refused, float64(after)/mib)
			if !tc.check {
				return
			}
			if growth > 3*tc.budget {
				t.Fatalf("RSS grew by %d MiB with a body budget of %d MiB", growth/mib, tc.budget/mib)
			}
			if after > base+tc.budget/2 {
				t.Fatalf("RSS did not come back after the bodies closed: %d MiB at rest, %d MiB after", base/mib, after/mib)
			}
			if refused < want {
				t.Fatalf("only %d of 120 bodies refused with room for %d", refused, tc.budget/mib)
			}
		})
	}
}
