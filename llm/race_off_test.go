//go:build !race

package llm_test

// raceSlack: see race_on_test.go.
const raceSlack = 1
