package mcp

import (
	"encoding/json"
	"fmt"
	"strings"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/parley-chat/parley/toolloop"
)

// render turns a tool's result into the text the model reads: text parts
// as they are, other parts as a short note of what they were, the
// structured content when there is nothing else; secrets masked, and cut
// to max bytes (on a character boundary) with a note of how much was cut.
func render(r *sdk.CallToolResult, max int, redact func(string) string) toolloop.Result {
	var b strings.Builder
	part := func(s string) {
		if b.Len() > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(s)
	}
	for _, c := range r.Content {
		switch c := c.(type) {
		case *sdk.TextContent:
			part(c.Text)
		case *sdk.ImageContent:
			part(fmt.Sprintf("[image: %s, %d bytes]", c.MIMEType, len(c.Data)))
		case *sdk.AudioContent:
			part(fmt.Sprintf("[audio: %s, %d bytes]", c.MIMEType, len(c.Data)))
		case *sdk.ResourceLink:
			part(fmt.Sprintf("[resource link: %s %s]", c.Name, c.URI))
		case *sdk.EmbeddedResource:
			switch {
			case c.Resource == nil:
			case c.Resource.Text != "":
				part(c.Resource.Text)
			default:
				part(fmt.Sprintf("[resource: %s, %s, %d bytes]", c.Resource.URI, c.Resource.MIMEType, len(c.Resource.Blob)))
			}
		default:
			part("[content of another kind]")
		}
		if b.Len() > 4*max {
			break // the rest is cut anyway
		}
	}
	if b.Len() == 0 && r.StructuredContent != nil {
		if j, err := json.Marshal(r.StructuredContent); err == nil {
			part(string(j))
		}
	}
	return toolloop.Result{Content: capText(redact(b.String()), max), IsError: r.IsError}
}

// capText cuts s to at most max bytes, with the note included, without
// splitting a character.
func capText(s string, max int) string {
	if len(s) <= max {
		return s
	}
	note := fmt.Sprintf("\n[cut: the result was %d bytes; the first part is shown]", len(s))
	n := max - len(note)
	if n < 0 {
		n = 0
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n] + note
}
