package chat

import (
	"fmt"
	"strings"
	"unicode"

	"github.com/ardanlabs/jinja"
)

// stringMethodFunc returns the str methods pyAttr gives as Python has them, where the engine's differ (split's maxsplit
// and None separator, join, startswith and endswith with a tuple, format with names); the engine's own serve the
// rest.
func stringMethodFunc(name string) func(s string, args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	switch name {
	case "split", "rsplit":
		return strSplit
	case "join":
		return strJoin
	case "startswith", "endswith":
		return strAffix
	case "format":
		return strFormat
	case "title":
		return strCase(pyTitle)
	case "capitalize":
		return strCase(pyCapitalize)
	}
	return nil
}

// stringMethod returns s's method name as a callable.
func stringMethod(s, name string) jinja.Value {
	fn := stringMethodFunc(name)
	return jinja.NewCallable("str."+name, func(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
		if name == "rsplit" || name == "endswith" {
			kwargs = withFlag(kwargs, "parley_right")
		}
		return fn(s, args, kwargs)
	})
}

func withFlag(kw map[string]jinja.Value, flag string) map[string]jinja.Value {
	out := map[string]jinja.Value{flag: jinja.NewBool(true)}
	for k, v := range kw {
		out[k] = v
	}
	return out
}

func argOr(args []jinja.Value, kwargs map[string]jinja.Value, i int, name string) (jinja.Value, bool) {
	if len(args) > i {
		return args[i], true
	}
	v, ok := kwargs[name]
	return v, ok
}

// strSplit is str.split and str.rsplit: (sep=None, maxsplit=-1).
func strSplit(s string, args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	right := kwargs["parley_right"].IsTruthy()
	max := int64(-1)
	if m, ok := argOr(args, kwargs, 1, "maxsplit"); ok {
		i, _, isFloat, num := pyNum(m)
		if !num || isFloat {
			return jinja.Undefined(), pyErr("TypeError", "'%s' object cannot be interpreted as an integer", pyType(m))
		}
		max = i
	}
	var parts []string
	sep, hasSep := argOr(args, kwargs, 0, "sep")
	if hasSep && !sep.IsNone() {
		if !sep.IsString() {
			return jinja.Undefined(), pyErr("TypeError", "must be str or None, not %s", pyType(sep))
		}
		if sep.AsString() == "" {
			return jinja.Undefined(), pyErr("ValueError", "empty separator")
		}
		switch {
		case max < 0:
			parts = strings.Split(s, sep.AsString())
		case right:
			parts = reverseStrings(strings.SplitN(reverseString(s), reverseString(sep.AsString()), int(max)+1))
			for i := range parts {
				parts[i] = reverseString(parts[i])
			}
		default:
			parts = strings.SplitN(s, sep.AsString(), int(max)+1)
		}
	} else {
		parts = splitWhitespace(s, max, right)
	}
	items := make([]jinja.Value, len(parts))
	for i, p := range parts {
		items[i] = jinja.NewString(p)
	}
	return jinja.NewList(items), nil
}

// splitWhitespace is str.split() with no separator: runs of whitespace separate, at most max times (-1: no bound),
// from the right for rsplit.
func splitWhitespace(s string, max int64, right bool) []string {
	if right {
		parts := splitWhitespace(reverseString(s), max, false)
		for i := range parts {
			parts[i] = reverseString(parts[i])
		}
		return reverseStrings(parts)
	}
	var parts []string
	rest := strings.TrimLeftFunc(s, isPySpace)
	for rest != "" {
		if max >= 0 && int64(len(parts)) == max {
			parts = append(parts, rest)
			break
		}
		end := strings.IndexFunc(rest, isPySpace)
		if end < 0 {
			parts = append(parts, rest)
			break
		}
		parts = append(parts, rest[:end])
		rest = strings.TrimLeftFunc(rest[end:], isPySpace)
	}
	return parts
}

func reverseString(s string) string {
	r := []rune(s)
	for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
		r[i], r[j] = r[j], r[i]
	}
	return string(r)
}

func reverseStrings(s []string) []string {
	for i, j := 0, len(s)-1; i < j; i, j = i+1, j-1 {
		s[i], s[j] = s[j], s[i]
	}
	return s
}

// strJoin is str.join(iterable): every item must be a str.
func strJoin(s string, args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) != 1 {
		return jinja.Undefined(), pyErr("TypeError", "join() takes exactly one argument (%d given)", len(args))
	}
	items, err := pyIterItems(args[0])
	if err != nil {
		return jinja.Undefined(), pyErr("TypeError", "can only join an iterable")
	}
	parts := make([]string, len(items))
	for i, it := range items {
		if !it.IsString() {
			return jinja.Undefined(), pyErr("TypeError", "sequence item %d: expected str instance, %s found", i, pyType(it))
		}
		parts[i] = it.AsString()
	}
	return jinja.NewString(strings.Join(parts, s)), nil
}

// strAffix is str.startswith and str.endswith: a prefix or a tuple (a list here) of them.
func strAffix(s string, args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), pyErr("TypeError", "startswith() takes at least 1 argument (0 given)")
	}
	has := strings.HasPrefix
	if kwargs["parley_right"].IsTruthy() {
		has = strings.HasSuffix
	}
	affixes := []jinja.Value{args[0]}
	if args[0].IsList() {
		affixes = args[0].AsList().Items
	}
	for _, a := range affixes {
		if !a.IsString() {
			return jinja.Undefined(), pyErr("TypeError", "startswith first arg must be str or a tuple of str, not %s", pyType(a))
		}
		if has(s, a.AsString()) {
			return jinja.NewBool(true), nil
		}
	}
	return jinja.NewBool(false), nil
}

// strFormat is str.format for the fields chat templates write: {}, {0}, {name}, {name.attr}, {{ and }}; a
// conversion or a format spec is refused rather than rendered differently.
func strFormat(s string, args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	var b strings.Builder
	auto, manual := 0, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '{' && i+1 < len(s) && s[i+1] == '{', c == '}' && i+1 < len(s) && s[i+1] == '}':
			b.WriteByte(c)
			i++
		case c == '}':
			return jinja.Undefined(), pyErr("ValueError", "Single '}' encountered in format string")
		case c == '{':
			end := strings.IndexByte(s[i:], '}')
			if end < 0 {
				return jinja.Undefined(), pyErr("ValueError", "Single '{' encountered in format string")
			}
			field := s[i+1 : i+end]
			i += end
			if strings.ContainsAny(field, "!:[") {
				return jinja.Undefined(), pyErr("TemplateRuntimeError", "str.format field %q is not supported", field)
			}
			name, path, _ := strings.Cut(field, ".")
			var v jinja.Value
			switch {
			case name == "" && manual, name != "" && auto > 0 && strings.IndexFunc(name, func(r rune) bool { return !unicode.IsDigit(r) }) < 0:
				return jinja.Undefined(), pyErr("ValueError", "cannot switch between manual and automatic field numbering")
			case name == "":
				if auto >= len(args) {
					return jinja.Undefined(), pyErr("IndexError", "Replacement index %d out of range for positional args tuple", auto)
				}
				v = args[auto]
				auto++
			case strings.IndexFunc(name, func(r rune) bool { return !unicode.IsDigit(r) }) < 0:
				var n int
				fmt.Sscan(name, &n)
				manual = true
				if n >= len(args) {
					return jinja.Undefined(), pyErr("IndexError", "Replacement index %d out of range for positional args tuple", n)
				}
				v = args[n]
			default:
				var ok bool
				if v, ok = kwargs[name]; !ok {
					return jinja.Undefined(), pyErr("KeyError", "'%s'", name)
				}
			}
			if path != "" {
				v = pyGetAttr(v, path)
			}
			b.WriteString(pyStr(v))
		default:
			b.WriteByte(c)
		}
	}
	return jinja.NewString(b.String()), nil
}

// pyTitle is Python's str.title: each run of letters starts upper case and goes on lower case.
func pyTitle(s string) string {
	var b strings.Builder
	prevCased := false
	for _, r := range s {
		switch {
		case prevCased:
			b.WriteRune(unicode.ToLower(r))
		default:
			b.WriteRune(unicode.ToTitle(r))
		}
		prevCased = unicode.IsLetter(r)
	}
	return b.String()
}

// pyTitleFilter is jinja2's title filter: each word (split at spaces, -, (, {, [ and <) starts upper case and goes
// on lower case.
func pyTitleFilter(s string) string {
	var b strings.Builder
	start := true
	for _, r := range s {
		sep := isPySpace(r) || strings.ContainsRune("-({[<", r)
		switch {
		case sep:
			b.WriteRune(r)
		case start:
			b.WriteRune(unicode.ToUpper(r))
		default:
			b.WriteRune(unicode.ToLower(r))
		}
		start = sep
	}
	return b.String()
}

// pyCapitalize is Python's str.capitalize: the first character upper case, the rest lower case.
func pyCapitalize(s string) string {
	for i, r := range s {
		return string(unicode.ToTitle(r)) + strings.ToLower(s[i+len(string(r)):])
	}
	return s
}

// strCase is str.title and str.capitalize.
func strCase(f func(string) string) func(string, []jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
	return func(s string, _ []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		return jinja.NewString(f(s)), nil
	}
}

// pyCaseFilter returns the title or capitalize filter.
func pyCaseFilter(f func(string) string) func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
	return func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) == 0 {
			return jinja.Undefined(), pyErr("TypeError", "no value")
		}
		return jinja.NewString(f(pyStr(args[0]))), nil
	}
}
