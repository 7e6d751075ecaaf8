package chat

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ardanlabs/jinja"
)

// JinjaRenderer renders a Jinja template source with variables (buildVars' JSON). Two implement it: InProcess,
// which has no bound on what a template may do, and *Sandbox, which renders in a child process under limits.
type JinjaRenderer interface {
	RenderJinja(src string, vars []byte) (string, error)
}

// Limits on a template, enforced by every renderer.
const (
	// MaxTemplateBytes bounds a chat template's source. The largest real one (57 of llama.cpp's) is about 30 KB.
	MaxTemplateBytes = 1 << 20
	// maxOutputFloor and maxOutputFactor bound a render's output: at most maxOutputFloor bytes plus
	// maxOutputFactor times the variables' size. Real templates add a fixed preamble (a tool prompt, a date) and
	// tens of bytes per message.
	maxOutputFloor  = 1 << 20
	maxOutputFactor = 8
)

// ErrTemplateLimit is returned (wrapped) when a render exceeds a limit: time, memory or output size.
var ErrTemplateLimit = errors.New("chat template exceeded its limits")

// InProcess renders in this process. Compiled templates are cached by source. It bounds output size only after the
// fact and cannot stop a template that loops or allocates without bound: use it for trusted templates (tests, a
// template file the operator wrote), and a Sandbox for a GGUF's.
type InProcess struct {
	mu    sync.Mutex
	cache map[[32]byte]*jinja.Template
}

// RenderJinja implements JinjaRenderer.
func (p *InProcess) RenderJinja(src string, vars []byte) (string, error) {
	t, err := p.compile(src)
	if err != nil {
		return "", err
	}
	return renderCompiled(t, vars)
}

func (p *InProcess) compile(src string) (*jinja.Template, error) {
	if len(src) > MaxTemplateBytes {
		return nil, fmt.Errorf("%w: the template is %d bytes, more than %d", ErrTemplateLimit, len(src), MaxTemplateBytes)
	}
	key := sha256.Sum256([]byte(src))
	p.mu.Lock()
	defer p.mu.Unlock()
	if t, ok := p.cache[key]; ok {
		return t, nil
	}
	t, err := compileSafe(src)
	if err != nil {
		return nil, err
	}
	if p.cache == nil {
		p.cache = make(map[[32]byte]*jinja.Template)
	}
	if len(p.cache) >= 16 { // a server uses one or two; tests a few dozen
		clear(p.cache)
	}
	p.cache[key] = t
	return t, nil
}

// compileSafe compiles src, turning a panic of the library into an error.
func compileSafe(src string) (t *jinja.Template, err error) {
	defer func() {
		if r := recover(); r != nil {
			t, err = nil, fmt.Errorf("compile chat template: panic: %v", r)
		}
	}()
	prepared, err := prepareSource(src)
	if errors.Is(err, errRecursion) {
		// jinja2 raises RecursionError: a template limit, refused at once.
		return nil, fmt.Errorf("compile chat template: %w: %w", ErrTemplateLimit, err)
	}
	if err != nil {
		return nil, fmt.Errorf("compile chat template: %w", err)
	}
	t, err = jinja.Compile(prepared)
	if err != nil {
		return nil, fmt.Errorf("compile chat template: %w", err)
	}
	return t, nil
}

// renderCompiled renders t with vars (buildVars' JSON), turning a panic of the library into an error, with
// strftime_now reading the variables' clock.
func renderCompiled(t *jinja.Template, vars []byte) (out string, err error) {
	data, err := decodeValues(vars)
	if err != nil {
		return "", err
	}
	now := time.Now()
	if n, ok := data["now"]; ok {
		if n.IsInt() {
			now = time.Unix(n.AsInt(), 0).UTC()
		}
		delete(data, "now")
	}
	data["strftime_now"] = jinja.NewCallable("strftime_now", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		format := "%Y-%m-%d"
		if len(args) > 0 && args[0].IsString() {
			format = args[0].AsString()
		}
		return jinja.NewString(strftime(now, format)), nil
	})
	data[pyTojsonName] = jinja.NewCallable(pyTojsonName, pyTojson)
	data[pyPrintName] = jinja.NewCallable(pyPrintName, pyPrint)
	data[pyStringName] = jinja.NewCallable(pyStringName, pyString)
	data[pyEnterName] = jinja.NewCallable(pyEnterName, pyEnter)
	data[pyOpName] = jinja.NewCallable(pyOpName, pyOp)
	data[pyCatName] = jinja.NewCallable(pyCatName, pyCat)
	data[pyAttrName] = jinja.NewCallable(pyAttrName, pyAttr)
	data[pyCallName] = jinja.NewCallable(pyCallName, pyCall)
	data[pyTestName] = jinja.NewCallable(pyTestName, pyTest)
	data[pyIterName] = jinja.NewCallable(pyIterName, pyIter)
	data[pyJoinName] = jinja.NewCallable(pyJoinName, pyJoin)
	data[pyMacroName] = jinja.NewCallable(pyMacroName, pyMacro)
	data[pyRaiseName] = jinja.NewCallable(pyRaiseName, pyRaise)
	data[pyKeyName] = jinja.NewCallable(pyKeyName, pyKeyFn)
	data[pyItemName] = jinja.NewCallable(pyItemName, pyItem)
	data[pyDictsortName] = jinja.NewCallable(pyDictsortName, pyDictsort)
	data[pyMapName] = jinja.NewCallable(pyMapName, pyMap)
	data[pyDefinedName] = jinja.NewCallable(pyDefinedName, pyDefined)
	data["parley_first"] = jinja.NewCallable("first", pyFirstLast(false))
	data["parley_last"] = jinja.NewCallable("last", pyFirstLast(true))
	data["parley_list"] = jinja.NewCallable("list", pyList)
	data["parley_sort"] = jinja.NewCallable("sort", pySort)
	data["parley_sum"] = jinja.NewCallable("sum", pySum)
	data["parley_round"] = jinja.NewCallable("round", pyRound)
	data["parley_title"] = jinja.NewCallable("title", pyCaseFilter(pyTitleFilter))
	data["parley_capitalize"] = jinja.NewCallable("capitalize", pyCaseFilter(pyCapitalize))
	data["parley_select"] = jinja.NewCallable("select", pySelectFilter(false, true))
	data["parley_reject"] = jinja.NewCallable("reject", pySelectFilter(false, false))
	data["parley_selectattr"] = jinja.NewCallable("selectattr", pySelectFilter(true, true))
	data["parley_rejectattr"] = jinja.NewCallable("rejectattr", pySelectFilter(true, false))
	data["range"] = jinja.NewCallable("range", pyRange)
	data["format"] = jinja.NewCallable("format", pyFormat) // a filter the engine lacks: found among the variables
	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("render chat template: panic: %v", r)
		}
	}()
	out, err = t.RenderValues(data)
	if errors.Is(err, errRecursion) {
		// jinja2 raises RecursionError at once; so does the render, instead of holding a sandbox worker to its
		// time limit or overflowing the stack.
		return "", fmt.Errorf("render chat template: %w: %w", ErrTemplateLimit, err)
	}
	if err != nil {
		return "", fmt.Errorf("render chat template: %w", err)
	}
	if limit := maxOutputFloor + maxOutputFactor*len(vars); len(out) > limit {
		return "", fmt.Errorf("%w: the prompt is %d bytes, more than %d", ErrTemplateLimit, len(out), limit)
	}
	return out, nil
}

// strftime formats t as Python's time.strftime does for the directives chat templates use (C locale); another
// directive is written as it stands.
func strftime(t time.Time, format string) string {
	var b []byte
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 == len(format) {
			b = append(b, c)
			continue
		}
		i++
		switch format[i] {
		case 'Y':
			b = fmt.Appendf(b, "%04d", t.Year())
		case 'y':
			b = fmt.Appendf(b, "%02d", t.Year()%100)
		case 'm':
			b = fmt.Appendf(b, "%02d", int(t.Month()))
		case 'd':
			b = fmt.Appendf(b, "%02d", t.Day())
		case 'H':
			b = fmt.Appendf(b, "%02d", t.Hour())
		case 'I':
			b = fmt.Appendf(b, "%02d", (t.Hour()+11)%12+1)
		case 'M':
			b = fmt.Appendf(b, "%02d", t.Minute())
		case 'S':
			b = fmt.Appendf(b, "%02d", t.Second())
		case 'j':
			b = fmt.Appendf(b, "%03d", t.YearDay())
		case 'B':
			b = append(b, t.Month().String()...)
		case 'b':
			b = append(b, t.Month().String()[:3]...)
		case 'A':
			b = append(b, t.Weekday().String()...)
		case 'a':
			b = append(b, t.Weekday().String()[:3]...)
		case 'p':
			b = append(b, t.Format("PM")...)
		case '%':
			b = append(b, '%')
		default:
			b = append(b, '%', format[i])
		}
	}
	return string(b)
}
