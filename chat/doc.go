// Package chat turns a conversation into a prompt and a token stream into
// clean text. It owns:
//
//   - prompt rendering with the model's chat-template family (Template,
//     DetectTemplate, TemplateByName), with a plain-transcript fallback for
//     models that have no template;
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
