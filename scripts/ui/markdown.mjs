// Entry point of the chat page's Markdown bundle (web/ui/vendor/markdown.js).
// build.mjs bundles it with esbuild into an IIFE that defines the global
// ParleyMarkdown = { render(src) -> html string }.
//
// Model output is untrusted text, so the renderer must never pass raw HTML
// through: html is off (tags come out escaped), markdown-it's validateLink
// already refuses javascript:/vbscript:/file: and most data: URLs, and images
// are disabled so a reply cannot make the browser fetch a remote URL (a
// tracking pixel, or a request that fails when the page is used offline).
import MarkdownIt from 'markdown-it';

const md = new MarkdownIt({
  html: false, // invariant: model output never becomes markup
  linkify: true,
  breaks: true, // a model's single newlines are meant as line breaks
  typographer: false, // keep the model's quotes and dashes byte for byte
});
md.disable('image');

// Links open outside the chat so a click never leaves the conversation, and
// the target page gets neither a window.opener nor a Referer.
const renderToken = (tokens, idx, options, env, self) => self.renderToken(tokens, idx, options);
const linkOpen = md.renderer.rules.link_open || renderToken;
md.renderer.rules.link_open = (tokens, idx, options, env, self) => {
  tokens[idx].attrSet('target', '_blank');
  tokens[idx].attrSet('rel', 'noopener noreferrer nofollow');
  return linkOpen(tokens, idx, options, env, self);
};

/**
 * Renders Markdown to an HTML string that is safe to assign to innerHTML.
 * Fenced and indented code blocks come out as <pre><code>.
 * @param {string} src
 * @returns {string}
 */
export function render(src) {
  return md.render(String(src));
}
