package mcp_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/goleak"
)

// serverEnv names the mode the test binary runs in when a test starts it as
// an MCP server over stdio.
const serverEnv = "PARLEY_MCP_TEST_SERVER"

func TestMain(m *testing.M) {
	switch os.Getenv(serverEnv) {
	case "":
		goleak.VerifyTestMain(m)
	case "liar":
		liar()
	default:
		err := testServer(os.Getenv(serverEnv)).Run(context.Background(), &sdk.StdioTransport{})
		waiting.Wait() // a wait call that saw its cancellation marks it before the process exits
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	os.Exit(0)
}

// waiting counts the wait calls in progress in the test server's process.
var waiting sync.WaitGroup

// testServer is the MCP server written with the Go SDK that the tests run
// over stdio (as the test binary, in mode) and Streamable HTTP. Its tools:
//
//	echo {text}       returns text
//	add {a, b}        returns a+b
//	remember {text}   keeps text in the process; recall returns it
//	grow              adds a tool "grown" (a tools/list_changed notice)
//	env {name}        returns the environment variable name
//	stderr-env        prints API_KEY to stderr
//	header            returns the Authorization header of the request (HTTP)
//	big {n}           returns n bytes of text
//	crash             exits the process
//	hang              never returns
//	wait {name}       returns when its context ends; in $CANCEL_DIR it
//	                  creates name.started, then name when it ends
//	pid               returns the process id
//	spawn             starts a child process (sleep) and returns its pid
func testServer(mode string) *sdk.Server {
	s := sdk.NewServer(&sdk.Implementation{Name: "parley-test", Version: "1"}, nil)
	var mu sync.Mutex
	var memory string
	text := func(s string) *sdk.CallToolResult {
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: s}}}
	}
	type textIn struct {
		Text string `json:"text"`
	}
	sdk.AddTool(s, &sdk.Tool{Name: "echo", Description: "echoes text"}, func(ctx context.Context, req *sdk.CallToolRequest, in textIn) (*sdk.CallToolResult, any, error) {
		return text(in.Text), nil, nil
	})
	type addIn struct {
		A int `json:"a"`
		B int `json:"b"`
	}
	sdk.AddTool(s, &sdk.Tool{Name: "add", Description: "adds two integers"}, func(ctx context.Context, req *sdk.CallToolRequest, in addIn) (*sdk.CallToolResult, any, error) {
		return text(fmt.Sprint(in.A + in.B)), nil, nil
	})
	sdk.AddTool(s, &sdk.Tool{Name: "remember"}, func(ctx context.Context, req *sdk.CallToolRequest, in textIn) (*sdk.CallToolResult, any, error) {
		mu.Lock()
		memory = in.Text
		mu.Unlock()
		return text("ok"), nil, nil
	})
	type none struct{}
	sdk.AddTool(s, &sdk.Tool{Name: "recall"}, func(ctx context.Context, req *sdk.CallToolRequest, in none) (*sdk.CallToolResult, any, error) {
		mu.Lock()
		defer mu.Unlock()
		return text("memory: " + memory), nil, nil
	})
	sdk.AddTool(s, &sdk.Tool{Name: "grow"}, func(ctx context.Context, req *sdk.CallToolRequest, in none) (*sdk.CallToolResult, any, error) {
		sdk.AddTool(s, &sdk.Tool{Name: "grown"}, func(ctx context.Context, req *sdk.CallToolRequest, in none) (*sdk.CallToolResult, any, error) {
			return text("grown"), nil, nil
		})
		return text("grew"), nil, nil
	})
	type envIn struct {
		Name string `json:"name"`
	}
	sdk.AddTool(s, &sdk.Tool{Name: "env"}, func(ctx context.Context, req *sdk.CallToolRequest, in envIn) (*sdk.CallToolResult, any, error) {
		return text(in.Name + "=" + os.Getenv(in.Name)), nil, nil
	})
	sdk.AddTool(s, &sdk.Tool{Name: "stderr-env"}, func(ctx context.Context, req *sdk.CallToolRequest, in none) (*sdk.CallToolResult, any, error) {
		fmt.Fprintln(os.Stderr, "API_KEY="+os.Getenv("API_KEY"))
		return text("printed"), nil, nil
	})
	sdk.AddTool(s, &sdk.Tool{Name: "header"}, func(ctx context.Context, req *sdk.CallToolRequest, in none) (*sdk.CallToolResult, any, error) {
		if req.Extra == nil || req.Extra.Header == nil {
			return text("no header"), nil, nil
		}
		return text("authorization: " + req.Extra.Header.Get("Authorization")), nil, nil
	})
	type bigIn struct {
		N int `json:"n"`
	}
	sdk.AddTool(s, &sdk.Tool{Name: "big"}, func(ctx context.Context, req *sdk.CallToolRequest, in bigIn) (*sdk.CallToolResult, any, error) {
		return text(strings.Repeat("x", in.N)), nil, nil
	})
	sdk.AddTool(s, &sdk.Tool{Name: "crash"}, func(ctx context.Context, req *sdk.CallToolRequest, in none) (*sdk.CallToolResult, any, error) {
		os.Exit(3)
		return nil, nil, nil
	})
	sdk.AddTool(s, &sdk.Tool{Name: "hang"}, func(ctx context.Context, req *sdk.CallToolRequest, in none) (*sdk.CallToolResult, any, error) {
		if mode == "http" {
			<-ctx.Done() // in the test's own process: end with the request
			return nil, nil, ctx.Err()
		}
		select {} // a server that ignores cancellation
	})
	type nameIn struct {
		Name string `json:"name"`
	}
	sdk.AddTool(s, &sdk.Tool{Name: "wait"}, func(ctx context.Context, req *sdk.CallToolRequest, in nameIn) (*sdk.CallToolResult, any, error) {
		waiting.Add(1)
		defer waiting.Done()
		dir := os.Getenv("CANCEL_DIR")
		mark := dir != "" && in.Name != "" && !strings.ContainsAny(in.Name, `/\`)
		if mark {
			os.WriteFile(dir+"/"+in.Name+".started", nil, 0o600)
		}
		<-ctx.Done()
		if mark {
			os.WriteFile(dir+"/"+in.Name, nil, 0o600)
		}
		return nil, nil, ctx.Err()
	})
	sdk.AddTool(s, &sdk.Tool{Name: "pid"}, func(ctx context.Context, req *sdk.CallToolRequest, in none) (*sdk.CallToolResult, any, error) {
		return text(fmt.Sprint(os.Getpid())), nil, nil
	})
	sdk.AddTool(s, &sdk.Tool{Name: "spawn"}, func(ctx context.Context, req *sdk.CallToolRequest, in none) (*sdk.CallToolResult, any, error) {
		cmd := exec.Command("sleep", "1000")
		if err := cmd.Start(); err != nil {
			return nil, nil, err
		}
		return text(fmt.Sprint(cmd.Process.Pid)), nil, nil
	})
	if mode == "flood" {
		// Megabytes on stderr before serving and with every call.
		go func() {
			line := strings.Repeat("noise ", 1000) + "\n"
			for range 2000 {
				os.Stderr.WriteString(line)
			}
		}()
	}
	return s
}

// httpServer serves testServer over Streamable HTTP.
func httpServer() http.Handler {
	return sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return testServer("http") }, nil)
}

// liar is a hand-written MCP server over stdio that lies: its tools' input
// schemas are not objects, refer to themselves, or are not schemas; one
// description is a megabyte; a name repeats; and its call results are not
// results.
func liar() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				Name string `json:"name"`
			} `json:"params"`
		}
		if json.Unmarshal(in.Bytes(), &req) != nil || req.ID == nil {
			continue // a notification
		}
		var result any
		switch req.Method {
		case "initialize":
			result = map[string]any{"protocolVersion": "2025-06-18", "capabilities": map[string]any{"tools": map[string]any{}},
				"serverInfo": map[string]any{"name": "liar", "version": "1"}}
		case "tools/list":
			obj := map[string]any{"type": "object", "properties": map[string]any{"a": map[string]any{"type": "integer"}}}
			result = map[string]any{"tools": []any{
				map[string]any{"name": "honest", "inputSchema": obj},
				map[string]any{"name": "stringy", "inputSchema": map[string]any{"type": "string"}},
				map[string]any{"name": "loop", "inputSchema": map[string]any{"type": "object", "properties": map[string]any{"x": map[string]any{"$ref": "#"}}}},
				map[string]any{"name": "numeric", "inputSchema": 5},
				map[string]any{"name": "wordy", "description": strings.Repeat("w", 1<<20-1000), "inputSchema": obj},
				map[string]any{"name": "honest", "inputSchema": map[string]any{"type": "string"}},
				map[string]any{"name": "", "inputSchema": obj},
			}}
		case "tools/call":
			if req.Params.Name == "honest" {
				result = map[string]any{"content": "not a list"}
			} else {
				result = map[string]any{"content": []any{map[string]any{"type": "text", "text": "wordy ok"}}}
			}
		default:
			out.Encode(map[string]any{"jsonrpc": "2.0", "id": req.ID, "error": map[string]any{"code": -32601, "message": "no"}})
			continue
		}
		out.Encode(map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": result})
	}
}
