package web_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gorilla/websocket"
)

// BenchmarkWSStream streams 256-token replies over WebSockets in text mode
// through the real stack (engine, chat, session, writer), from 1 and from 8
// concurrent sessions, one turn per session and iteration, to profile the
// per-token path:
//
//	go test -run XXX -bench WSStream -cpuprofile cpu.out ./web/
func BenchmarkWSStream(b *testing.B) {
	for _, n := range []int{1, 8} {
		b.Run(fmt.Sprintf("sessions=%d", n), func(b *testing.B) {
			s := openStack(b, stackOpts{parallel: n, maxTokens: 256})
			var tokens atomic.Int64
			b.ResetTimer()
			for range b.N {
				var wg sync.WaitGroup
				for range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						ws := dial(b, s.url, nil)
						defer ws.Close()
						if err := ws.WriteMessage(websocket.TextMessage, []byte("Once upon a time")); err != nil {
							b.Error(err)
							return
						}
						tokens.Add(int64(len(readReply(b, ws))))
					}()
				}
				wg.Wait()
			}
			b.ReportMetric(float64(tokens.Load())/b.Elapsed().Seconds(), "pieces/s")
		})
	}
}
