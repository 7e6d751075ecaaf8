package chat

import (
	"bytes"
	"fmt"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/parley-chat/parley"
)

// validArguments reports whether args, a call's JSON arguments, validate
// against the tool's parameters schema. The call grammar makes them valid
// in nearly every case; this is the check behind the promise that every
// returned call validates, for what a grammar cannot say (number bounds,
// which llama.cpp's converter does not enforce) and for a call the model
// wrote without the grammar. The compiler loads nothing: a schema's
// references outside itself (refused at validation anyway) fail here too.
func validArguments(tool parley.Tool, args string) error {
	if len(tool.Parameters) == 0 || string(tool.Parameters) == "null" {
		return nil
	}
	schema, err := jsonschema.UnmarshalJSON(bytes.NewReader(tool.Parameters))
	if err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(jsonschema.SchemeURLLoader{}) // no files, no network
	if err := c.AddResource("parley:tool.json", schema); err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	sch, err := c.Compile("parley:tool.json")
	if err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader([]byte(args)))
	if err != nil {
		return fmt.Errorf("arguments: %w", err)
	}
	return sch.Validate(v)
}
