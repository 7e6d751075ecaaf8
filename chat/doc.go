// Package chat turns a conversation into a prompt and a token stream into
// clean text. It owns:
//
//   - prompt rendering with the model's own Jinja chat template (Jinja,
//     LoadJinja), with Hugging Face's variables, in a sandboxed child process
//     under time and memory limits (Sandbox), and the hand-written families
//     (Template, DetectTemplate, TemplateByName) as overrides and fallbacks,
//     with a plain transcript for models that have no template;
//   - a reasoning model's thought kept apart from its answer (Splitter, for
//     <think> tags and harmony channels), and a reply in two phases when the
//     answer is constrained or the thought capped (phases.go);
//   - fitting a conversation into the context window by dropping its oldest
//     turns (Fit);
//   - streaming text hygiene (Streamer): never half a UTF-8 character, never
//     a stop string or the start of one;
//   - the orchestration of one reply (Responder): render, fit, tokenize,
//     generate, clean, stop.
//
// It is pure Go and does not import the engine: the engine reaches it through
// the small Generator interface declared here, which llm.Engine satisfies and
// tests fake.
package chat
