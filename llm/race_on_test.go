//go:build race

package llm_test

// raceSlack: under the race detector the Go side of a request (the grammar's
// static cost check, the witness search that confirms a refusal) runs about
// five times slower (gbnf.Check on "star inside bounded 200": 0.12 s plain,
// 0.65 s with -race on an idle machine, 2.1 s with -race beside a build), so
// the "never stalls" bounds allow that much more. A freeze is seconds to
// minutes per token, far past either.
const raceSlack = 3
