package chat

import (
	"math"
	"testing"

	"github.com/ardanlabs/jinja"
)

// The numeric comparisons that ==, <, in and sort share, and the format filter's reading of numbers, as Python's.
func TestPyNumbers(t *testing.T) {
	big := int64(1) << 53
	cases := []struct {
		name    string
		a, b    jinja.Value
		eq      bool
		cmp     int // pyCompare's, when both are numbers
		numbers bool
		aInt    int64   // pyInt(a)
		aFloat  float64 // pyFloat(a)
	}{
		{"ints", jinja.NewInt(2), jinja.NewInt(3), false, -1, true, 2, 2},
		{"ints past a float's precision", jinja.NewInt(big + 1), jinja.NewInt(big), false, 1, true, big + 1, float64(big + 1)},
		{"int and float", jinja.NewInt(2), jinja.NewFloat(2), true, 0, true, 2, 2},
		{"float and int", jinja.NewFloat(2.5), jinja.NewInt(2), false, 1, true, 2, 2.5},
		{"bool is an int", jinja.NewBool(true), jinja.NewInt(1), true, 0, true, 1, 1},
		{"false", jinja.NewBool(false), jinja.NewFloat(0.5), false, -1, true, 0, 0},
		{"NaN equals nothing", jinja.NewFloat(math.NaN()), jinja.NewFloat(math.NaN()), false, 0, true, 0, 0},
		{"a string is not a number", jinja.NewString("1"), jinja.NewInt(1), false, 0, false, 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := pyEq(c.a, c.b); got != c.eq {
				t.Errorf("pyEq = %v, want %v", got, c.eq)
			}
			lt, eq, gt, ok := pyNumCmp(c.a, c.b)
			if ok != c.numbers {
				t.Fatalf("pyNumCmp ok = %v, want %v", ok, c.numbers)
			}
			if ok && eq != c.eq {
				t.Errorf("pyNumCmp eq = %v, want %v", eq, c.eq)
			}
			if ok && !math.IsNaN(pyFloat(c.a)) && cmp3(lt, gt) != c.cmp {
				t.Errorf("pyNumCmp orders %v, want %d", cmp3(lt, gt), c.cmp)
			}
			if c.name == "NaN equals nothing" {
				return // Python orders no NaN; int64(NaN) is the platform's
			}
			got, err := pyCompare(c.a, c.b, "<")
			if c.numbers && (err != nil || got != c.cmp) {
				t.Errorf("pyCompare = %d, %v, want %d", got, err, c.cmp)
			}
			if !c.numbers && err == nil {
				t.Errorf("pyCompare of a string and an int = %d, want a TypeError", got)
			}
			if i := pyInt(c.a); i != c.aInt {
				t.Errorf("pyInt = %d, want %d", i, c.aInt)
			}
			if f := pyFloat(c.a); f != c.aFloat {
				t.Errorf("pyFloat = %v, want %v", f, c.aFloat)
			}
		})
	}
}
