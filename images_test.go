package parley_test

import (
	"reflect"
	"testing"

	"github.com/parley-chat/parley"
)

func TestContentSegments(t *testing.T) {
	at := func(offsets ...int) []parley.ImagePart {
		var out []parley.ImagePart
		for _, o := range offsets {
			out = append(out, parley.ImagePart{Offset: o})
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		content string
		images  []parley.ImagePart
		want    []string
	}{
		{"no images", "hi", nil, []string{"hi"}},
		{"before the text", "hi", at(0, 0), []string{"", "", "hi"}},
		{"between and after", "ab cd", at(2, 5), []string{"ab", " cd", ""}},
		{"past the end", "ab", at(1, 9), []string{"a", "b", ""}},
		{"decreasing", "abcd", at(3, 1), []string{"abc", "", "d"}},
		{"negative", "ab", at(-4), []string{"", "ab"}},
		{"inside a character", "aé!", at(2), []string{"a", "é!"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := parley.ContentSegments(parley.Message{Content: tc.content, Images: tc.images})
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("%q", got)
			}
		})
	}
}
