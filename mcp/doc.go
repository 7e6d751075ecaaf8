// Package mcp runs the operator's MCP (Model Context Protocol) servers for
// Parley's users, with the official Go SDK. It owns:
//
//   - the configuration (Config, LoadConfig): stdio commands and Streamable
//     HTTP URLs with their headers and environment, "${NAME}" secrets taken
//     from Parley's environment, and each user's servers and tools;
//   - sessions: one per user and server (one for all users of a shared
//     server), started on first use, supervised (started again with backoff
//     when the server exits, crashes, hangs or sends a message over the
//     cap), closed when idle, relisting tools on tools/list_changed;
//   - stdio servers as child processes in a group of their own, killed with
//     Parley, their stderr kept to a bounded tail;
//   - HTTP servers dialled only at public addresses unless the operator
//     allows private ones (checked on the address each socket connects to,
//     redirects included), with redirects held to the server's origin;
//   - calls under a time cap and results under a size cap, the operator's
//     secrets masked in results, errors and logs (Manager).
//
// Manager satisfies toolloop.Host: the tool loop lists and calls tools
// through it without knowing MCP.
package mcp
