package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parley-chat/parley/internal/testbin"
)

// TestStoreBurstOneClient: one client creating conversations of 1 MiB
// each as fast as it can, on the bbolt store with the default budget
// (1 GiB) and share (a tenth): past about 102 MiB its creations are refused
// with 507 store_full naming the limit, the file stops growing, and
// another client still stores.
func TestStoreBurstOneClient(t *testing.T) {
	if testing.Short() {
		t.Skip("sends about 120 MiB")
	}
	const mib = 1 << 20
	bin := testbin.Parley(t)
	data := t.TempDir()
	// No creation rate: the burst is of bytes, past what 30 sessions a
	// minute would let through.
	s := start(t, bin, "--data-dir", data, "--session-creates-per-minute", "0")
	path := filepath.Join(data, "sessions.db")
	size := func() int64 {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return st.Size()
	}
	before := size()
	item := strings.Repeat("Lily had a red ball. ", mib/21-10)
	body, _ := json.Marshal(map[string]any{"items": []map[string]any{{"type": "message", "role": "user", "content": item}}})
	create := func(client *http.Client) (int, string) {
		res, err := client.Post("http://"+s.addr+"/v1/conversations", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		return res.StatusCode, string(b)
	}
	stored, status, msg := 0, 0, ""
	for range 120 {
		if status, msg = create(http.DefaultClient); status != http.StatusOK {
			break
		}
		stored++
	}
	after := size()
	t.Logf("one client: %d conversations of 1 MiB stored, then %d %s; sessions.db %.1f -> %.1f MiB", stored, status, msg, float64(before)/mib, float64(after)/mib)
	if status != http.StatusInsufficientStorage || !strings.Contains(msg, "store_full") || !strings.Contains(msg, "one client may hold") {
		t.Fatalf("after %d conversations: %d %s, want 507 store_full naming the client's share", stored, status, msg)
	}
	if stored > 103 || after-before > 160*mib {
		t.Fatalf("one client stored %d MiB (file +%d MiB); its share is about 102 MiB", stored, (after-before)/mib)
	}
	if st, _ := create(http.DefaultClient); st != http.StatusInsufficientStorage {
		t.Fatalf("a second try: %d", st)
	}
	m := metricsText(t, s.addr)
	for _, want := range []string{"parley_store_budget_bytes 1.073741824e+09", `parley_store_writes_refused_total{reason="client_share"} 2`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func metricsText(t *testing.T, addr string) string {
	t.Helper()
	res, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return string(b)
}
