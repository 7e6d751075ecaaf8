package web_test

// Background responses: created with background: true, fetched while they
// run (in_progress), their event stream resumed after a sequence number,
// and cancelled.

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/parley-chat/parley/chat"
	"github.com/parley-chat/parley/llm"
	"github.com/parley-chat/parley/web"
)

// openPacedAPI is the API stack on the paced engine (resume_test.go).
func openPacedAPI(tb testing.TB, gap time.Duration, mod ...func(*web.Config)) *stack {
	cfg := func(c *web.Config) {
		for _, m := range mod {
			m(c)
		}
	}
	return openStack(tb, stackOpts{maxTokens: 24, maxTokensCap: 480, tokenizer: true, cfg: cfg,
		generator: func(e *llm.Engine) chat.Generator { return &pacedGenerator{Engine: e, gap: gap} },
		options: func(s *stack) []web.Option {
			return []web.Option{web.WithResponder(s.responder), web.WithModelInfo(s.engine.Info)}
		}})
}

type bgObject struct {
	ID         string `json:"id"`
	Status     string `json:"status"`
	Background bool   `json:"background"`
	Output     []struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
}

func (o bgObject) text() string {
	if len(o.Output) == 0 || len(o.Output[0].Content) == 0 {
		return ""
	}
	return o.Output[0].Content[0].Text
}

type bgEvent struct {
	Type  string
	Seq   int
	Delta string
	Resp  bgObject
}

// readEvents reads a Responses event stream to its end.
func readEvents(tb testing.TB, r io.Reader) []bgEvent {
	tb.Helper()
	var out []bgEvent
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type     string   `json:"type"`
			Seq      *int     `json:"sequence_number"`
			Delta    string   `json:"delta"`
			Response bgObject `json:"response"`
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil || ev.Seq == nil {
			tb.Fatalf("event %q: %v (a sequence_number is required)", line, err)
		}
		out = append(out, bgEvent{Type: ev.Type, Seq: *ev.Seq, Delta: ev.Delta, Resp: ev.Response})
	}
	return out
}

func getJSON(tb testing.TB, url string, v any) {
	tb.Helper()
	res, err := http.Get(url)
	if err != nil {
		tb.Fatal(err)
	}
	defer res.Body.Close()
	decodeBody(tb, res, http.StatusOK, v)
}

func TestBackgroundResponseResumesItsStream(t *testing.T) {
	s := openPacedAPI(t, 4*time.Millisecond)
	var created bgObject
	decodeBody(t, post(t, s.base+"/v1/responses", map[string]any{"input": "Once upon a time", "background": true, "max_output_tokens": 150}), http.StatusOK, &created)
	if created.Status != "in_progress" || !created.Background || created.ID == "" {
		t.Fatalf("created: %+v", created)
	}
	var running bgObject
	getJSON(t, s.base+"/v1/responses/"+created.ID, &running)
	if running.Status != "in_progress" {
		t.Fatalf("GET while it runs: %+v", running)
	}

	// The stream from its start, then resumed after event 5: the same
	// events from 6 on, numbered alike.
	res, err := http.Get(s.base + "/v1/responses/" + created.ID + "?stream=true")
	if err != nil {
		t.Fatal(err)
	}
	all := readEvents(t, res.Body)
	res.Body.Close()
	res, err = http.Get(s.base + "/v1/responses/" + created.ID + "?stream=true&starting_after=5")
	if err != nil {
		t.Fatal(err)
	}
	tail := readEvents(t, res.Body)
	res.Body.Close()
	for i, ev := range all {
		if ev.Seq != i {
			t.Fatalf("event %d (%s) has sequence_number %d", i, ev.Type, ev.Seq)
		}
	}
	if len(all) < 10 || len(tail) != len(all)-6 || tail[0].Seq != 6 {
		t.Fatalf("%d events; resumed after 5: %d events from %+v", len(all), len(tail), tail[0])
	}
	last := all[len(all)-1]
	if last.Type != "response.incomplete" && last.Type != "response.completed" {
		t.Fatalf("the stream ends with %s", last.Type)
	}
	var text strings.Builder
	for _, ev := range all {
		text.WriteString(ev.Delta)
	}
	var done bgObject
	getJSON(t, s.base+"/v1/responses/"+created.ID, &done)
	if done.Status == "in_progress" || done.text() == "" || done.text() != text.String() {
		t.Fatalf("after the end: status %s, text %q; the deltas made %q", done.Status, done.text(), text.String())
	}
}

func TestBackgroundResponseCancel(t *testing.T) {
	s := openPacedAPI(t, 5*time.Millisecond)
	var created bgObject
	decodeBody(t, post(t, s.base+"/v1/responses", map[string]any{"input": "Once upon a time", "background": true, "max_output_tokens": 400}), http.StatusOK, &created)
	time.Sleep(100 * time.Millisecond) // a few tokens first (none is fine too)
	start := time.Now()
	var cancelled bgObject
	decodeBody(t, post(t, s.base+"/v1/responses/"+created.ID+"/cancel", nil), http.StatusOK, &cancelled)
	// Cancelled, not run to its end: the status says which (its time is the
	// machine's; a cancel that waited for the 400 paced tokens would not
	// say cancelled).
	if cancelled.Status != "cancelled" || time.Since(start) > hangWait {
		t.Fatalf("cancel took %v: %+v", time.Since(start), cancelled)
	}
	s.waitIdle(t)

	// A response that is not a background one cannot be cancelled.
	var plain bgObject
	decodeBody(t, post(t, s.base+"/v1/responses", map[string]any{"input": "Hi", "max_output_tokens": 4}), http.StatusOK, &plain)
	if res := post(t, s.base+"/v1/responses/"+plain.ID+"/cancel", nil); res.StatusCode != http.StatusBadRequest {
		t.Fatalf("cancel of a finished foreground response: %d", res.StatusCode)
	}
	// background needs store.
	if res := post(t, s.base+"/v1/responses", map[string]any{"input": "Hi", "background": true, "store": false}); res.StatusCode != http.StatusBadRequest {
		t.Fatalf("background with store false: %d", res.StatusCode)
	}
}

// TestBackgroundResponsesCountAgainstTheClient: each running background
// response holds a connection admission of its client, so a client cannot
// park more of them than it may hold connections.
func TestBackgroundResponsesCountAgainstTheClient(t *testing.T) {
	s := openPacedAPI(t, 5*time.Millisecond, func(c *web.Config) { c.MaxConnsPerIP = 2 })
	req := map[string]any{"input": "Once upon a time", "background": true, "max_output_tokens": 400}
	var ids []string
	for range 2 {
		var o bgObject
		decodeBody(t, post(t, s.base+"/v1/responses", req), http.StatusOK, &o)
		ids = append(ids, o.ID)
	}
	if res := post(t, s.base+"/v1/responses", req); res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a third background response: %d, want 429", res.StatusCode)
	}
	var o bgObject
	decodeBody(t, post(t, s.base+"/v1/responses/"+ids[0]+"/cancel", nil), http.StatusOK, &o)
	decodeBody(t, post(t, s.base+"/v1/responses", req), http.StatusOK, &o) // room again
	for _, id := range append(ids[1:], o.ID) {
		post(t, s.base+"/v1/responses/"+id+"/cancel", nil)
	}
}
