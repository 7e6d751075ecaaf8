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
	hasMin, hasMax := lo != math.MinInt64, hi != math.MaxInt64
	digitRange := func(from, to byte) {
		out.WriteByte('[')
		out.WriteByte(from)
		if from != to {
			out.WriteByte('-')
			out.WriteByte(to)
		}
		out.WriteByte(']')
	}
	moreDigits := func(lo, hi int) {
		out.WriteString("[0-9]")
		if lo == hi && lo == 1 {
			return
		}
		out.WriteString("{" + strconv.Itoa(lo))
		if hi != lo {
			out.WriteString(",")
			if hi != math.MaxInt {
				out.WriteString(strconv.Itoa(hi))
			}
		}
		out.WriteString("}")
	}
	var uniform func(from, to string)
	uniform = func(from, to string) {
		i := 0
		for i < len(from) && i < len(to) && from[i] == to[i] {
			i++
		}
		if i > 0 {
			out.WriteString(`"` + from[:i] + `"`)
		}
		if i < len(from) && i < len(to) {
			if i > 0 {
				out.WriteString(" ")
			}
			subLen := len(from) - i - 1
			if subLen > 0 {
				fromSub, toSub := from[i+1:], to[i+1:]
				zeros, nines := strings.Repeat("0", subLen), strings.Repeat("9", subLen)
				reached := false
				out.WriteString("(")
				if fromSub == zeros {
					digitRange(from[i], to[i]-1)
					out.WriteString(" ")
					moreDigits(subLen, subLen)
				} else {
					out.WriteString("[" + string(from[i]) + "] (")
					uniform(fromSub, nines)
					out.WriteString(")")
					if from[i] < to[i]-1 {
						out.WriteString(" | ")
						if toSub == nines {
							digitRange(from[i]+1, to[i])
							reached = true
						} else {
							digitRange(from[i]+1, to[i]-1)
						}
						out.WriteString(" ")
						moreDigits(subLen, subLen)
					}
				}
				if !reached {
					out.WriteString(" | ")
					digitRange(to[i], to[i])
					out.WriteString(" ")
					uniform(zeros, toSub)
				}
				out.WriteString(")")
			} else {
				out.WriteString("[" + string(from[i]) + "-" + string(to[i]) + "]")
			}
		}
	}

	if hasMin && hasMax {
		if lo < 0 && hi < 0 {
			out.WriteString(`"-" (`)
			intRange(out, -hi, -lo, decimals, true)
			out.WriteString(")")
			return
		}
		if lo < 0 {
			out.WriteString(`"-" (`)
			intRange(out, 0, -lo, decimals, true)
			out.WriteString(") | ")
			lo = 0
		}
		minS, maxS := strconv.FormatInt(lo, 10), strconv.FormatInt(hi, 10)
		for d := len(minS); d < len(maxS); d++ {
			uniform(minS, strings.Repeat("9", d))
			minS = "1" + strings.Repeat("0", d)
			out.WriteString(" | ")
		}
		uniform(minS, maxS)
		return
	}

	less := max(decimals-1, 1)
	if hasMin {
		switch {
		case lo < 0:
			out.WriteString(`"-" (`)
			intRange(out, math.MinInt64, -lo, decimals, false)
			out.WriteString(") | [0] | [1-9] ")
			moreDigits(0, decimals-1)
		case lo == 0:
			if top {
				out.WriteString("[0] | [1-9] ")
				moreDigits(0, less)
			} else {
				moreDigits(1, decimals)
			}
		case lo <= 9:
			c := byte('0' + lo)
			start := byte('0')
			if top {
				start = '1'
			}
			if c > start {
				digitRange(start, c-1)
				out.WriteString(" ")
				moreDigits(1, less)
				out.WriteString(" | ")
			}
			digitRange(c, '9')
			out.WriteString(" ")
			moreDigits(0, less)
		default:
			minS := strconv.FormatInt(lo, 10)
			c := minS[0]
			if c > '1' {
				start := byte('0')
				if top {
					start = '1'
				}
				digitRange(start, c-1)
				out.WriteString(" ")
				moreDigits(len(minS), less)
				out.WriteString(" | ")
			}
			digitRange(c, c)
			out.WriteString(" (")
			rest, _ := strconv.ParseInt(minS[1:], 10, 64)
			intRange(out, rest, math.MaxInt64, less, false)
			out.WriteString(")")
			if c < '9' {
				out.WriteString(" | ")
				digitRange(c+1, '9')
				out.WriteString(" ")
				moreDigits(len(minS)-1, less)
			}
		}
		return
	}
	if hi >= 0 {
		if top {
			out.WriteString(`"-" [1-9] `)
			moreDigits(0, less)
			out.WriteString(" | ")
		}
		intRange(out, 0, hi, decimals, true)
	} else {
		out.WriteString(`"-" (`)
		intRange(out, -hi, math.MaxInt64, decimals, false)
		out.WriteString(")")
	}
}
