package gbnf

import (
	"fmt"
	"strings"

	"github.com/parley-chat/parley/internal/pyjson"
)

// object builds an object's rule as llama.cpp does: required properties in
// order, then the optional ones, each optional one an alternative start
// followed by a chain of "-rest" rules, so properties keep their order and
// each appears at most once.
func (c *converter) object(n *jnode, path, hint string) string {
	required := map[string]bool{}
	if r := n.get("required"); r != nil && r.kind != 'z' { // null: Go clients' nil slice
		if r.kind != 'a' {
			c.fail(join(path, "required"), "must be an array of strings")
		}
		for _, e := range r.vals {
			if e.kind != 's' {
				c.fail(join(path, "required"), "must be an array of strings")
			}
			required[e.str] = true
		}
	}
	var props []objProp
	if p := n.get("properties"); p != nil {
		if p.kind != 'o' {
			c.fail(join(path, "properties"), "must be an object")
		}
		seen := make(map[string]bool, len(p.keys))
		for i, k := range p.keys {
			if seen[k] {
				c.fail(join(path, "properties"), "has the property %q twice", k)
			}
			seen[k] = true
			props = append(props, objProp{k, p.lones[i], p.vals[i], ""})
		}
	}
	return c.objectRule(props, required, n.get("additionalProperties"), path, hint)
}

// objProp is one property of an object rule; path is its schema path when
// it is not under path.properties (allOf parts).
type objProp struct {
	name string
	lone bool
	val  *jnode
	path string
}

func (c *converter) objectRule(props []objProp, required map[string]bool, additional *jnode, path, hint string) string {
	if len(props) > MaxSchemaProperties {
		c.fail(join(path, "properties"), "has %d properties; at most %d (limit on schema size)", len(props), MaxSchemaProperties)
	}
	c.primitive("space")
	var req, opt []string // kv rule names
	var names []string    // property names as JSON writes them, for additionalProperties
	for _, p := range props {
		ppath := p.path
		if ppath == "" {
			ppath = join(join(path, "properties"), p.name)
		}
		if p.lone {
			c.fail(ppath, "the property name has a lone UTF-16 surrogate escape")
		}
		var key strings.Builder
		pyjson.Quote(&key, p.name)
		valRule := c.visit(p.val, ppath, p.name, "")
		kv := c.addRule(p.name+"-kv", Literal(key.String())+` space ":" space `+valRule)
		if required[p.name] {
			req = append(req, kv)
		} else {
			opt = append(opt, kv)
		}
		k := key.String()
		names = append(names, k[1:len(k)-1])
	}
	star := ""
	if additional != nil && (isTrue(additional) || additional.kind == 'o') {
		value := ""
		if additional.kind == 'o' {
			value = c.visit(additional, join(path, "additionalProperties"), hint+"-additional-value", "")
		} else {
			value = c.primitive("value")
		}
		keyRule := c.primitive("string")
		if len(names) > 0 {
			keyRule = c.addRule(hint+"-additional-k", c.notStrings(names))
		}
		star = c.addRule(hint+"-additional-kv", keyRule+` ":" space `+value)
		opt = append(opt, star)
	}

	var b strings.Builder
	b.WriteString(`"{" space `)
	b.WriteString(strings.Join(req, ` "," space `))
	if len(opt) > 0 {
		b.WriteString(" (")
		if len(req) > 0 {
			b.WriteString(` "," space ( `)
		}
		// rest[i] is the rule for the optional properties after opt[i].
		rest := make([]string, len(opt))
		for i := len(opt) - 2; i >= 0; i-- {
			k := opt[i+1]
			body := `( "," space ` + k + ` )?`
			if k == star {
				body = `( "," space ` + k + ` )*`
			}
			if rest[i+1] != "" {
				body += " " + rest[i+1]
			}
			rest[i] = c.addRule(opt[i]+"-rest", body)
		}
		for i, k := range opt {
			if i > 0 {
				b.WriteString(" | ")
			}
			b.WriteString(k)
			if k == star {
				b.WriteString(` ( "," space ` + k + ` )*`)
			}
			if rest[i] != "" {
				b.WriteString(" " + rest[i])
			}
		}
		if len(req) > 0 {
			b.WriteString(" )")
		}
		b.WriteString(" )?")
	}
	b.WriteString(` "}" space`)
	return b.String()
}

// notStrings matches a JSON string that is none of names (as JSON writes
// them, without quotes), through a trie of their characters.
func (c *converter) notStrings(names []string) string {
	type trie struct {
		kids []rune
		next map[rune]*trie
		end  bool
	}
	root := &trie{next: map[rune]*trie{}}
	for _, s := range names {
		t := root
		for _, r := range s {
			k, ok := t.next[r]
			if !ok {
				k = &trie{next: map[rune]*trie{}}
				t.next[r] = k
				t.kids = append(t.kids, r)
			}
			t = k
		}
		t.end = true
	}
	char := c.primitive("char")
	var b strings.Builder
	b.WriteString(`["] ( `)
	var walk func(t *trie)
	walk = func(t *trie) {
		var rejects strings.Builder
		for i, r := range t.kids {
			writeClassChar(&rejects, r)
			if i > 0 {
				b.WriteString(" | ")
			}
			b.WriteString("[")
			writeClassChar(&b, r)
			b.WriteString("]")
			k := t.next[r]
			if len(k.kids) > 0 {
				b.WriteString(" (")
				walk(k)
				b.WriteString(")")
			} else if k.end {
				b.WriteString(" " + char + "+")
			}
		}
		if len(t.kids) > 0 {
			b.WriteString(` | [^"\\\x7F\x00-\x1F` + rejects.String() + "] " + char + "*")
		}
	}
	walk(root)
	b.WriteString(" )")
	if !root.end {
		b.WriteString("?")
	}
	b.WriteString(` ["] space`)
	return b.String()
}

// allOf merges object parts (or references to them) into one object rule,
// and enum parts into their intersection. Parts inside an anyOf of the
// allOf contribute optional properties.
func (c *converter) allOf(n *jnode, path, hint string) string {
	all := n.get("allOf")
	apath := join(path, "allOf")
	if all.kind != 'a' || len(all.vals) == 0 {
		c.fail(apath, "must be a non-empty array of schemas")
	}
	if len(all.vals) == 1 {
		return c.visit(all.vals[0], apath+"[0]", hint, "")
	}
	var props []objProp
	required := map[string]bool{}
	enumCount := map[string]int{}
	var enumOrder []string
	enums := 0
	var add func(part *jnode, ppath string, optional bool, depth int)
	add = func(part *jnode, ppath string, optional bool, depth int) {
		if depth > MaxSchemaNesting {
			c.fail(ppath, "references nest more than %d deep", MaxSchemaNesting)
		}
		if part.kind != 'o' {
			c.fail(ppath, "allOf parts must be object schemas")
		}
		switch {
		case part.has("$ref"):
			r := part.get("$ref")
			if r.kind != 's' || !strings.HasPrefix(r.str, "#") {
				c.fail(join(ppath, "$ref"), "must be a reference inside the schema (#/...)")
			}
			target := c.resolve(r.str, join(ppath, "$ref"))
			add(target, join(ppath, "$ref"), optional, depth+1)
		case part.has("properties"):
			p := part.get("properties")
			if p.kind != 'o' {
				c.fail(join(ppath, "properties"), "must be an object")
			}
			req := map[string]bool{}
			if r := part.get("required"); r != nil && r.kind == 'a' {
				for _, e := range r.vals {
					if e.kind == 's' {
						req[e.str] = true
					}
				}
			}
			for i, k := range p.keys {
				props = append(props, objProp{k, p.lones[i], p.vals[i], join(join(ppath, "properties"), k)})
				if !optional && req[k] {
					required[k] = true
				}
			}
		case part.has("enum"):
			enums++
			e := part.get("enum")
			if e.kind != 'a' {
				c.fail(join(ppath, "enum"), "must be an array")
			}
			seen := map[string]bool{}
			for i, v := range e.vals {
				lit := c.literalValue(v, fmt.Sprintf("%s[%d]", join(ppath, "enum"), i))
				if seen[lit] {
					continue
				}
				seen[lit] = true
				if enumCount[lit] == 0 {
					enumOrder = append(enumOrder, lit)
				}
				enumCount[lit]++
			}
		default:
			c.fail(ppath, "allOf can merge only objects with properties, enums and references to them")
		}
	}
	for i, part := range all.vals {
		ppath := fmt.Sprintf("%s[%d]", apath, i)
		if any := part.get("anyOf"); any != nil && any.kind == 'a' {
			for j, alt := range any.vals {
				add(alt, fmt.Sprintf("%s.anyOf[%d]", ppath, j), true, 0)
			}
			continue
		}
		add(part, ppath, false, 0)
	}
	if enums > 0 {
		if len(props) > 0 {
			c.fail(apath, "allOf cannot merge enums with objects")
		}
		var inter []string
		for _, lit := range enumOrder {
			if enumCount[lit] == enums {
				inter = append(inter, lit)
			}
		}
		if len(inter) == 0 {
			c.fail(apath, "the enums have no value in common: nothing can match")
		}
		c.primitive("space")
		return c.addRule(hint, "("+strings.Join(inter, " | ")+") space")
	}
	return c.addRule(hint, c.objectRule(props, required, nil, path, hint))
}
