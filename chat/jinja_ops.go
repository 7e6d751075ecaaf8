package chat

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/ardanlabs/jinja"
)

// Helpers that the prepared source calls (jinja_emit.go) where the engine's semantics differ from Python's, as
// jinja2 evaluates a template in Hugging Face's immutable sandbox: arithmetic and comparisons with Python's types
// and TypeErrors, ~, *args and **kwargs, tests, a dict's methods, iteration, join, and macros with varargs.

// errPython is a Python exception the template raises in jinja2 (a TypeError, an UndefinedError, the sandbox's
// SecurityError): the render fails as it does there.
var errPython = errors.New("python error")

func pyErr(kind, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", errPython, kind, fmt.Sprintf(format, args...))
}

// pyType is Python's type(v).__name__.
func pyType(v jinja.Value) string {
	switch {
	case v.IsUndefined():
		return "Undefined"
	case v.IsNone():
		return "NoneType"
	case v.IsBool():
		return "bool"
	case v.IsInt():
		return "int"
	case v.IsFloat():
		return "float"
	case v.IsString():
		return "str"
	case v.IsList():
		return "list"
	case v.IsDict():
		return "dict"
	}
	return "function"
}

func errUndefined() error { return pyErr("UndefinedError", "an undefined value is used") }

// pyNum reads a number as Python does (a bool is an int); ok is false for anything else.
func pyNum(v jinja.Value) (i int64, f float64, isFloat, ok bool) {
	switch {
	case v.IsBool():
		if v.AsBool() {
			return 1, 1, false, true
		}
		return 0, 0, false, true
	case v.IsInt():
		return v.AsInt(), float64(v.AsInt()), false, true
	case v.IsFloat():
		return 0, v.AsFloat(), true, true
	}
	return 0, 0, false, false
}

// pyOp is a binary operator (or "neg", "pos") with Python's semantics: pyOp(a, op, b[, a is Markup, b is Markup]).
func pyOp(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) < 3 || !args[1].IsString() {
		return jinja.Undefined(), fmt.Errorf("%s: bad arguments", pyOpName)
	}
	a, op, b := args[0], args[1].AsString(), args[2]
	if len(args) == 5 {
		return markupAdd(a, b, args[3].IsTruthy(), args[4].IsTruthy())
	}
	switch op {
	case "==":
		return jinja.NewBool(pyEq(a, b)), nil
	case "!=":
		return jinja.NewBool(!pyEq(a, b)), nil
	case "in", "not in":
		in, err := pyIn(a, b)
		return jinja.NewBool(in == (op == "in")), err
	case "<", ">", "<=", ">=":
		c, err := pyCompare(a, b, op)
		if err != nil {
			return jinja.Undefined(), err
		}
		return jinja.NewBool(map[string]bool{"<": c < 0, ">": c > 0, "<=": c <= 0, ">=": c >= 0}[op]), nil
	case "neg", "pos":
		if a.IsUndefined() {
			return jinja.Undefined(), errUndefined()
		}
		i, f, isFloat, ok := pyNum(a)
		if !ok {
			return jinja.Undefined(), pyErr("TypeError", "bad operand type for unary %s: '%s'", map[string]string{"neg": "-", "pos": "+"}[op], pyType(a))
		}
		if op == "neg" {
			i, f = -i, -f
		}
		if isFloat {
			return jinja.NewFloat(f), nil
		}
		return jinja.NewInt(i), nil
	}
	if a.IsUndefined() || b.IsUndefined() {
		return jinja.Undefined(), errUndefined()
	}
	return pyArith(a, op, b)
}

func pyArith(a jinja.Value, op string, b jinja.Value) (jinja.Value, error) {
	unsupported := func() (jinja.Value, error) {
		return jinja.Undefined(), pyErr("TypeError", "unsupported operand type(s) for %s: '%s' and '%s'", op, pyType(a), pyType(b))
	}
	ai, af, aFloat, aNum := pyNum(a)
	bi, bf, bFloat, bNum := pyNum(b)
	switch op {
	case "+":
		switch {
		case a.IsString() && b.IsString():
			return jinja.NewString(a.AsString() + b.AsString()), nil
		case a.IsList() && b.IsList():
			items := append(append([]jinja.Value(nil), a.AsList().Items...), b.AsList().Items...)
			return jinja.NewList(items), nil
		case a.IsString() || a.IsList():
			return jinja.Undefined(), pyErr("TypeError", "can only concatenate %s (not \"%s\") to %s", pyType(a), pyType(b), pyType(a))
		}
	case "*":
		switch {
		case (a.IsString() || a.IsList()) && bNum && !bFloat:
			return pyRepeat(a, bi)
		case (b.IsString() || b.IsList()) && aNum && !aFloat:
			return pyRepeat(b, ai)
		}
	case "%":
		if a.IsString() {
			fargs := []jinja.Value{a}
			if b.IsList() {
				fargs = append(fargs, b.AsList().Items...)
			} else if !b.IsDict() {
				fargs = append(fargs, b)
			}
			var kw map[string]jinja.Value
			if b.IsDict() {
				kw = b.AsDict().Data
			}
			return pyFormat(fargs, kw)
		}
	}
	if !aNum || !bNum {
		return unsupported()
	}
	isFloat := aFloat || bFloat
	// Python's ints have no bound; the engine's are 64 bits: a result past them fails the render rather than wrap.
	overflow := func() (jinja.Value, error) {
		return jinja.Undefined(), pyErr("OverflowError", "%d %s %d does not fit in 64 bits", ai, op, bi)
	}
	switch op {
	case "+":
		if isFloat {
			return jinja.NewFloat(af + bf), nil
		}
		if r := ai + bi; (r > ai) == (bi > 0) || bi == 0 {
			return jinja.NewInt(r), nil
		}
		return overflow()
	case "-":
		if isFloat {
			return jinja.NewFloat(af - bf), nil
		}
		if r := ai - bi; (r < ai) == (bi > 0) || bi == 0 {
			return jinja.NewInt(r), nil
		}
		return overflow()
	case "*":
		if isFloat {
			return jinja.NewFloat(af * bf), nil
		}
		if r := ai * bi; ai == 0 || (r/ai == bi && !(ai == -1 && bi == math.MinInt64) && !(bi == -1 && ai == math.MinInt64)) {
			return jinja.NewInt(r), nil
		}
		return overflow()
	case "/":
		if bf == 0 {
			return jinja.Undefined(), pyErr("ZeroDivisionError", "division by zero")
		}
		return jinja.NewFloat(af / bf), nil
	case "//", "%":
		if bf == 0 {
			return jinja.Undefined(), pyErr("ZeroDivisionError", "integer division or modulo by zero")
		}
		if isFloat {
			q := math.Floor(af / bf)
			if op == "//" {
				return jinja.NewFloat(q), nil
			}
			return jinja.NewFloat(af - q*bf), nil
		}
		q := ai / bi
		if (ai%bi != 0) && ((ai < 0) != (bi < 0)) {
			q--
		}
		if op == "//" {
			return jinja.NewInt(q), nil
		}
		return jinja.NewInt(ai - q*bi), nil
	case "**":
		if !isFloat && bi >= 0 {
			r := int64(1)
			for range bi {
				if ai == 0 || ai == 1 || r == 0 {
					break
				}
				next := r * ai
				if next/ai != r {
					return overflow()
				}
				r = next
			}
			if ai == -1 && bi%2 == 1 {
				r = -1
			}
			return jinja.NewInt(r), nil
		}
		return jinja.NewFloat(math.Pow(af, bf)), nil
	}
	return unsupported()
}

// maxRepeat bounds the size of a repeated string (bytes) or list (items): a real template repeats a few characters
// for a rule or an indent.
const maxRepeat = 1 << 24

func pyRepeat(v jinja.Value, n int64) (jinja.Value, error) {
	n = max(n, 0)
	size := int64(1)
	if v.IsString() {
		size = int64(len(v.AsString()))
	} else {
		size = int64(v.AsList().Len())
	}
	if size > 0 && n > maxRepeat/size {
		return jinja.Undefined(), fmt.Errorf("%w: a repetition of %d times %d, more than %d", ErrTemplateLimit, n, size, maxRepeat)
	}
	if v.IsString() {
		return jinja.NewString(strings.Repeat(v.AsString(), int(n))), nil
	}
	items := make([]jinja.Value, 0, n*size)
	for range n {
		items = append(items, v.AsList().Items...)
	}
	return jinja.NewList(items), nil
}

// markupAdd is + with a Markup string on one side (jinja2's |safe): the other side is HTML-escaped.
func markupAdd(a, b jinja.Value, aMarkup, bMarkup bool) (jinja.Value, error) {
	if !a.IsString() || !b.IsString() {
		if a.IsUndefined() || b.IsUndefined() {
			return jinja.Undefined(), errUndefined()
		}
		return jinja.Undefined(), pyErr("TypeError", "unsupported operand type(s) for +: '%s' and '%s'", pyType(a), pyType(b))
	}
	l, r := a.AsString(), b.AsString()
	if !aMarkup {
		l = markupEscape(l)
	}
	if !bMarkup {
		r = markupEscape(r)
	}
	return jinja.NewString(l + r), nil
}

var markupReplacer = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", "'", "&#39;", `"`, "&#34;")

func markupEscape(s string) string { return markupReplacer.Replace(s) }

// pyEq is Python's ==.
func pyEq(a, b jinja.Value) bool {
	_, af, _, aNum := pyNum(a)
	_, bf, _, bNum := pyNum(b)
	switch {
	case aNum && bNum:
		ai, _, aFloat, _ := pyNum(a)
		bi, _, bFloat, _ := pyNum(b)
		if !aFloat && !bFloat {
			return ai == bi
		}
		return af == bf
	case a.IsList() && b.IsList():
		x, y := a.AsList().Items, b.AsList().Items
		if len(x) != len(y) {
			return false
		}
		for i := range x {
			if !pyEq(x[i], y[i]) {
				return false
			}
		}
		return true
	case a.IsDict() && b.IsDict():
		x, y := a.AsDict(), b.AsDict()
		if x.Len() != y.Len() {
			return false
		}
		for _, k := range x.Keys {
			v, ok := y.Get(k)
			if !ok || !pyEq(x.Data[k], v) {
				return false
			}
		}
		return true
	case a.IsCallable() || b.IsCallable():
		return false
	}
	return a.Equals(b)
}

// pyCompare orders a and b as Python's <, or fails with its TypeError.
func pyCompare(a, b jinja.Value, op string) (int, error) {
	if a.IsUndefined() || b.IsUndefined() {
		return 0, errUndefined()
	}
	_, af, _, aNum := pyNum(a)
	_, bf, _, bNum := pyNum(b)
	switch {
	case aNum && bNum:
		ai, _, aFloat, _ := pyNum(a)
		bi, _, bFloat, _ := pyNum(b)
		if !aFloat && !bFloat {
			return cmp3(ai < bi, ai > bi), nil
		}
		return cmp3(af < bf, af > bf), nil
	case a.IsString() && b.IsString():
		return strings.Compare(a.AsString(), b.AsString()), nil
	case a.IsList() && b.IsList():
		x, y := a.AsList().Items, b.AsList().Items
		for i := 0; i < len(x) && i < len(y); i++ {
			if pyEq(x[i], y[i]) {
				continue
			}
			return pyCompare(x[i], y[i], op)
		}
		return cmp3(len(x) < len(y), len(x) > len(y)), nil
	}
	return 0, pyErr("TypeError", "'%s' not supported between instances of '%s' and '%s'", op, pyType(a), pyType(b))
}

func cmp3(less, more bool) int {
	switch {
	case less:
		return -1
	case more:
		return 1
	}
	return 0
}

// pyIn is Python's a in b.
func pyIn(a, b jinja.Value) (bool, error) {
	switch {
	case b.IsString():
		if !a.IsString() {
			if a.IsUndefined() {
				return false, errUndefined()
			}
			return false, pyErr("TypeError", "'in <string>' requires string as left operand, not %s", pyType(a))
		}
		return strings.Contains(b.AsString(), a.AsString()), nil
	case b.IsList():
		for _, it := range b.AsList().Items {
			if pyEq(a, it) {
				return true, nil
			}
		}
		return false, nil
	case b.IsDict():
		return b.AsDict().Has(pyKey(a)), nil
	case b.IsUndefined():
		return false, nil
	}
	return false, pyErr("TypeError", "argument of type '%s' is not iterable", pyType(b))
}

// pyCat is ~: the operands' str() joined, an undefined one as the empty string.
func pyCat(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	var b strings.Builder
	for _, a := range args {
		if !a.IsUndefined() {
			b.WriteString(pyStr(a))
		}
	}
	return jinja.NewString(b.String()), nil
}

// pyAttr is obj.name for the names in methodNames: a dict's methods come before its keys; the methods that
// modify a list or a dict fail when called, as the immutable sandbox's SecurityError.
func pyAttr(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) != 2 || !args[1].IsString() {
		return jinja.Undefined(), fmt.Errorf("%s: bad arguments", pyAttrName)
	}
	obj, name := args[0], args[1].AsString()
	unsafe := func() (jinja.Value, error) {
		return jinja.NewCallable(name, func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
			return jinja.Undefined(), pyErr("SecurityError", "access to attribute '%s' of '%s' object is unsafe.", name, pyType(obj))
		}), nil
	}
	switch {
	case obj.IsUndefined():
		return jinja.Undefined(), errUndefined()
	case obj.IsDict():
		d := obj.AsDict()
		switch name {
		case "items", "keys", "values":
			return jinja.NewCallable("dict."+name, func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
				items := make([]jinja.Value, 0, d.Len())
				for _, k := range d.Keys {
					switch name {
					case "items":
						items = append(items, jinja.NewList([]jinja.Value{pyKeyValue(k), d.Data[k]}))
					case "keys":
						items = append(items, pyKeyValue(k))
					default:
						items = append(items, d.Data[k])
					}
				}
				return jinja.NewList(items), nil
			}), nil
		case "get":
			return jinja.NewCallable("dict.get", func(a []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
				if len(a) == 0 || len(a) > 2 {
					return jinja.Undefined(), pyErr("TypeError", "get expected 1 or 2 arguments, got %d", len(a))
				}
				if v, ok := d.Get(pyKey(a[0])); ok {
					return v, nil
				}
				if len(a) == 2 {
					return a[1], nil
				}
				return jinja.None(), nil
			}), nil
		case "copy":
			return jinja.NewCallable("dict.copy", func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
				c := jinja.NewDict()
				for _, k := range d.Keys {
					c.AsDict().Set(k, d.Data[k])
				}
				return c, nil
			}), nil
		case "pop", "update", "setdefault", "popitem", "clear":
			return unsafe()
		}
		if v, ok := d.Get(name); ok {
			return v, nil
		}
	case obj.IsList():
		switch name {
		case "copy":
			items := obj.AsList().Items
			return jinja.NewCallable("list.copy", func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
				return jinja.NewList(append([]jinja.Value(nil), items...)), nil
			}), nil
		case "append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse":
			return unsafe()
		}
	}
	return jinja.Undefined(), nil
}

// pyCall is a call with *args or **kwargs: pyCall(fn, positional, *args, keywords, **kwargs); a call block's
// caller passes through.
func pyCall(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) != 5 || !args[1].IsList() || !args[3].IsDict() {
		return jinja.Undefined(), fmt.Errorf("%s: bad arguments", pyCallName)
	}
	fn := args[0]
	if !fn.IsCallable() {
		if fn.IsUndefined() {
			return jinja.Undefined(), errUndefined()
		}
		return jinja.Undefined(), pyErr("TypeError", "'%s' object is not callable", pyType(fn))
	}
	pos := append([]jinja.Value(nil), args[1].AsList().Items...)
	if dyn := args[2]; !dyn.IsNone() {
		items, err := pyIterItems(dyn)
		if err != nil {
			return jinja.Undefined(), err
		}
		pos = append(pos, items...)
	}
	kw := map[string]jinja.Value{}
	for k, v := range kwargs {
		kw[k] = v
	}
	for k, v := range args[3].AsDict().Data {
		kw[k] = v
	}
	if dkw := args[4]; !dkw.IsNone() {
		if !dkw.IsDict() {
			return jinja.Undefined(), pyErr("TypeError", "argument after ** must be a mapping, not %s", pyType(dkw))
		}
		for _, k := range dkw.AsDict().Keys {
			if _, dup := kw[k]; dup {
				return jinja.Undefined(), pyErr("TypeError", "got multiple values for keyword argument '%s'", k)
			}
			kw[k] = dkw.AsDict().Data[k]
		}
	}
	return fn.AsCallable().Fn(pos, kw)
}

// pyIterItems is what Python's iteration over v yields: a list's items, a dict's keys, a string's characters,
// nothing for an undefined value; anything else is a TypeError.
func pyIterItems(v jinja.Value) ([]jinja.Value, error) {
	switch {
	case v.IsList():
		return v.AsList().Items, nil
	case v.IsDict():
		keys := make([]jinja.Value, 0, v.AsDict().Len())
		for _, k := range v.AsDict().Keys {
			keys = append(keys, pyKeyValue(k))
		}
		return keys, nil
	case v.IsString():
		var chars []jinja.Value
		for _, r := range v.AsString() {
			chars = append(chars, jinja.NewString(string(r)))
		}
		return chars, nil
	case v.IsUndefined():
		return nil, nil
	}
	return nil, pyErr("TypeError", "'%s' object is not iterable", pyType(v))
}

// pyIter is a for loop's iterable: a list as it stands, else what Python's iteration yields.
func pyIter(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) != 1 {
		return jinja.Undefined(), fmt.Errorf("%s: bad arguments", pyIterName)
	}
	if args[0].IsList() {
		return args[0], nil
	}
	items, err := pyIterItems(args[0])
	return jinja.NewList(items), err
}

// pyJoin is the join filter: join(value, d=”, attribute=None), each item as Python's str().
func pyJoin(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), pyErr("TypeError", "join: no value")
	}
	sep := ""
	if len(args) > 1 {
		sep = pyStr(args[1])
	} else if d, ok := kwargs["d"]; ok {
		sep = pyStr(d)
	}
	attr, hasAttr := kwargs["attribute"]
	if len(args) > 2 {
		attr, hasAttr = args[2], true
	}
	items, err := pyIterItems(args[0])
	if err != nil {
		return jinja.Undefined(), err
	}
	parts := make([]string, len(items))
	for i, it := range items {
		if hasAttr && it.IsDict() {
			it, _ = it.AsDict().Get(pyStr(attr))
		}
		if !it.IsUndefined() {
			parts[i] = pyStr(it)
		}
	}
	return jinja.NewString(strings.Join(parts, sep)), nil
}

// pyRaise fails the render with its message (a Python error the prepared source knows of in advance).
func pyRaise(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	msg := "error"
	if len(args) > 0 {
		msg = pyStr(args[0])
	}
	return jinja.Undefined(), fmt.Errorf("%w: %s", errPython, msg)
}

// pyMacro wraps a macro that reads varargs or kwargs: pyMacro(macro, name, parameter names, takes varargs,
// takes kwargs). The wrapper passes the extra positional arguments as varargs and the extra keywords as kwargs,
// and refuses them, as jinja2 does, where the macro does not read them.
func pyMacro(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) != 5 || !args[0].IsCallable() || !args[2].IsList() {
		return jinja.Undefined(), fmt.Errorf("%s: bad arguments", pyMacroName)
	}
	inner, name, takesVar, takesKw := args[0].AsCallable(), pyStr(args[1]), args[3].IsTruthy(), args[4].IsTruthy()
	params := map[string]bool{"caller": true}
	for _, p := range args[2].AsList().Items {
		params[pyStr(p)] = true
	}
	n := args[2].AsList().Len()
	return jinja.NewCallable(name, func(a []jinja.Value, kw map[string]jinja.Value) (jinja.Value, error) {
		if len(a) > n && !takesVar {
			return jinja.Undefined(), pyErr("TypeError", "macro '%s' takes not more than %d argument(s)", name, n)
		}
		pass := map[string]jinja.Value{}
		extra := jinja.NewDict()
		for k, v := range kw {
			switch {
			case params[k]:
				pass[k] = v
			case takesKw:
				extra.AsDict().Set(k, v)
			default:
				return jinja.Undefined(), pyErr("TypeError", "macro '%s' takes no keyword argument '%s'", name, k)
			}
		}
		var rest []jinja.Value
		if len(a) > n {
			rest, a = a[n:], a[:n]
		}
		pass["varargs"] = jinja.NewList(append([]jinja.Value(nil), rest...))
		pass["kwargs"] = extra
		return inner.Fn(a, pass)
	}), nil
}

// pyTest is `value is name(args)` for jinja2's tests (defined, undefined and none are the engine's own).
func pyTest(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) < 2 || !args[1].IsString() {
		return jinja.Undefined(), fmt.Errorf("%s: bad arguments", pyTestName)
	}
	v, name, rest := args[0], args[1].AsString(), args[2:]
	arg := func() (jinja.Value, error) {
		if len(rest) == 0 {
			return jinja.Undefined(), pyErr("TypeError", "test %s takes an argument", name)
		}
		return rest[0], nil
	}
	var ok bool
	switch name {
	case "odd", "even", "divisibleby":
		d := jinja.NewInt(2)
		if name == "divisibleby" {
			var err error
			if d, err = arg(); err != nil {
				return jinja.Undefined(), err
			}
		}
		m, err := pyOp([]jinja.Value{v, jinja.NewString("%"), d}, nil)
		if err != nil {
			return jinja.Undefined(), err
		}
		want := int64(0)
		if name == "odd" {
			want = 1
		}
		ok = pyEq(m, jinja.NewInt(want))
	case "defined":
		ok = !v.IsUndefined()
	case "undefined":
		ok = v.IsUndefined()
	case "none":
		ok = v.IsNone()
	case "boolean":
		ok = v.IsBool()
	case "true", "false":
		ok = v.IsBool() && v.AsBool() == (name == "true")
	case "integer":
		ok = v.IsInt()
	case "float":
		ok = v.IsFloat()
	case "number":
		ok = v.IsInt() || v.IsFloat() || v.IsBool()
	case "string":
		ok = v.IsString()
	case "mapping":
		ok = v.IsDict()
	case "sequence":
		ok = v.IsString() || v.IsList() || v.IsDict() || v.IsUndefined()
	case "iterable":
		ok = v.IsString() || v.IsList() || v.IsDict() || v.IsUndefined()
	case "callable":
		ok = v.IsCallable()
	case "escaped":
		ok = false
	case "lower", "upper":
		s := pyStr(v)
		cased, other := false, false
		for _, r := range s {
			if unicode.IsUpper(r) || unicode.IsLower(r) || unicode.IsTitle(r) {
				cased = true
				if (name == "lower") != unicode.IsLower(r) {
					other = true
				}
			}
		}
		ok = cased && !other
	case "sameas":
		o, err := arg()
		if err != nil {
			return jinja.Undefined(), err
		}
		switch {
		case v.IsNone() || v.IsBool():
			ok = v.Equals(o)
		case v.IsInt() && o.IsInt():
			ok = v.AsInt() == o.AsInt() && v.AsInt() >= -5 && v.AsInt() <= 256 // CPython's cached small ints
		}
	case "in":
		o, err := arg()
		if err != nil {
			return jinja.Undefined(), err
		}
		if ok, err = pyIn(v, o); err != nil {
			return jinja.Undefined(), err
		}
	case "filter":
		ok = v.IsString() && jinja2Filters[v.AsString()]
	case "test":
		ok = v.IsString() && jinja2Tests[v.AsString()]
	default:
		op, known := map[string]string{"==": "==", "eq": "==", "equalto": "==", "!=": "!=", "ne": "!=", ">": ">",
			"gt": ">", "greaterthan": ">", ">=": ">=", "ge": ">=", "<": "<", "lt": "<", "lessthan": "<",
			"<=": "<=", "le": "<="}[name]
		if !known {
			return jinja.Undefined(), pyErr("TemplateRuntimeError", "no test named '%s'", name)
		}
		o, err := arg()
		if err != nil {
			return jinja.Undefined(), err
		}
		return pyOp([]jinja.Value{v, jinja.NewString(op), o}, nil)
	}
	return jinja.NewBool(ok), nil
}

// The engine's dicts have string keys; a Python dict may have int keys (a template's lookup table such as
// {512: 128}). The prepared source writes such a key as intKeyPrefix and its decimal digits, and the helpers that
// read a dict's keys (iteration, items(), ~, tojson, dictsort, subscripts, in) read it back as the int.
const intKeyPrefix = "\x00int:"

// pyKey is the engine's key for the Python key v (bool and integral floats are ints, as Python hashes them).
func pyKey(v jinja.Value) string {
	switch {
	case v.IsString():
		return v.AsString()
	case v.IsBool(), v.IsInt():
		i, _, _, _ := pyNum(v)
		return intKeyPrefix + strconv.FormatInt(i, 10)
	case v.IsFloat() && v.AsFloat() == math.Trunc(v.AsFloat()) && math.Abs(v.AsFloat()) < 1<<53:
		return intKeyPrefix + strconv.FormatInt(int64(v.AsFloat()), 10)
	}
	return pyStr(v)
}

// pyKeyValue is the Python key the engine's key k stands for.
func pyKeyValue(k string) jinja.Value {
	if digits, ok := strings.CutPrefix(k, intKeyPrefix); ok {
		if i, err := strconv.ParseInt(digits, 10, 64); err == nil {
			return jinja.NewInt(i)
		}
	}
	return jinja.NewString(k)
}

// pyKeyFn is a dict literal's computed key: pyKey.
func pyKeyFn(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) != 1 {
		return jinja.Undefined(), fmt.Errorf("%s: bad arguments", pyKeyName)
	}
	return jinja.NewString(pyKey(args[0])), nil
}

// pyItem is obj[key] for a key other than a string constant, as jinja2's getitem: a list's or a string's index
// (negative from the end), a dict's key; an undefined value where there is none.
func pyItem(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) != 2 {
		return jinja.Undefined(), fmt.Errorf("%s: bad arguments", pyItemName)
	}
	obj, key := args[0], args[1]
	index := func(n int) (int, bool) {
		i, _, isFloat, ok := pyNum(key)
		if !ok || isFloat {
			return 0, false
		}
		if i < 0 {
			i += int64(n)
		}
		return int(i), i >= 0 && i < int64(n)
	}
	switch {
	case obj.IsUndefined():
		return jinja.Undefined(), errUndefined()
	case obj.IsList():
		if i, ok := index(obj.AsList().Len()); ok {
			return obj.AsList().Items[i], nil
		}
	case obj.IsString():
		runes := []rune(obj.AsString())
		if i, ok := index(len(runes)); ok {
			return jinja.NewString(string(runes[i])), nil
		}
	case obj.IsDict():
		if v, ok := obj.AsDict().Get(pyKey(key)); ok {
			return v, nil
		}
	}
	return jinja.Undefined(), nil
}

// pyDictsort is the dictsort filter: dictsort(value, case_sensitive=False, by='key', reverse=False).
func pyDictsort(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 || !args[0].IsDict() {
		return jinja.Undefined(), pyErr("TypeError", "dictsort: the value is not a dict")
	}
	opt := func(i int, name string) jinja.Value {
		if len(args) > i {
			return args[i]
		}
		return kwargs[name]
	}
	caseSensitive, byValue, reverse := opt(1, "case_sensitive").IsTruthy(), pyStr(opt(2, "by")) == "value", opt(3, "reverse").IsTruthy()
	d := args[0].AsDict()
	pairs := make([][2]jinja.Value, 0, d.Len())
	for _, k := range d.Keys {
		pairs = append(pairs, [2]jinja.Value{pyKeyValue(k), d.Data[k]})
	}
	sortKey := func(p [2]jinja.Value) jinja.Value {
		v := p[0]
		if byValue {
			v = p[1]
		}
		if v.IsString() && !caseSensitive {
			return jinja.NewString(strings.ToLower(v.AsString()))
		}
		return v
	}
	var err error
	slices.SortStableFunc(pairs, func(a, b [2]jinja.Value) int {
		c, e := pyCompare(sortKey(a), sortKey(b), "<")
		if e != nil && err == nil {
			err = e
		}
		if reverse {
			return -c
		}
		return c
	})
	if err != nil {
		return jinja.Undefined(), err
	}
	items := make([]jinja.Value, len(pairs))
	for i, p := range pairs {
		items[i] = jinja.NewList([]jinja.Value{p[0], p[1]})
	}
	return jinja.NewList(items), nil
}

// pyGetAttr is jinja2's attribute path as map, selectattr and join read it: "a.b.0", a dict's key or a list's
// index at each step; an undefined value where there is none.
func pyGetAttr(v jinja.Value, path string) jinja.Value {
	for _, part := range strings.Split(path, ".") {
		key := jinja.NewString(part)
		if n, err := strconv.ParseInt(part, 10, 64); err == nil {
			key = jinja.NewInt(n)
		}
		if v.IsDict() && key.IsString() {
			if m, err := pyAttr([]jinja.Value{v, key}, nil); err == nil && m.IsCallable() {
				v = m
				continue
			}
		}
		var err error
		if v, err = pyItem([]jinja.Value{v, key}, nil); err != nil {
			return jinja.Undefined()
		}
	}
	return v
}

// pySelectFilter returns select, reject, selectattr or rejectattr: (value, [attribute,] test name, test args).
func pySelectFilter(attr, keep bool) func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
	return func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) == 0 || (attr && len(args) < 2) {
			return jinja.Undefined(), pyErr("TypeError", "select: missing arguments")
		}
		if !args[0].IsTruthy() { // jinja2 iterates only a true value (None selects nothing)
			return jinja.NewList(nil), nil
		}
		items, err := pyIterItems(args[0])
		if err != nil {
			return jinja.Undefined(), err
		}
		rest := args[1:]
		path := ""
		if attr {
			path, rest = pyStr(rest[0]), rest[1:]
		}
		var out []jinja.Value
		for _, it := range items {
			v := it
			if attr {
				v = pyGetAttr(it, path)
			}
			var ok bool
			if len(rest) == 0 {
				ok = v.IsTruthy()
			} else {
				r, err := pyTest(append([]jinja.Value{v}, rest...), nil)
				if err != nil {
					return jinja.Undefined(), err
				}
				ok = r.IsTruthy()
			}
			if ok == keep {
				out = append(out, it)
			}
		}
		return jinja.NewList(out), nil
	}
}

// pyMap is the map filter: map(value, attribute=..., default=...) or map(value, filter name, args...), the
// filter's callable passed by the prepared source as filterArgName.
func pyMap(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), pyErr("TypeError", "map: no value")
	}
	if !args[0].IsTruthy() { // jinja2 iterates only a true value (None maps to nothing)
		return jinja.NewList(nil), nil
	}
	items, err := pyIterItems(args[0])
	if err != nil {
		return jinja.Undefined(), err
	}
	out := make([]jinja.Value, len(items))
	if a, ok := kwargs["attribute"]; ok {
		def, hasDef := kwargs["default"]
		for i, it := range items {
			out[i] = pyGetAttr(it, pyStr(a))
			if out[i].IsUndefined() && hasDef {
				out[i] = def
			}
		}
		return jinja.NewList(out), nil
	}
	f, ok := kwargs[filterArgName]
	if !ok || !f.IsCallable() || len(args) < 2 {
		return jinja.Undefined(), pyErr("TemplateRuntimeError", "map: the filter is not known")
	}
	fkw := map[string]jinja.Value{}
	for k, v := range kwargs {
		if k != filterArgName {
			fkw[k] = v
		}
	}
	for i, it := range items {
		if out[i], err = f.AsCallable().Fn(append([]jinja.Value{it}, args[2:]...), fkw); err != nil {
			return jinja.Undefined(), err
		}
	}
	return jinja.NewList(out), nil
}
