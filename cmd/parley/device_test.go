package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/parley-chat/parley/internal/testbin"
	"github.com/parley-chat/parley/llm/offload"
)

// TestBinaryWithoutGPU: the project's machines have no GPU, and the test
// binary has no lib/ollama beside it, so with the GPU defaults (--gpu-layers
// auto, --flash-attn auto) the server must start on the CPU, say so in one
// log line and in /health, and answer.
func TestBinaryWithoutGPU(t *testing.T) {
	s := start(t, testbin.Parley(t), "--store", "memory")
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get("http://" + s.addr + "/health")
	if err != nil {
		t.Fatal(err)
	}
	var health struct {
		Status string `json:"status"`
		Device struct {
			Backend, Name, Type string
			LayersOffloaded     int `json:"layers_offloaded"`
			LayersTotal         int `json:"layers_total"`
		} `json:"device"`
	}
	err = json.NewDecoder(resp.Body).Decode(&health)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	d := health.Device
	if health.Status != "ok" || d.Type != "cpu" || d.Backend != "CPU" || d.LayersOffloaded != 0 || d.LayersTotal == 0 {
		t.Errorf("/health = %+v, want ok on the CPU with 0 of the model's layers offloaded", health)
	}
	ws := s.dial(t, "")
	read(t, ws) // session
	if m := turn(t, ws, "Once upon a time", map[string]any{"max_tokens": 8}); m.Usage.CompletionTokens == 0 {
		t.Errorf("the reply on the CPU: %+v", m)
	}
	ws.Close()
	if n := strings.Count(s.log(), "running on the CPU"); n != 1 {
		t.Errorf("%d log lines say the server runs on the CPU, want 1:\n%s", n, s.log())
	}
	if !strings.Contains(s.log(), `"flash_attn":false`) {
		t.Errorf("--flash-attn auto did not resolve to off on the CPU:\n%s", s.log())
	}
}

func TestGPULayersFlag(t *testing.T) {
	getenv := func(k string) string {
		if k == "PARLEY_GPU_LAYERS" {
			return "12"
		}
		return ""
	}
	for _, tc := range []struct {
		args []string
		env  func(string) string
		want int
		err  string
	}{
		{nil, nil, offload.Auto, ""},
		{[]string{"--gpu-layers", "auto"}, nil, offload.Auto, ""},
		{[]string{"--gpu-layers", "0"}, nil, 0, ""},
		{[]string{"--gpu-layers", "33"}, nil, 33, ""},
		{nil, getenv, 12, ""},
		{[]string{"--gpu-layers", "-1"}, nil, 0, "want auto or a number"},
		{[]string{"--gpu-layers", "all"}, nil, 0, "want auto or a number"},
	} {
		env := tc.env
		if env == nil {
			env = func(string) string { return "" }
		}
		c, err := parseFlags(append([]string{"--model", "m.gguf"}, tc.args...), env, &bytes.Buffer{})
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: error %v, want %q", tc.args, err, tc.err)
			}
		case err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case int(c.gpuLayers) != tc.want:
			t.Errorf("%v: gpu layers %d, want %d", tc.args, c.gpuLayers, tc.want)
		}
		if tc.err == "" && err == nil && (c.flashAttn != "auto" || c.kvUnified != "off") {
			t.Errorf("defaults: --flash-attn %q --kv-unified %q, want auto and off", c.flashAttn, c.kvUnified)
		}
	}
}
