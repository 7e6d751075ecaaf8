// Package mcptest holds MCP servers for tests, written with the official Go
// SDK and served over Streamable HTTP on a local port.
package mcptest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// Adder is an MCP server with one tool, add, which sums two integers.
type Adder struct {
	// URL is the server's MCP endpoint.
	URL string
	// Calls counts the calls of add.
	Calls atomic.Int32
}

// NewAdder starts an Adder that stops when tb's test ends.
func NewAdder(tb testing.TB) *Adder {
	type in struct {
		A int `json:"a"`
		B int `json:"b"`
	}
	a := &Adder{}
	s := sdk.NewServer(&sdk.Implementation{Name: "adder", Version: "1"}, nil)
	sdk.AddTool(s, &sdk.Tool{Name: "add", Description: "adds two integers"}, func(ctx context.Context, req *sdk.CallToolRequest, v in) (*sdk.CallToolResult, any, error) {
		a.Calls.Add(1)
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: fmt.Sprint(v.A + v.B)}}}, nil, nil
	})
	srv := httptest.NewServer(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, nil))
	tb.Cleanup(srv.Close)
	a.URL = srv.URL + "/mcp"
	return a
}
