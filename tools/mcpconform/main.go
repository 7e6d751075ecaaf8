// Command mcpconform is Parley's MCP client as the conformance suite of
// @modelcontextprotocol/conformance drives it: the suite starts a test MCP
// server for one of its client scenarios, runs this command with the
// server's URL as the last argument and the scenario's name in
// MCP_CONFORMANCE_SCENARIO, and then checks what the server saw.
//
// The client is package mcp's Manager, the code the server runs for its
// users: the URL becomes a one-server configuration read by
// mcp.ParseConfig (Streamable HTTP, private addresses allowed since the test
// server listens on loopback), and the scenario's steps go through
// Manager.ListTools and Manager.CallTool, so the session start, the tool
// listing and the calls are Parley's own, not a bare SDK client's.
//
// Usage (from scripts/, where the suite is installed):
//
//	npx conformance client --command "path/to/mcpconform" --scenario tools_call
//
// It prints each step's outcome on stdout (the suite keeps it as
// stdout.txt) and exits 1 when a step fails.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/parley-chat/parley/mcp"
	"github.com/parley-chat/parley/tools/internal/harness"
)

// server is the label the test server has in the configuration.
const server = "conformance"

// scenarios maps each client scenario Parley's client takes part in to its
// steps after the tools are listed: the tool it calls, the arguments and a
// text the result must hold. A scenario with no call only initializes and
// lists tools.
var scenarios = map[string]*call{
	// The server checks the initialize request (protocol version, client
	// name and version); the client lists tools as it always does.
	"initialize": nil,
	// The server checks that add_numbers got numbers and answers their sum.
	"tools_call": {tool: "add_numbers", args: `{"a": 5, "b": 3}`, want: "8"},
	// The server closes the call's SSE stream after a priming event with a
	// retry field; the client must reconnect with GET, after that many
	// milliseconds, with Last-Event-ID, and get the result there.
	"sse-retry": {tool: "test_reconnection", args: `{}`, want: "Reconnection test completed successfully"},
}

// call is one tool call of a scenario.
type call struct {
	tool string
	args string
	want string
}

func main() {
	harness.Main("mcpconform", func(ctx context.Context, args []string, stdout io.Writer) error {
		return run(ctx, args, os.Getenv, stdout, os.Stderr)
	})
}

// run parses args (flags, then the server URL), runs the scenario and
// reports each step on stdout.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("mcpconform", flag.ContinueOnError)
	fs.SetOutput(stderr)
	scenario := fs.String("scenario", getenv("MCP_CONFORMANCE_SCENARIO"), "client scenario (default: $MCP_CONFORMANCE_SCENARIO)")
	timeout := fs.Duration("timeout", 60*time.Second, "time for the whole scenario")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("usage: mcpconform [-scenario NAME] URL")
	}
	steps, ok := scenarios[*scenario]
	if !ok {
		return fmt.Errorf("scenario %q is not one Parley's client takes part in", *scenario)
	}
	cfg, err := config(fs.Arg(0))
	if err != nil {
		return err
	}
	log, err := zap.NewDevelopment() // on stderr, which the suite keeps as stderr.txt
	if err != nil {
		return err
	}
	m := mcp.New(cfg, mcp.WithLogger(log))
	defer m.Close()

	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	tools, err := m.ListTools(ctx, "", server)
	if err != nil {
		return fmt.Errorf("list tools: %w", err)
	}
	names := make([]string, len(tools))
	for i, t := range tools {
		names[i] = t.Name
	}
	fmt.Fprintf(stdout, "tools: [%s]\n", strings.Join(names, " "))
	if steps == nil {
		return nil
	}
	r, err := m.CallTool(ctx, "", server, steps.tool, json.RawMessage(steps.args))
	if err != nil {
		return fmt.Errorf("call %s: %w", steps.tool, err)
	}
	fmt.Fprintf(stdout, "call %s: error=%t %q\n", steps.tool, r.IsError, r.Content)
	if r.IsError || !strings.Contains(r.Content, steps.want) {
		return fmt.Errorf("call %s: want a result holding %q, got error=%t %q", steps.tool, steps.want, r.IsError, r.Content)
	}
	return nil
}

// config is the configuration of one Streamable HTTP server at url that
// every user may use all the tools of, read as Parley reads an operator's
// file.
func config(url string) (*mcp.Config, error) {
	b, err := json.Marshal(map[string]any{
		"servers": map[string]any{server: map[string]any{"url": url, "allow_private": true}},
		"users":   map[string]any{"*": map[string]any{server: []string{"*"}}},
	})
	if err != nil {
		return nil, err
	}
	return mcp.ParseConfig(b, func(string) string { return "" })
}
