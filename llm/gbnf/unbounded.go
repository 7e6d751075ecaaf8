package gbnf

import (
	"bytes"
	"encoding/json"
	"math"
)

// maxSafeInteger is JavaScript's Number.MAX_SAFE_INTEGER, 2^53-1. Schema
// generators write it (zod 4's z.number().int(): minimum -2^53+1, maximum
// 2^53-1), or Number.MAX_VALUE, or 1e308, for a number with no bound.
const maxSafeInteger = 1<<53 - 1

// Unbounded reports whether a schema's minimum, maximum, exclusiveMinimum or
// exclusiveMaximum of f means "no bound": a finite value at or beyond
// ±(2^53-1). Such a bound is checked and converted as if it were absent.
func Unbounded(f float64) bool {
	return !math.IsInf(f, 0) && math.Abs(f) >= maxSafeInteger
}

// boundKeys are the keywords that Unbounded values are dropped from.
var boundKeys = map[string]bool{"minimum": true, "maximum": true, "exclusiveMinimum": true, "exclusiveMaximum": true}

// StripUnbounded returns the schema raw without the numeric bounds that
// mean no bound (Unbounded), keeping everything else, the order of
// properties included (it is the order of the generated JSON). llama.cpp's
// converter reads integer bounds as int64, so 1e308 is undefined behaviour
// there and 2^53-1 a needless 16-digit range rule. raw must be valid JSON;
// on any surprise raw is returned as it is.
func StripUnbounded(raw []byte) []byte {
	out, changed, err := stripValue(raw, false)
	if err != nil || !changed {
		return raw
	}
	return out
}

// stripValue rewrites one JSON value. literal is true inside enum, const,
// default and examples, whose objects are values, not schemas.
func stripValue(raw []byte, literal bool) ([]byte, bool, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return raw, false, nil
	}
	switch raw[0] {
	case '[':
		var elems []json.RawMessage
		if err := json.Unmarshal(raw, &elems); err != nil {
			return nil, false, err
		}
		changed := false
		for i, e := range elems {
			ne, c, err := stripValue(e, literal)
			if err != nil {
				return nil, false, err
			}
			elems[i], changed = ne, changed || c
		}
		if !changed {
			return raw, false, nil
		}
		b, err := json.Marshal(elems)
		return b, true, err
	case '{':
		return stripObject(raw, literal)
	}
	return raw, false, nil
}

// stripObject rewrites an object member by member, in order.
func stripObject(raw []byte, literal bool) ([]byte, bool, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if _, err := dec.Token(); err != nil { // {
		return nil, false, err
	}
	var buf bytes.Buffer
	buf.WriteByte('{')
	changed, n := false, 0
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, false, err
		}
		key, _ := tok.(string)
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return nil, false, err
		}
		if !literal && boundKeys[key] {
			var num json.Number
			if json.Unmarshal(val, &num) == nil {
				if f, err := num.Float64(); err == nil && Unbounded(f) {
					changed = true
					continue
				}
			}
		}
		lit := literal || key == "enum" || key == "const" || key == "default" || key == "examples"
		nv, c, err := stripValue(val, lit)
		if err != nil {
			return nil, false, err
		}
		changed = changed || c
		if n > 0 {
			buf.WriteByte(',')
		}
		n++
		kb, _ := json.Marshal(key)
		buf.Write(kb)
		buf.WriteByte(':')
		buf.Write(nv)
	}
	buf.WriteByte('}')
	if !changed {
		return raw, false, nil
	}
	return buf.Bytes(), true, nil
}
