package chat

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/ardanlabs/jinja"
)

// The emitter writes a parsed expression back in the engine's syntax: every operation in parentheses (so the
// engine's precedence, which differs from jinja2's for ~, is and filters, never applies), and a helper call
// wherever the engine's semantics differ from Python's (arithmetic and comparisons, ~, *args and **kwargs, tests,
// a dict's methods, join, string and tojson).

// Names of the helpers the prepared source calls; names no real template uses. They are variables of the render
// (the engine looks a filter up among the variables when it has no builtin of that name).
const (
	pyTojsonName   = "parley_tojson"
	pyPrintName    = "parley_print"
	pyStringName   = "parley_string"
	pyEnterName    = "parley_enter"
	pyOpName       = "parley_op"
	pyCatName      = "parley_cat"
	pyAttrName     = "parley_attr"
	pyCallName     = "parley_call"
	pyTestName     = "parley_test"
	pyIterName     = "parley_iter"
	pyJoinName     = "parley_join"
	pyMacroName    = "parley_macro"
	pyRaiseName    = "parley_raise"
	pyKeyName      = "parley_key"
	pyItemName     = "parley_item"
	pyDictsortName = "parley_dictsort"
	pyMapName      = "parley_map"
	pyDefinedName  = "parley_defined"
	filterArgName  = "parley_filter" // map's keyword that passes the filter's callable
)

// methodNames are the attributes read through pyAttr: a dict's methods (which come before its keys in jinja2, so
// a JSON schema's "items" key does not hide items()) and the list and dict methods that modify their object
// (jinja2's immutable sandbox, as Hugging Face renders, refuses them).
var methodNames = map[string]bool{
	"items": true, "keys": true, "values": true, "get": true, "copy": true,
	"append": true, "extend": true, "insert": true, "pop": true, "remove": true, "clear": true, "sort": true,
	"reverse": true, "update": true, "setdefault": true, "popitem": true,
	"split": true, "rsplit": true, "join": true, "startswith": true, "endswith": true, "format": true, "title": true,
	"capitalize": true,
}

// filterHelpers are the filters a helper of Parley's renders instead of the engine's builtin.
var filterHelpers = map[string]string{
	"string": pyStringName, "tojson": pyTojsonName, "join": pyJoinName, "format": "format", "dictsort": pyDictsortName,
	"map": pyMapName, "select": "parley_select", "reject": "parley_reject", "selectattr": "parley_selectattr",
	"rejectattr": "parley_rejectattr", "first": "parley_first", "last": "parley_last", "list": "parley_list",
	"sort": "parley_sort", "sum": "parley_sum", "round": "parley_round", "title": "parley_title",
	"capitalize": "parley_capitalize",
}

// generatorFilters return a generator in jinja2: tojson and length refuse one.
var generatorFilters = map[string]bool{"map": true, "select": true, "reject": true, "selectattr": true, "rejectattr": true}

// jinja2Tests are jinja2's tests; another name fails the template at compile time, as in jinja2.
var jinja2Tests = map[string]bool{
	"odd": true, "even": true, "divisibleby": true, "defined": true, "undefined": true, "filter": true, "test": true,
	"none": true, "boolean": true, "false": true, "true": true, "integer": true, "float": true, "lower": true,
	"upper": true, "string": true, "mapping": true, "number": true, "sequence": true, "iterable": true,
	"callable": true, "sameas": true, "escaped": true, "in": true, "==": true, "eq": true, "equalto": true,
	"!=": true, "ne": true, ">": true, "gt": true, "greaterthan": true, ">=": true, "ge": true, "<": true,
	"lt": true, "lessthan": true, "<=": true, "le": true,
}

// jinja2Filters are jinja2's builtin filters; another name fails the template at compile time, as in jinja2.
var jinja2Filters = map[string]bool{
	"abs": true, "attr": true, "batch": true, "capitalize": true, "center": true, "count": true, "d": true,
	"default": true, "dictsort": true, "e": true, "escape": true, "filesizeformat": true, "first": true,
	"float": true, "forceescape": true, "format": true, "groupby": true, "indent": true, "int": true,
	"items": true, "join": true, "last": true, "length": true, "list": true, "lower": true, "map": true,
	"max": true, "min": true, "pprint": true, "random": true, "reject": true, "rejectattr": true, "replace": true,
	"reverse": true, "round": true, "safe": true, "select": true, "selectattr": true, "slice": true, "sort": true,
	"string": true, "striptags": true, "sum": true, "title": true, "tojson": true, "trim": true, "truncate": true,
	"unique": true, "upper": true, "urlencode": true, "urlize": true, "wordcount": true, "wordwrap": true,
	"xmlattr": true,
}

type emitter struct {
	err     error
	rename  map[string]string      // names written as other expressions (a two-name loop's filter)
	depth   int                    // how deeply the expression being written nests
	defined func(name string) bool // names that never hold an undefined value (nil: none)
}

// maxExprDepth bounds how deeply a written expression nests (a chain of a + b + ... nests one level per operator):
// the engine parses and evaluates it recursively. Real templates chain a few dozen operators.
const maxExprDepth = 1024

func (e *emitter) fail(err error) string {
	if e.err == nil {
		e.err = err
	}
	return "none"
}

// quoteEngine writes s as a string literal the engine reads back as s.
func quoteEngine(s string) string {
	s = strings.ReplaceAll(s, `\`, `\\`)
	return "'" + strings.ReplaceAll(s, "'", `\'`) + "'"
}

func (e *emitter) list(items []jNode) string {
	parts := make([]string, len(items))
	for i, it := range items {
		parts[i] = e.expr(it)
	}
	return strings.Join(parts, ", ")
}

// args writes a call's arguments: positional, then name=value.
func (e *emitter) args(a jArgs, first ...string) string {
	parts := append([]string(nil), first...)
	for _, x := range a.args {
		parts = append(parts, e.expr(x))
	}
	for i, k := range a.kwNames {
		parts = append(parts, k+"="+e.expr(a.kwVals[i]))
	}
	return strings.Join(parts, ", ")
}

// dynCall writes a call with *args or **kwargs through pyCall: (fn, positional list, *args, keywords, **kwargs).
func (e *emitter) dynCall(fn string, a jArgs, first ...string) string {
	pos := append([]string(nil), first...)
	for _, x := range a.args {
		pos = append(pos, e.expr(x))
	}
	kw := make([]string, len(a.kwNames))
	for i, k := range a.kwNames {
		kw[i] = quoteEngine(k) + ": " + e.expr(a.kwVals[i])
	}
	dyn, dkw := "none", "none"
	if a.dyn != nil {
		dyn = e.expr(a.dyn)
	}
	if a.dkw != nil {
		dkw = e.expr(a.dkw)
	}
	return pyCallName + "(" + fn + ", [" + strings.Join(pos, ", ") + "], " + dyn + ", { " + strings.Join(kw, ", ") + " }, " + dkw + ")"
}

// isMarkup reports whether n is a Markup string in jinja2 (safe or escape, or + with one): Markup's + escapes the
// other side.
func isMarkup(n jNode) bool {
	switch n := n.(type) {
	case *jFilter:
		return n.name == "safe" || n.name == "e" || n.name == "escape" || n.name == "forceescape"
	case *jBin:
		return n.op == "+" && (isMarkup(n.l) || isMarkup(n.r))
	}
	return false
}

func (e *emitter) expr(n jNode) string {
	e.depth++
	defer func() { e.depth-- }()
	if e.depth > maxExprDepth {
		return e.fail(fmt.Errorf("%w: an expression nests more than %d operations", errRecursion, maxExprDepth))
	}
	switch n := n.(type) {
	case *jName:
		if r, ok := e.rename[n.name]; ok {
			return r
		}
		return n.name
	case *jConst:
		switch v := n.v.(type) {
		case string:
			return quoteEngine(v)
		case int64:
			return strconv.FormatInt(v, 10)
		case float64:
			s := strconv.FormatFloat(v, 'f', -1, 64)
			if !strings.Contains(s, ".") {
				s += ".0"
			}
			return s
		case bool:
			return strconv.FormatBool(v)
		}
		return "none"
	case *jList:
		return "[" + e.list(n.items) + "]"
	case *jDict:
		parts := make([]string, len(n.keys))
		for i := range n.keys {
			k := e.expr(n.keys[i])
			switch c, _ := n.keys[i].(*jConst); {
			case c != nil && c.v == nil:
				k = quoteEngine("None")
			case c != nil:
				if _, isStr := c.v.(string); !isStr {
					k = quoteEngine(pyKey(constValue(c)))
				}
			default:
				k = pyKeyName + "(" + k + ")"
			}
			parts[i] = k + ": " + e.expr(n.vals[i])
		}
		return "{ " + strings.Join(parts, ", ") + " }"
	case *jAttr:
		if methodNames[n.name] {
			return pyAttrName + "(" + e.expr(n.obj) + ", " + quoteEngine(n.name) + ")"
		}
		return e.definedObj(n.obj) + "." + n.name
	case *jItem:
		if s, ok := n.key.(*jSlice); ok {
			part := func(x jNode) string {
				if x == nil {
					return ""
				}
				return e.expr(x)
			}
			return e.definedObj(n.obj) + "[" + part(s.start) + ":" + part(s.stop) + ":" + part(s.step) + "]"
		}
		if c, ok := n.key.(*jConst); ok {
			if _, isStr := c.v.(string); isStr {
				return e.definedObj(n.obj) + "[" + e.expr(n.key) + "]"
			}
		}
		return pyItemName + "(" + e.expr(n.obj) + ", " + e.expr(n.key) + ")"
	case *jSlice:
		return e.fail(syntaxErr("a slice outside a subscript"))
	case *jCall:
		if n.dyn != nil || n.dkw != nil {
			return e.dynCall(e.expr(n.fn), n.jArgs)
		}
		return e.expr(n.fn) + "(" + e.args(n.jArgs) + ")"
	case *jFilter:
		return e.filter(n)
	case *jTest:
		return e.test(n)
	case *jBin:
		l, r := e.expr(n.l), e.expr(n.r)
		switch {
		case n.op == "and" || n.op == "or":
			return "(" + l + " " + n.op + " " + r + ")"
		case n.op == "+" && (isMarkup(n.l) || isMarkup(n.r)):
			return pyOpName + "(" + l + ", '+', " + r + ", " + strconv.FormatBool(isMarkup(n.l)) + ", " + strconv.FormatBool(isMarkup(n.r)) + ")"
		}
		op := n.op
		if t, ok := n.r.(*jList); ok && t.tuple && op == "%" {
			op = "%t" // Python's % spreads a tuple, and only a tuple, into the format's arguments
		}
		return pyOpName + "(" + l + ", " + quoteEngine(op) + ", " + r + ")"
	case *jCompare:
		if len(n.ops) > maxExprDepth { // the engine nests a chain of and
			return e.fail(fmt.Errorf("%w: a comparison chains more than %d operators", errRecursion, maxExprDepth))
		}
		prev := e.expr(n.first)
		var parts []string
		for i, op := range n.ops {
			r := e.expr(n.rest[i])
			parts = append(parts, pyOpName+"("+prev+", "+quoteEngine(op)+", "+r+")")
			prev = r
		}
		if len(parts) == 1 {
			return parts[0]
		}
		return "(" + strings.Join(parts, " and ") + ")"
	case *jConcat:
		return pyCatName + "(" + e.list(n.items) + ")"
	case *jUnary:
		if n.op == "not" {
			return "(not " + e.expr(n.x) + ")"
		}
		op := "neg"
		if n.op == "+" {
			op = "pos"
		}
		return pyOpName + "(" + e.expr(n.x) + ", '" + op + "', none)"
	case *jCond:
		s := "(" + e.expr(n.then) + " if " + e.expr(n.cond)
		if n.els != nil {
			s += " else " + e.expr(n.els)
		}
		return s + ")"
	}
	return e.fail(syntaxErr("unsupported expression %T", n))
}

// definedObj writes an object whose attribute or item is read: jinja2 raises UndefinedError reading either from an
// undefined value, where the engine reads an undefined value again.
func (e *emitter) definedObj(n jNode) string {
	switch n := n.(type) {
	case *jConst, *jList, *jDict:
		return e.expr(n)
	case *jName:
		if _, renamed := e.rename[n.name]; !renamed && e.defined != nil && e.defined(n.name) {
			return e.expr(n)
		}
	}
	return pyDefinedName + "(" + e.expr(n) + ")"
}

func (e *emitter) filter(n *jFilter) string {
	obj := e.expr(n.obj)
	if !jinja2Filters[n.name] {
		// jinja2 refuses an unknown filter when it compiles the template, or, inside an if block, when the
		// render reaches it: refusing it when the render reaches it matches the renders jinja2 completes.
		return pyRaiseName + "(" + quoteEngine("TemplateRuntimeError: no filter named '"+n.name+"'") + ")"
	}
	if f, ok := n.obj.(*jFilter); ok && generatorFilters[f.name] {
		switch n.name {
		case "tojson":
			return pyRaiseName + "('TypeError: Object of type generator is not JSON serializable')"
		case "length", "count":
			return pyRaiseName + "('TypeError: object of type \\'generator\\' has no len()')"
		}
	}
	if c, ok := firstArg(n.jArgs).(*jConst); ok && n.name == "map" {
		// map('name', ...) calls the filter of that name: the prepared source passes its callable.
		if f, isStr := c.v.(string); isStr && jinja2Filters[f] {
			fn, helper := filterHelpers[f]
			if !helper {
				fn = "__filter_" + f // the engine keeps its builtin filters under these names
			}
			n.kwNames, n.kwVals = append(n.kwNames, filterArgName), append(n.kwVals, &jName{name: fn})
		}
	}
	name, helper := filterHelpers[n.name]
	if n.dyn != nil || n.dkw != nil {
		if !helper {
			name = "__filter_" + n.name // the engine keeps its builtin filters under these names
		}
		return e.dynCall(name, n.jArgs, obj)
	}
	if !helper {
		name = n.name
	}
	if len(n.args) == 0 && len(n.kwNames) == 0 {
		return "((" + obj + ")|" + name + ")"
	}
	return "((" + obj + ")|" + name + "(" + e.args(n.jArgs) + "))"
}

func (e *emitter) test(n *jTest) string {
	if !jinja2Tests[n.name] {
		return pyRaiseName + "(" + quoteEngine("TemplateRuntimeError: no test named '"+n.name+"'") + ")"
	}
	if n.dyn != nil || n.dkw != nil {
		return e.fail(syntaxErr("*args in a test"))
	}
	obj := e.expr(n.obj)
	if n.name == "defined" || n.name == "undefined" || n.name == "none" {
		not := ""
		if n.neg {
			not = "not "
		}
		return "(" + obj + " is " + not + n.name + ")"
	}
	s := pyTestName + "(" + e.args(n.jArgs, obj, quoteEngine(n.name)) + ")"
	if n.neg {
		return "(not " + s + ")"
	}
	return s
}

// constValue is a constant's value for the engine.
func constValue(c *jConst) jinja.Value {
	switch v := c.v.(type) {
	case string:
		return jinja.NewString(v)
	case int64:
		return jinja.NewInt(v)
	case float64:
		return jinja.NewFloat(v)
	case bool:
		return jinja.NewBool(v)
	}
	return jinja.None()
}

func firstArg(a jArgs) jNode {
	if len(a.args) == 0 {
		return nil
	}
	return a.args[0]
}
