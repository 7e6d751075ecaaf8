package router

import (
	"fmt"
	"os"

	"github.com/parley-chat/parley/chat"
)

// TemplateOption turns a template setting (--template, a models file's
// "template") into the responder's option: a family name, or the path of a
// Jinja template file (anything that names a file), which renders instead
// of the model's own.
func TemplateOption(v string) (chat.Option, error) {
	if st, err := os.Stat(v); err == nil && !st.IsDir() {
		if st.Size() > chat.MaxTemplateBytes {
			return nil, fmt.Errorf("%s: %d bytes, more than %d", v, st.Size(), chat.MaxTemplateBytes)
		}
		src, err := os.ReadFile(v)
		if err != nil {
			return nil, err
		}
		return chat.WithTemplateSource(string(src)), nil
	}
	tmpl, err := chat.TemplateByName(v)
	if err != nil {
		return nil, fmt.Errorf("%w, and no such file", err)
	}
	return chat.WithTemplate(tmpl), nil
}
