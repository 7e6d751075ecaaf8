package parley

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/parley-chat/parley/internal/gbnf"
)

// Limits on the tools of one request. Each tool's parameters pass the same
// checks as a json_schema (MaxSchemaLen, MaxSchemaDepth, gbnf's limits); the
// grammar all of them convert to together must fit MaxGrammarLen.
const (
	MaxTools           = 128     // tools per request
	MaxToolDescription = 8 << 10 // bytes of one tool's description
)

// Tool choices (ToolChoice.Mode).
const (
	ToolAuto     = "auto"     // the model may write text or call a tool (the default when tools are given)
	ToolNone     = "none"     // the model must not call a tool
	ToolRequired = "required" // the model must call a tool, from its first token
	ToolFunction = "function" // the model must call the tool named ToolChoice.Name
)

// FinishToolCalls ends a reply that made tool calls.
const FinishToolCalls FinishReason = "tool_calls"

// ToolChoice says whether and which tool the model must call. The zero value
// is ToolAuto.
type ToolChoice struct {
	Mode string `json:"mode,omitempty"`
	Name string `json:"name,omitempty"` // with ToolFunction
}

// ToolSyntax is how a chat-template family writes a call: Open, the call
// object {"name": ..., ArgsKey: {...}}, then Close. Trigger (a prefix of
// Open) is what starts a call when the model writes freely (ToolAuto); from
// there a grammar forces the rest. The chat layer sets it from the template
// before the reply is generated.
type ToolSyntax struct {
	Trigger string
	Open    string
	Close   string
	ArgsKey string // "arguments" ("" means it) or "parameters" (Llama 3.1)
}

func (s ToolSyntax) argsKey() string {
	if s.ArgsKey == "" {
		return "arguments"
	}
	return s.ArgsKey
}

// ToolCallDelta is the part of a tool call that one token event adds, as the
// call streams: Index counts the reply's calls from 0; ID and Name come with
// the call's first delta, Arguments grows over several.
type ToolCallDelta struct {
	Index     int
	ID        string
	Name      string
	Arguments string
}

// ToolsActive reports whether the reply may call a tool: tools are given and
// the choice is not ToolNone.
func (p *Params) ToolsActive() bool {
	return len(p.Tools) > 0 && p.ToolChoice.Mode != ToolNone
}

// ToolsForced reports whether the reply must be a tool call from its first
// token (ToolRequired or ToolFunction).
func (p *Params) ToolsForced() bool {
	return p.ToolsActive() && (p.ToolChoice.Mode == ToolRequired || p.ToolChoice.Mode == ToolFunction)
}

// toolNameRe is OpenAI's rule for function names.
var toolNameRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// checkTools checks Tools and ToolChoice (not the schemas: checkToolGrammar
// converts them).
func (p *Params) checkTools() error {
	if err := p.checkChoiceMode(); err != nil {
		return err
	}
	if len(p.Tools) > MaxTools {
		return FieldErrorf("tools", "at most %d tools, got %d", MaxTools, len(p.Tools))
	}
	if len(p.Tools) == 0 {
		return p.checkChoiceFits()
	}
	seen := make(map[string]bool, len(p.Tools))
	for i, t := range p.Tools {
		field := fmt.Sprintf("tools[%d]", i)
		if !toolNameRe.MatchString(t.Name) {
			return FieldErrorf(field+".name", "must be 1 to 64 letters, digits, _ or -, got %q", t.Name)
		}
		if seen[t.Name] {
			return FieldErrorf(field+".name", "%q is the name of an earlier tool: names must be unique", t.Name)
		}
		seen[t.Name] = true
		if len(t.Description) > MaxToolDescription {
			return FieldErrorf(field+".description", "must be at most %d bytes", MaxToolDescription)
		}
		if err := checkToolSchema(t.Parameters, field+".parameters"); err != nil {
			return err
		}
	}
	return p.checkChoiceFits()
}

// checkChoiceMode checks ToolChoice on its own: a known mode, and a name
// with ToolFunction only.
func (p *Params) checkChoiceMode() error {
	switch p.ToolChoice.Mode {
	case "", ToolAuto, ToolNone, ToolRequired:
		if p.ToolChoice.Name != "" {
			return FieldErrorf("tool_choice", "names a function only with type \"function\"")
		}
	case ToolFunction:
	default:
		return FieldErrorf("tool_choice", "must be auto, none, required or a function, got %q", p.ToolChoice.Mode)
	}
	return nil
}

// checkChoiceFits checks ToolChoice against the rest of p: a forced call
// needs tools, a function choice names one of them, and active tools
// exclude a grammar.
func (p *Params) checkChoiceFits() error {
	forced := p.ToolChoice.Mode == ToolRequired || p.ToolChoice.Mode == ToolFunction
	if len(p.Tools) == 0 && forced {
		return FieldErrorf("tool_choice", "%s needs tools", p.ToolChoice.Mode)
	}
	if p.ToolChoice.Mode == ToolFunction && !slices.ContainsFunc(p.Tools, func(t Tool) bool { return t.Name == p.ToolChoice.Name }) {
		return FieldErrorf("tool_choice", "names %q, which is not one of the tools", p.ToolChoice.Name)
	}
	if p.ToolsActive() && (p.Grammar != "" || len(p.JSONSchema) > 0) {
		return FieldErrorf("tools", "give tools or a grammar/json_schema, not both")
	}
	return nil
}

// checkToolSchema applies json_schema's checks to a tool's parameters, which
// must describe an object, and refuses recursive references: a recursive
// schema lets a call nest without end.
func checkToolSchema(raw json.RawMessage, field string) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil // no parameters: {} is the arguments
	}
	if len(raw) > MaxSchemaLen {
		return FieldErrorf(field, "must be at most %d bytes", MaxSchemaLen)
	}
	if !json.Valid(raw) {
		return FieldErrorf(field, "must be valid JSON")
	}
	if jsonDepthOver(raw, MaxSchemaDepth) {
		return FieldErrorf(field, "nests objects and arrays more than %d deep", MaxSchemaDepth)
	}
	var top map[string]any
	if err := json.Unmarshal(raw, &top); err != nil {
		return FieldErrorf(field, "must be a JSON schema object")
	}
	if t, ok := top["type"]; ok && t != "object" {
		return FieldErrorf(field, "must describe an object (type \"object\"), got type %v", t)
	}
	if err := gbnf.CheckSchema(raw, grammarLimits()); err != nil {
		return FieldErrorf(field, "%v", err)
	}
	if ref := recursiveRef(top); ref != "" {
		return FieldErrorf(field, "is recursive (%q refers back to itself): tool parameters must not be", ref)
	}
	return nil
}

// recursiveRef returns a local $ref of schema whose target reaches that ref
// again, or "".
func recursiveRef(schema map[string]any) string {
	resolve := func(ref string) any {
		if !strings.HasPrefix(ref, "#") {
			return nil
		}
		var cur any = schema
		for _, tok := range strings.Split(strings.TrimPrefix(ref[1:], "/"), "/") {
			if tok == "" {
				continue
			}
			tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
			switch c := cur.(type) {
			case map[string]any:
				cur = c[tok]
			case []any:
				i, err := strconv.Atoi(tok)
				if err != nil || i < 0 || i >= len(c) {
					return nil
				}
				cur = c[i]
			default:
				return nil
			}
		}
		return cur
	}
	var refsIn func(v any, out map[string]bool)
	refsIn = func(v any, out map[string]bool) {
		switch x := v.(type) {
		case map[string]any:
			if r, ok := x["$ref"].(string); ok {
				out[r] = true
			}
			for _, e := range x {
				refsIn(e, out)
			}
		case []any:
			for _, e := range x {
				refsIn(e, out)
			}
		}
	}
	// Depth-first search for a cycle over ref -> refs inside its target.
	const (
		visiting = 1
		done     = 2
	)
	state := map[string]int{}
	var visit func(ref string) string
	visit = func(ref string) string {
		switch state[ref] {
		case visiting:
			return ref
		case done:
			return ""
		}
		state[ref] = visiting
		inner := map[string]bool{}
		refsIn(resolve(ref), inner)
		for _, r := range sortedKeys(inner) {
			if c := visit(r); c != "" {
				return c
			}
		}
		state[ref] = done
		return ""
	}
	top := map[string]bool{}
	refsIn(schema, top)
	for _, r := range sortedKeys(top) {
		if c := visit(r); c != "" {
			return c
		}
	}
	return ""
}

func sortedKeys(m map[string]bool) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// toolCallSchema is the JSON schema of one call to any of tools: an object
// {"name": <a tool's name>, argsKey: <its parameters>}. Each tool's local
// $refs are rewritten to point into its branch.
func toolCallSchema(tools []Tool, only, argsKey string) ([]byte, error) {
	var branches []string
	for i, t := range tools {
		if only != "" && t.Name != only {
			continue
		}
		params := []byte(`{"type":"object","properties":{},"additionalProperties":false}`)
		if len(t.Parameters) > 0 && string(t.Parameters) != "null" {
			params = rebaseRefs(t.Parameters, fmt.Sprintf("#/anyOf/%d/properties/%s", len(branches), argsKey))
		}
		name, err := json.Marshal(t.Name)
		if err != nil {
			return nil, fmt.Errorf("tool %d: %w", i, err)
		}
		key, _ := json.Marshal(argsKey)
		branches = append(branches, fmt.Sprintf(`{"type":"object","properties":{"name":{"const":%s},%s:%s},"required":["name",%s],"additionalProperties":false}`,
			name, key, params, key))
	}
	return []byte(`{"anyOf":[` + strings.Join(branches, ",") + `]}`), nil
}

// rebaseRefs rewrites every local "$ref": "#..." in schema to base + "...".
func rebaseRefs(schema json.RawMessage, base string) []byte {
	if !bytes.Contains(schema, []byte(`"$ref"`)) {
		return schema
	}
	var v any
	dec := json.NewDecoder(bytes.NewReader(schema))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return schema
	}
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				if s, ok := e.(string); ok && k == "$ref" && strings.HasPrefix(s, "#") {
					x[k] = base + s[1:]
					continue
				}
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(v)
	b, err := json.Marshal(v)
	if err != nil {
		return schema
	}
	return b
}

// toolGrammar converts the call schema of p's tools (only the named one with
// ToolFunction) to GBNF rules whose entry is "tool-call" (the converter's
// root, renamed).
func (p *Params) toolGrammar() (string, error) {
	only := ""
	if p.ToolChoice.Mode == ToolFunction {
		only = p.ToolChoice.Name
	}
	schema, err := toolCallSchema(p.Tools, only, p.ToolSyntax.argsKey())
	if err != nil {
		return "", FieldErrorf("tools", "%v", err)
	}
	g, err := gbnf.SchemaToGrammar(schema, grammarLimits())
	if err != nil {
		return "", FieldErrorf("tools", "%v", err)
	}
	if !strings.HasPrefix(g, "root ::= ") {
		return "", Errorf(EInternal, "tools: the converted grammar has no root rule first")
	}
	return "tool-call ::= " + strings.TrimPrefix(g, "root ::= "), nil
}

// toolsKey identifies what toolGrammar converted: the tools, the choice's
// function and the syntax's argument key.
func (p *Params) toolsKey() string {
	if len(p.Tools) == 0 && p.ToolChoice == (ToolChoice{}) {
		return ""
	}
	b, _ := json.Marshal(struct {
		T []Tool
		C ToolChoice
		K string
	}{p.Tools, p.ToolChoice, p.ToolSyntax.argsKey()})
	return string(b)
}

// callGrammar is the grammar of the text that follows start in a call:
// the rest of Open, the call, Close.
//
// Whitespace at the end of Open and at the start of Close is free (up to two
// spaces, tabs or newlines): templates differ in it and models in how they
// copy it.
func (c checkedGrammar) callGrammar(syn ToolSyntax, start string) string {
	rest := ""
	if strings.HasPrefix(syn.Open, start) {
		rest = syn.Open[len(start):]
	}
	root := "root ::= "
	if r := strings.TrimRight(rest, " \t\n"); r != "" {
		root += gbnf.Literal(r) + " "
	}
	root += "tool-ws tool-call"
	if cl := strings.TrimLeft(syn.Close, " \t\n"); cl != "" {
		root += " tool-ws " + gbnf.Literal(cl)
	}
	return root + "\ntool-ws ::= ([ \\t\\n] [ \\t\\n]?)?\n" + c.toolRules
}

// SetToolSyntax sets how the chat template writes a call and, when the
// syntax's argument key differs from the one Validate converted the tools'
// call grammar for, converts it again for this syntax. It does not validate
// p again when Validate has succeeded on p's current tools and grammar (the
// edge validated it, and the engine's door validates it once more); on a p
// that was never validated, or was changed since, it runs Validate without a
// token cap, so a caller that skipped the edge still gets its errors.
func (p *Params) SetToolSyntax(syn ToolSyntax) error {
	validated := p.checked.of(p)
	p.ToolSyntax = syn
	if !validated {
		return p.Validate(0)
	}
	if p.checked.of(p) {
		return nil // the same argument key: the converted call grammar stands
	}
	return p.recheckTools(true)
}

// SetToolChoice sets the tool choice. On params Validate has succeeded on it
// checks the choice against them and rebuilds only what the choice changes
// (the call grammar, when the choice narrows it to another function or
// turns tools on), without validating p again: a tool loop's later steps
// turn a forced call into a free choice. On params never validated, or
// changed since, it runs Validate without a token cap, as SetToolSyntax does.
func (p *Params) SetToolChoice(c ToolChoice) error {
	validated := p.checked.of(p)
	was := p.ToolChoice
	p.ToolChoice = c
	if !validated {
		return p.Validate(0)
	}
	if p.checked.of(p) {
		return nil // the same choice
	}
	if err := p.checkChoiceMode(); err != nil {
		p.checked = checkedGrammar{}
		return err
	}
	if err := p.checkChoiceFits(); err != nil {
		p.checked = checkedGrammar{}
		return err
	}
	return p.recheckTools(functionOf(was) != functionOf(c))
}

// recheckTools brings a validated p's record of its tools up to date after
// a change of tool syntax or choice: no call grammar when tools are off,
// else the one recorded, built again when rebuild says it changed (or none
// was built).
func (p *Params) recheckTools(rebuild bool) error {
	ch := p.checked
	ch.tools = p.toolsKey()
	switch {
	case !p.ToolsActive():
		ch.toolRules = ""
	case rebuild || ch.toolRules == "":
		rules, err := p.toolGrammar()
		if err != nil {
			p.checked = checkedGrammar{}
			return err
		}
		ch.toolRules = rules
	}
	p.checked = ch
	return nil
}

// functionOf is the one tool a choice narrows the call grammar to ("" for
// every tool).
func functionOf(c ToolChoice) string {
	if c.Mode == ToolFunction {
		return c.Name
	}
	return ""
}

// LazyToolGrammar returns, for a reply that may call a tool as it chooses
// (ToolAuto), the text that starts a call (its syntax's Trigger) and the
// grammar that forces the rest of the call once the model has written it.
// ok is false when the reply has no such lazy grammar (no tools, ToolNone,
// a forced call, no trigger) or p was not validated.
func (p *Params) LazyToolGrammar() (trigger, grammar string, ok bool) {
	if !p.ToolsActive() || p.ToolsForced() || p.ToolSyntax.Trigger == "" || !p.checked.of(p) {
		return "", "", false
	}
	if !strings.HasPrefix(p.ToolSyntax.Open, p.ToolSyntax.Trigger) {
		return "", "", false
	}
	return p.ToolSyntax.Trigger, p.checked.callGrammar(p.ToolSyntax, p.ToolSyntax.Trigger), true
}
