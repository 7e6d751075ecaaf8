package chat

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/ardanlabs/jinja"
)

// Helpers that the prepared source calls (jinja_emit.go) where the engine's semantics differ from Python's, as
// jinja2 evaluates a template in Hugging Face's immutable sandbox. This file: Python's errors and types, and the
// operators (arithmetic, comparisons, in, ~ and a Markup string's +); jinja_access.go reads values,
// jinja_filters.go holds filters and tests.

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

// pyNumCmp compares a and b as Python compares numbers: two ints (a bool is one) exactly, past a float's 53 bits
// too, and anything else as floats (a NaN is neither less, equal nor greater). ok is false unless both are numbers.
func pyNumCmp(a, b jinja.Value) (lt, eq, gt, ok bool) {
	ai, af, aFloat, aNum := pyNum(a)
	bi, bf, bFloat, bNum := pyNum(b)
	switch {
	case !aNum || !bNum:
		return false, false, false, false
	case !aFloat && !bFloat:
		return ai < bi, ai == bi, ai > bi, true
	}
	return af < bf, af == bf, af > bf, true
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
	if op == "%t" && !a.IsString() {
		op = "%"
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
	case "%", "%t":
		if a.IsString() {
			fargs := []jinja.Value{a}
			if b.IsList() && op == "%t" {
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
	if _, eq, _, ok := pyNumCmp(a, b); ok {
		return eq
	}
	switch {
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
	if lt, _, gt, ok := pyNumCmp(a, b); ok {
		return cmp3(lt, gt), nil
	}
	switch {
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
