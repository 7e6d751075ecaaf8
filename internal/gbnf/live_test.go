package gbnf_test

import (
	"strings"
	"testing"

	"github.com/parley-chat/parley/internal/gbnf"
)

// TestCheckRefusesCostlyGrammars: nested repetitions over shared
// characters are refused naming the cause, whatever their spelling;
// repetitions whose items are delimited or of fixed length pass.
func TestCheckRefusesCostlyGrammars(t *testing.T) {
	costly := map[string]string{
		"nested repetitions":      `root ::= ([a-z ]{0,1000}){0,500}`,
		"two levels, small":       `root ::= ([a-z]{0,10}){0,10}`,
		"three levels":            `root ::= (([a-z]{0,3}){0,3}){0,3}`,
		"overlapping delimiter":   `root ::= ("x" [a-z]{0,30}){0,30}`,
		"plus inside bounded":     `root ::= ([a-z]+ " "?){0,200}`,
		"star inside bounded":     `root ::= ("a" [a-z]*){0,300}`,
		"alternation":             `root ::= ([a-m]{0,20} | [h-z]{0,20}){0,20}`,
		"rules referencing rules": "root ::= word{0,40}\nword ::= letter{0,40}\nletter ::= [a-z] | [A-Z]",
		"repeated inner rule":     "root ::= (item item){0,100}\nitem ::= [0-9]{1,30}",
		"unbounded outer":         `root ::= ([a-z]{1,20} [a-z]{0,20})+ "."`,
	}
	for name, g := range costly {
		err := gbnf.Check(g, gbnf.Limits{})
		if err == nil || !strings.Contains(err.Error(), "too costly to match") && !strings.Contains(err.Error(), "too many ways") {
			t.Errorf("%s: want a too-costly refusal, got %v", name, err)
		}
	}
	fine := map[string]string{
		"delimited items":    `root ::= ("x" [0-9]{0,30}){0,30}`,
		"fixed-length items": `root ::= ([a-z]{4} " "){0,500}`,
		"long chain":         `root ::= [a-z ]{0,2000}`,
		"quoted strings":     `root ::= ("\"" [^"]{0,2000} "\"" ","){0,100}`,
		"words":              `root ::= ([a-z]+ " "){0,50}`,
		"json":               jsonGrammar,
	}
	for name, g := range fine {
		if err := gbnf.Check(g, gbnf.Limits{}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
