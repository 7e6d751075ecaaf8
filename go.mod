module github.com/parley-chat/parley

go 1.26.8

require github.com/ollama/ollama v0.24.0
