// Command storebench measures the session stores as the chat service uses
// them: each turn reads a session, appends a user message and a reply, and
// writes it back (the append). It reports turns per second and the append
// latency percentiles for bbolt and for Redis, over the same workload.
//
//	go run ./tools/storebench -sessions 500 -turns 20000 -workers 16
//
// Redis is the server at -redis, or, when that is empty, a redis-server it
// starts on a free loopback port with appendonly yes and appendfsync
// always (nothing acknowledged lost on a crash, like bbolt's fsync).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parley-chat/parley"
	"github.com/parley-chat/parley/internal/proc"
	"github.com/parley-chat/parley/internal/redistest"
	"github.com/parley-chat/parley/session"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "storebench:", err)
		os.Exit(1)
	}
}

type result struct {
	name          string
	turns         int
	elapsed       time.Duration
	p50, p99, max time.Duration
	conflicts     int64
}

func run() error {
	sessions := flag.Int("sessions", 500, "sessions written to")
	turns := flag.Int("turns", 10000, "turns in all")
	workers := flag.Int("workers", 16, "concurrent writers (sessions are spread over them)")
	msgBytes := flag.Int("msg-bytes", 200, "bytes of each message")
	redisURL := flag.String("redis", "", "redis://HOST:PORT/DB to use (default: start redis-server)")
	flag.Parse()

	dir, err := os.MkdirTemp("", "storebench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	bolt, err := session.OpenBoltStore(filepath.Join(dir, "sessions.db"))
	if err != nil {
		return err
	}
	results := []result{}
	r, err := bench("bbolt", bolt, *sessions, *turns, *workers, *msgBytes)
	bolt.Close()
	if err != nil {
		return err
	}
	results = append(results, r)

	if *redisURL == "" {
		stop, url, err := startRedis(dir)
		if err != nil {
			return err
		}
		defer stop()
		*redisURL = url
	}
	rs, err := session.OpenRedisStore(context.Background(), *redisURL, "storebench:")
	if err != nil {
		return err
	}
	r, err = bench("redis", rs, *sessions, *turns, *workers, *msgBytes)
	rs.Close()
	if err != nil {
		return err
	}
	results = append(results, r)

	fmt.Printf("%d sessions, %d turns, %d workers, %d-byte messages (history capped at %d bytes)\n\n",
		*sessions, *turns, *workers, *msgBytes, session.DefaultMaxBytes)
	fmt.Println("| store | turns/s | append p50 | append p99 | append max | conflicts |")
	fmt.Println("|---|---:|---:|---:|---:|---:|")
	for _, r := range results {
		fmt.Printf("| %s | %.0f | %s | %s | %s | %d |\n", r.name, float64(r.turns)/r.elapsed.Seconds(),
			r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), r.max.Round(time.Microsecond), r.conflicts)
	}
	return nil
}

// bench runs turns over sessions: worker w owns the sessions i with
// i % workers == w, as the session lock makes one writer per session.
func bench(name string, st session.Store, sessions, turns, workers, msgBytes int) (result, error) {
	ctx := context.Background()
	ids := make([]string, sessions)
	for i := range ids {
		id, err := session.NewID()
		if err != nil {
			return result{}, err
		}
		ids[i] = id
	}
	text := strings.Repeat("x", msgBytes)
	lat := make([][]time.Duration, workers)
	var conflicts atomic.Int64
	var firstErr error
	var errOnce sync.Once
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			var own []string
			for i := w; i < sessions; i += workers {
				own = append(own, ids[i])
			}
			if len(own) == 0 {
				return
			}
			for k, n := 0, w; n < turns; k, n = k+1, n+workers {
				id := own[k%len(own)]
				t0 := time.Now()
				s, err := st.Get(ctx, id)
				if parley.ErrorCode(err) == parley.ENotFound {
					s, err = &session.Session{ID: id}, nil
				}
				if err == nil {
					s.Messages = append(s.Messages, parley.Message{Role: parley.RoleUser, Content: text},
						parley.Message{Role: parley.RoleAssistant, Content: text})
					err = st.Put(ctx, s)
				}
				if err != nil {
					if err == session.ErrConflict {
						conflicts.Add(1)
						continue
					}
					errOnce.Do(func() { firstErr = fmt.Errorf("%s: %w", name, err) })
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return result{}, firstErr
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	pct := func(p float64) time.Duration { return all[min(len(all)-1, int(p*float64(len(all))))] }
	return result{name: name, turns: len(all), elapsed: elapsed, p50: pct(.50), p99: pct(.99), max: all[len(all)-1], conflicts: conflicts.Load()}, nil
}

// startRedis runs redis-server with append-only persistence fsynced on
// every write, in dir, and returns how to stop it and its URL.
func startRedis(dir string) (func(), string, error) {
	addr, err := proc.FreeAddr()
	if err != nil {
		return nil, "", err
	}
	p, err := redistest.Launch("redis-server", addr, dir, nil)
	if err != nil {
		return nil, "", fmt.Errorf("redis-server (apt-get install redis-server, or pass -redis): %w", err)
	}
	return p.Kill, "redis://" + addr + "/0", nil
}
