// Package toolloop runs tools on the server in the middle of a reply: when
// the model calls a server tool, the loop calls it through a Host (an MCP
// client, say), appends the call and its result to the conversation as an
// assistant turn and a tool message, and asks the model again, up to a step
// limit. Calls to the client's own tools pass through unchanged: the run
// ends with them, as a reply without server tools would.
//
// It owns:
//
//   - the Toolset of one request: which server tools it enables (Selection,
//     and the Responses API's mcp tool: MCPSpec with server_label,
//     allowed_tools and require_approval), the names the model calls them by
//     (unique beside the client's tools), and the merged parley.Params;
//   - the Loop: model replies, server calls and results as one stream of
//     Events that any API can map to its wire shape;
//   - the approval round-trip: a call that needs the user's approval ends
//     the run with an ApprovalRequest, and a later run given the decision
//     (Request.Approvals) makes or declines the call and carries on.
//
// It knows neither HTTP nor MCP: the model is a ReplyFunc (chat.Responder's
// Reply fits) and the tools a Host (mcp.Manager is one).
package toolloop
