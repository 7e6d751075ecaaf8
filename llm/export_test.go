package llm

// CommonPrefix is commonPrefix, for the package's external tests.
var CommonPrefix = commonPrefix
