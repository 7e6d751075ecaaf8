package chat

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/ardanlabs/jinja"
)

// Helpers of the prepared source for reading values as jinja2 does: attributes (a dict's methods before its keys,
// the sandbox's refusals), subscripts and Python's int dict keys, iteration, calls with *args and **kwargs, macros.

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
	case obj.IsString() && stringMethodFunc(name) != nil:
		return stringMethod(obj.AsString(), name), nil
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

// pyDefined is its argument, or UndefinedError for an undefined one (an attribute or item is read from it).
func pyDefined(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) != 1 || args[0].IsUndefined() {
		return jinja.Undefined(), errUndefined()
	}
	return args[0], nil
}
