package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/parley-chat/parley/internal/testbin"
)

// TestInfoNamesTheEngineThatRuns: /info's engine is the llama.cpp that
// loaded the model (the log's "model loaded" line says which), not always
// the embedded binding: the suite runs this on both engines.
func TestInfoNamesTheEngineThatRuns(t *testing.T) {
	bin := testbin.Parley(t)
	s := start(t, bin, "--store", "memory")
	res, err := http.Get("http://" + s.addr + "/info")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var info struct {
		Engine string `json:"engine"`
	}
	if err := json.NewDecoder(res.Body).Decode(&info); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("/info: %d %v", res.StatusCode, err)
	}
	var ran string
	for _, line := range strings.Split(s.log(), "\n") {
		var rec struct {
			Msg    string `json:"msg"`
			Engine string `json:"engine"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "model loaded" {
			ran = rec.Engine
		}
	}
	want := map[string]string{"current": "current llama.cpp (ggml ", "embedded": "github.com/ollama/ollama/llama "}[ran]
	if want == "" || !strings.HasPrefix(info.Engine, want) {
		t.Fatalf("the %q engine ran; /info says %q, want it to start with %q", ran, info.Engine, want)
	}
	t.Logf("%s: %s", ran, info.Engine)
}
