package chat

// BuildVars exposes buildVars to the external tests, which hand the same variables to Python's jinja2.
var BuildVars = buildVars
