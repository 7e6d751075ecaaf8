package gbnf

import (
	"math"
	"strconv"
	"strings"
)

// intRange writes GBNF alternatives matching the decimal integers in
// [lo, hi] (math.MinInt64 / math.MaxInt64: no bound), digit range by digit
// range. It follows llama.cpp's _build_min_max_int step for step so that
// both grammars accept the same numbers; decimals bounds the digits of an
// unbounded side, top says whether a leading zero is refused.
func intRange(out *strings.Builder, lo, hi int64, decimals int, top bool) {
	w := intWriter{out}
	hasMin, hasMax := lo != math.MinInt64, hi != math.MaxInt64
	switch {
	case hasMin && hasMax:
		w.between(lo, hi, decimals)
	case hasMin:
		w.atLeast(lo, decimals, top)
	default:
		w.atMost(hi, decimals, top)
	}
}

// intWriter writes the pieces of an integer range's grammar to out.
type intWriter struct{ out *strings.Builder }

// digitRange writes the character class [from-to].
func (w intWriter) digitRange(from, to byte) {
	w.out.WriteByte('[')
	w.out.WriteByte(from)
	if from != to {
		w.out.WriteByte('-')
		w.out.WriteByte(to)
	}
	w.out.WriteByte(']')
}

// moreDigits writes lo to hi more digits (hi math.MaxInt: no upper bound).
func (w intWriter) moreDigits(lo, hi int) {
	w.out.WriteString("[0-9]")
	if lo == hi && lo == 1 {
		return
	}
	w.out.WriteString("{" + strconv.Itoa(lo))
	if hi != lo {
		w.out.WriteString(",")
		if hi != math.MaxInt {
			w.out.WriteString(strconv.Itoa(hi))
		}
	}
	w.out.WriteString("}")
}

// uniform writes the numbers from from to to, both of one length.
func (w intWriter) uniform(from, to string) {
	i := 0
	for i < len(from) && i < len(to) && from[i] == to[i] {
		i++
	}
	if i > 0 {
		w.out.WriteString(`"` + from[:i] + `"`)
	}
	if i >= len(from) || i >= len(to) {
		return
	}
	if i > 0 {
		w.out.WriteString(" ")
	}
	if len(from)-i-1 > 0 {
		w.uniformTail(from[i], to[i], from[i+1:], to[i+1:])
	} else {
		w.out.WriteString("[" + string(from[i]) + "-" + string(to[i]) + "]")
	}
}

// uniformTail is uniform past the common prefix: the first differing
// digits f < t, then the digits after them, fromSub and toSub.
func (w intWriter) uniformTail(f, t byte, fromSub, toSub string) {
	subLen := len(fromSub)
	zeros, nines := strings.Repeat("0", subLen), strings.Repeat("9", subLen)
	reached := false
	w.out.WriteString("(")
	if fromSub == zeros {
		w.digitRange(f, t-1)
		w.out.WriteString(" ")
		w.moreDigits(subLen, subLen)
	} else {
		w.out.WriteString("[" + string(f) + "] (")
		w.uniform(fromSub, nines)
		w.out.WriteString(")")
		if f < t-1 {
			w.out.WriteString(" | ")
			if toSub == nines {
				w.digitRange(f+1, t)
				reached = true
			} else {
				w.digitRange(f+1, t-1)
			}
			w.out.WriteString(" ")
			w.moreDigits(subLen, subLen)
		}
	}
	if !reached {
		w.out.WriteString(" | ")
		w.digitRange(t, t)
		w.out.WriteString(" ")
		w.uniform(zeros, toSub)
	}
	w.out.WriteString(")")
}

// between writes [lo, hi], both bounds set.
func (w intWriter) between(lo, hi int64, decimals int) {
	if lo < 0 && hi < 0 {
		w.out.WriteString(`"-" (`)
		intRange(w.out, -hi, -lo, decimals, true)
		w.out.WriteString(")")
		return
	}
	if lo < 0 {
		w.out.WriteString(`"-" (`)
		intRange(w.out, 0, -lo, decimals, true)
		w.out.WriteString(") | ")
		lo = 0
	}
	minS, maxS := strconv.FormatInt(lo, 10), strconv.FormatInt(hi, 10)
	for d := len(minS); d < len(maxS); d++ {
		w.uniform(minS, strings.Repeat("9", d))
		minS = "1" + strings.Repeat("0", d)
		w.out.WriteString(" | ")
	}
	w.uniform(minS, maxS)
}

// atLeast writes [lo, ∞).
func (w intWriter) atLeast(lo int64, decimals int, top bool) {
	less := max(decimals-1, 1)
	switch {
	case lo < 0:
		w.out.WriteString(`"-" (`)
		intRange(w.out, math.MinInt64, -lo, decimals, false)
		w.out.WriteString(") | [0] | [1-9] ")
		w.moreDigits(0, decimals-1)
	case lo == 0:
		if top {
			w.out.WriteString("[0] | [1-9] ")
			w.moreDigits(0, less)
		} else {
			w.moreDigits(1, decimals)
		}
	case lo <= 9:
		c := byte('0' + lo)
		start := byte('0')
		if top {
			start = '1'
		}
		if c > start {
			w.digitRange(start, c-1)
			w.out.WriteString(" ")
			w.moreDigits(1, less)
			w.out.WriteString(" | ")
		}
		w.digitRange(c, '9')
		w.out.WriteString(" ")
		w.moreDigits(0, less)
	default:
		w.atLeastMulti(strconv.FormatInt(lo, 10), less, top)
	}
}

// atLeastMulti is atLeast for a lower bound of two or more digits, minS.
func (w intWriter) atLeastMulti(minS string, less int, top bool) {
	c := minS[0]
	if c > '1' {
		start := byte('0')
		if top {
			start = '1'
		}
		w.digitRange(start, c-1)
		w.out.WriteString(" ")
		w.moreDigits(len(minS), less)
		w.out.WriteString(" | ")
	}
	w.digitRange(c, c)
	w.out.WriteString(" (")
	rest, _ := strconv.ParseInt(minS[1:], 10, 64)
	intRange(w.out, rest, math.MaxInt64, less, false)
	w.out.WriteString(")")
	if c < '9' {
		w.out.WriteString(" | ")
		w.digitRange(c+1, '9')
		w.out.WriteString(" ")
		w.moreDigits(len(minS)-1, less)
	}
}

// atMost writes (-∞, hi].
func (w intWriter) atMost(hi int64, decimals int, top bool) {
	less := max(decimals-1, 1)
	if hi >= 0 {
		if top {
			w.out.WriteString(`"-" [1-9] `)
			w.moreDigits(0, less)
			w.out.WriteString(" | ")
		}
		intRange(w.out, 0, hi, decimals, true)
	} else {
		w.out.WriteString(`"-" (`)
		intRange(w.out, -hi, math.MaxInt64, decimals, false)
		w.out.WriteString(")")
	}
}
