package chat

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"unicode"

	"github.com/ardanlabs/jinja"
)

// Helpers of the prepared source for jinja2's filters and tests that the engine lacks or renders differently: join,
// dictsort, select, reject, selectattr, rejectattr, map, and every test.

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
		if hasAttr {
			it = pyGetAttr(it, pyStr(attr))
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

// pyFirstLast returns the first or last filter: an item of a list, a character of a string, a key of a dict; an
// undefined value for an empty one.
func pyFirstLast(last bool) func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
	return func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) == 0 {
			return jinja.Undefined(), pyErr("TypeError", "first: no value")
		}
		items, err := pyIterItems(args[0])
		if err != nil {
			return jinja.Undefined(), err
		}
		if len(items) == 0 {
			return jinja.Undefined(), nil
		}
		if last {
			return items[len(items)-1], nil
		}
		return items[0], nil
	}
}

// pyList is the list filter: what Python's iteration yields (a dict's keys, a string's characters).
func pyList(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), pyErr("TypeError", "list: no value")
	}
	items, err := pyIterItems(args[0])
	return jinja.NewList(append([]jinja.Value(nil), items...)), err
}

// pySort is the sort filter: sort(value, reverse=False, case_sensitive=False, attribute=None), stable.
func pySort(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), pyErr("TypeError", "sort: no value")
	}
	items, err := pyIterItems(args[0])
	if err != nil {
		return jinja.Undefined(), err
	}
	items = append([]jinja.Value(nil), items...)
	reverse, _ := argOr(args[1:], kwargs, 0, "reverse")
	caseSensitive, _ := argOr(args[1:], kwargs, 1, "case_sensitive")
	attr, hasAttr := argOr(args[1:], kwargs, 2, "attribute")
	key := func(v jinja.Value) jinja.Value {
		if hasAttr && !attr.IsNone() {
			v = pyGetAttr(v, pyStr(attr))
		}
		if v.IsString() && !caseSensitive.IsTruthy() {
			return jinja.NewString(strings.ToLower(v.AsString()))
		}
		return v
	}
	var cmpErr error
	slices.SortStableFunc(items, func(a, b jinja.Value) int {
		c, err := pyCompare(key(a), key(b), "<")
		if err != nil && cmpErr == nil {
			cmpErr = err
		}
		if reverse.IsTruthy() {
			return -c
		}
		return c
	})
	if cmpErr != nil {
		return jinja.Undefined(), cmpErr
	}
	return jinja.NewList(items), nil
}

// pySum is the sum filter: sum(iterable, attribute=None, start=0).
func pySum(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), pyErr("TypeError", "sum: no value")
	}
	items, err := pyIterItems(args[0])
	if err != nil {
		return jinja.Undefined(), err
	}
	attr, hasAttr := argOr(args[1:], kwargs, 0, "attribute")
	total, ok := argOr(args[1:], kwargs, 1, "start")
	if !ok {
		total = jinja.NewInt(0)
	}
	for _, it := range items {
		if hasAttr && !attr.IsNone() {
			it = pyGetAttr(it, pyStr(attr))
		}
		if total, err = pyOp([]jinja.Value{total, jinja.NewString("+"), it}, nil); err != nil {
			return jinja.Undefined(), err
		}
	}
	return total, nil
}

// pyRound is the round filter: round(value, precision=0, method='common'), 'common' as Python's round (half to
// even), 'ceil' and 'floor'; always a float.
func pyRound(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), pyErr("TypeError", "round: no value")
	}
	_, f, _, ok := pyNum(args[0])
	if !ok {
		return jinja.Undefined(), pyErr("TypeError", "type %s doesn't define __round__ method", pyType(args[0]))
	}
	prec := int64(0)
	if p, has := argOr(args[1:], kwargs, 0, "precision"); has {
		prec, _, _, _ = pyNum(p)
	}
	method := "common"
	if m, has := argOr(args[1:], kwargs, 1, "method"); has {
		method = pyStr(m)
	}
	scale := math.Pow(10, float64(prec))
	switch method {
	case "common":
		return jinja.NewFloat(math.RoundToEven(f*scale) / scale), nil
	case "ceil":
		return jinja.NewFloat(math.Ceil(f*scale) / scale), nil
	case "floor":
		return jinja.NewFloat(math.Floor(f*scale) / scale), nil
	}
	return jinja.Undefined(), pyErr("FilterArgumentError", "method must be common, ceil or floor")
}
