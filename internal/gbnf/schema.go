package gbnf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
)

// maxSchemaInt bounds integer bounds in a schema: llama.cpp reads them as
// int64 and builds digit-by-digit rules for at most 16 decimals. Bounds at
// or beyond ±(2^53-1) mean no bound (Unbounded) and are not checked.
const maxSchemaInt = 1e15

// maxPatternLen bounds a schema's regular expression.
const maxPatternLen = 4096

// CheckSchema checks a JSON schema for what llama.cpp's schema converter
// turns into a grammar that allocates without end, matches nothing, or
// crashes the converter itself: contradictory or huge length and item
// bounds, numeric ranges with no value in them, and regular expressions
// outside the small subset the converter handles. Each error names the
// schema path, e.g. "properties.age: minimum 10 is above maximum 5".
func CheckSchema(raw []byte, lim Limits) error {
	lim = lim.withDefaults()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return &Error{Msg: "is not valid JSON"}
	}
	return walkSchema(v, "", lim)
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func schemaErr(path, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if path != "" {
		msg = path + ": " + msg
	}
	return &Error{Msg: msg}
}

func walkSchema(v any, path string, lim Limits) error {
	switch x := v.(type) {
	case []any:
		for i, e := range x {
			if err := walkSchema(e, fmt.Sprintf("%s[%d]", path, i), lim); err != nil {
				return err
			}
		}
	case map[string]any:
		if err := checkObject(x, path, lim); err != nil {
			return err
		}
		for k, e := range x {
			switch k {
			case "enum", "const", "default", "examples", "required":
				continue // values, not schemas
			case "properties", "patternProperties", "$defs", "definitions", "dependentSchemas":
				// name -> schema: the names are not keywords
				named, _ := e.(map[string]any)
				for name, sub := range named {
					if err := walkSchema(sub, join(join(path, k), name), lim); err != nil {
						return err
					}
				}
				continue
			}
			if err := walkSchema(e, join(path, k), lim); err != nil {
				return err
			}
		}
	}
	return nil
}

// count reads a non-negative integer bound such as minLength. A maximum
// (upper) above the repetition cap is no bound (ok false), as the converter
// treats it (converter.bound); a minimum above it is refused.
func count(o map[string]any, key, path string, lim Limits, upper bool) (n int, ok bool, err error) {
	raw, present := o[key]
	if !present {
		return 0, false, nil
	}
	num, isNum := raw.(json.Number)
	if !isNum {
		return 0, false, schemaErr(path, "%s must be a number", key)
	}
	f, perr := num.Float64()
	if perr != nil || f != math.Trunc(f) || f < 0 {
		return 0, false, schemaErr(path, "%s must be a non-negative integer, got %s", key, num)
	}
	if f > float64(lim.MaxRepeat) {
		if upper {
			return 0, false, nil
		}
		return 0, false, schemaErr(path, "%s is %s; at most %d", key, num, lim.MaxRepeat)
	}
	return int(f), true, nil
}

func number(o map[string]any, key, path string) (f float64, ok bool, err error) {
	raw, present := o[key]
	if !present {
		return 0, false, nil
	}
	num, isNum := raw.(json.Number)
	if !isNum {
		if key == "exclusiveMinimum" || key == "exclusiveMaximum" {
			if _, isBool := raw.(bool); isBool {
				return 0, false, schemaErr(path, "%s must be a number (draft 6 and later), not a boolean", key)
			}
		}
		return 0, false, schemaErr(path, "%s must be a number", key)
	}
	f, perr := num.Float64()
	if perr != nil || math.IsInf(f, 0) {
		return 0, false, schemaErr(path, "%s is out of range", key)
	}
	return f, true, nil
}

func hasType(o map[string]any, t string) bool {
	switch x := o["type"].(type) {
	case string:
		return x == t
	case []any:
		for _, e := range x {
			if e == t {
				return true
			}
		}
	}
	return false
}

func checkObject(o map[string]any, path string, lim Limits) error {
	for _, pair := range [][2]string{{"minLength", "maxLength"}, {"minItems", "maxItems"}, {"minProperties", "maxProperties"}} {
		lo, hasLo, err := count(o, pair[0], path, lim, false)
		if err != nil {
			return err
		}
		hi, hasHi, err := count(o, pair[1], path, lim, true)
		if err != nil {
			return err
		}
		if hasLo && hasHi && hi < lo {
			return schemaErr(path, "%s %d is above %s %d: nothing can match", pair[0], lo, pair[1], hi)
		}
	}

	var (
		lo, hi         = math.Inf(-1), math.Inf(1)
		loOpen, hiOpen bool
	)
	for _, k := range []string{"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"} {
		f, ok, err := number(o, k, path)
		if err != nil {
			return err
		}
		if !ok || Unbounded(f) {
			continue // "no bound", as schema generators write it
		}
		if hasType(o, "integer") && math.Abs(f) > maxSchemaInt {
			return schemaErr(path, "%s of an integer must be within ±%g (or beyond ±(2^53-1) for no bound)", k, float64(maxSchemaInt))
		}
		switch k {
		case "minimum":
			if f > lo || f == lo && loOpen {
				lo, loOpen = f, false
			}
		case "exclusiveMinimum":
			if f >= lo {
				lo, loOpen = f, true
			}
		case "maximum":
			if f < hi || f == hi && hiOpen {
				hi, hiOpen = f, false
			}
		case "exclusiveMaximum":
			if f <= hi {
				hi, hiOpen = f, true
			}
		}
	}
	if lo > hi || lo == hi && (loOpen || hiOpen) {
		return schemaErr(path, "the range of values is empty (minimum above maximum)")
	}
	if hasType(o, "integer") && !math.IsInf(lo, 0) && !math.IsInf(hi, 0) {
		// llama.cpp reads integer bounds as int64, truncating fractions.
		ilo, ihi := math.Ceil(lo), math.Floor(hi)
		if loOpen && ilo == lo {
			ilo++
		}
		if hiOpen && ihi == hi {
			ihi--
		}
		if ilo > ihi || math.Trunc(lo) != lo || math.Trunc(hi) != hi {
			if ilo > ihi {
				return schemaErr(path, "no integer lies between the minimum and the maximum")
			}
			return schemaErr(path, "integer bounds must be integers")
		}
	}

	if raw, ok := o["pattern"]; ok {
		p, isStr := raw.(string)
		if !isStr {
			return schemaErr(path, "pattern must be a string")
		}
		if err := checkPattern(p, lim); err != nil {
			return schemaErr(path, "pattern %s", err.Error())
		}
	}
	return nil
}

// checkPattern accepts the subset of regular expressions llama.cpp's
// converter handles: anchored with ^ and $, literals, escapes, ., classes
// without nested brackets, groups without (?...), alternation, and the
// quantifiers * + ? {n} {n,} {n,m} after an item. Lookarounds, POSIX classes
// ([[:alpha:]]), backreferences and unbalanced brackets can hang or crash it.
func checkPattern(p string, lim Limits) error {
	if len(p) > maxPatternLen {
		return fmt.Errorf("is over %d bytes", maxPatternLen)
	}
	if len(p) < 2 || p[0] != '^' || p[len(p)-1] != '$' || strings.HasSuffix(p, `\$`) {
		return fmt.Errorf("must start with ^ and end with $")
	}
	s := p[1 : len(p)-1]
	depth := 0
	item := false // a quantifier needs something before it
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			if i+1 >= len(s) {
				return fmt.Errorf("ends with a lone backslash")
			}
			i++
			if n := s[i]; n >= '1' && n <= '9' || n == 'k' || n == 'p' || n == 'P' || n == 'b' || n == 'B' {
				return fmt.Errorf(`uses \%c, which is not supported`, n)
			}
			item = true
		case '(':
			if i+1 < len(s) && s[i+1] == '?' && (i+2 >= len(s) || s[i+2] != ':') {
				return fmt.Errorf("uses (?...) other than (?:...) (lookaround or flags), which is not supported")
			}
			depth++
			if depth > lim.MaxDepth {
				return fmt.Errorf("nests groups more than %d deep", lim.MaxDepth)
			}
			item = false
		case ')':
			if depth == 0 {
				return fmt.Errorf("has an unbalanced ')'")
			}
			depth--
			item = true
		case '|':
			item = false
		case '[':
			j := i + 1
			if j < len(s) && s[j] == '^' {
				j++
			}
			n := 0
			for ; j < len(s) && s[j] != ']'; j++ {
				if s[j] == '[' {
					return fmt.Errorf("has '[' inside a character class (POSIX classes such as [[:alpha:]] are not supported)")
				}
				if s[j] == '\\' {
					j++
				}
				n++
			}
			if j >= len(s) {
				return fmt.Errorf("has an unclosed '['")
			}
			if n == 0 {
				return fmt.Errorf("has an empty character class")
			}
			i = j
			item = true
		case ']', '}':
			return fmt.Errorf("has an unbalanced %q", c)
		case '*', '+', '?':
			if !item {
				return fmt.Errorf("has a quantifier %q with nothing before it", c)
			}
			item = false
		case '{':
			if !item {
				return fmt.Errorf("has a quantifier '{' with nothing before it")
			}
			j := strings.IndexByte(s[i:], '}')
			if j < 0 {
				return fmt.Errorf("has an unclosed '{'")
			}
			if err := checkBounds(s[i+1:i+j], lim); err != nil {
				return err
			}
			i += j
			item = false
		case '$', '^':
			return fmt.Errorf("may use ^ and $ only at its ends")
		default:
			item = true
		}
	}
	if depth != 0 {
		return fmt.Errorf("has an unclosed '('")
	}
	return nil
}

func checkBounds(b string, lim Limits) error {
	parts := strings.Split(b, ",")
	if len(parts) > 2 || parts[0] == "" {
		return fmt.Errorf("has a malformed {n,m} quantifier")
	}
	var nums []int
	for _, part := range parts {
		if part == "" {
			continue
		}
		if len(part) > 6 || strings.Trim(part, "0123456789") != "" {
			return fmt.Errorf("has a malformed {n,m} quantifier")
		}
		var n int
		fmt.Sscan(part, &n)
		if n > lim.MaxRepeat {
			return fmt.Errorf("repeats more than %d times", lim.MaxRepeat)
		}
		nums = append(nums, n)
	}
	if len(parts) == 2 && len(nums) == 2 && nums[1] < nums[0] {
		return fmt.Errorf("has a quantifier {%d,%d} whose maximum is below its minimum", nums[0], nums[1])
	}
	return nil
}

// Unbounded reports whether a schema's minimum, maximum, exclusiveMinimum or
// exclusiveMaximum of f means "no bound": a finite value at or beyond
// ±(2^53-1), as schema generators write it (zod 4's z.number().int():
// ±(2^53-1); others Number.MAX_VALUE or 1e308). Such a bound is checked and
// converted as if it were absent.
func Unbounded(f float64) bool {
	return !math.IsInf(f, 0) && math.Abs(f) >= maxSafeInteger
}
