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
import hljs from 'highlight.js/lib/core';
import bash from 'highlight.js/lib/languages/bash';
import c from 'highlight.js/lib/languages/c';
import cpp from 'highlight.js/lib/languages/cpp';
import csharp from 'highlight.js/lib/languages/csharp';
import css from 'highlight.js/lib/languages/css';
import diff from 'highlight.js/lib/languages/diff';
import go from 'highlight.js/lib/languages/go';
import java from 'highlight.js/lib/languages/java';
import javascript from 'highlight.js/lib/languages/javascript';
import json from 'highlight.js/lib/languages/json';
import kotlin from 'highlight.js/lib/languages/kotlin';
import markdown from 'highlight.js/lib/languages/markdown';
import php from 'highlight.js/lib/languages/php';
import python from 'highlight.js/lib/languages/python';
import ruby from 'highlight.js/lib/languages/ruby';
import rust from 'highlight.js/lib/languages/rust';
import shell from 'highlight.js/lib/languages/shell';
import sql from 'highlight.js/lib/languages/sql';
import swift from 'highlight.js/lib/languages/swift';
import typescript from 'highlight.js/lib/languages/typescript';
import xml from 'highlight.js/lib/languages/xml';
import yaml from 'highlight.js/lib/languages/yaml';

// Syntax highlighting for fenced code that names its language (```go). Only
// these languages are bundled (the page stays small); a fence without a
// language, or with one not listed, is shown plain. highlight.js escapes the
// code and only adds <span class="hljs-..."> around it, so its output is as
// safe as markdown-it's own escaping.
const LANGUAGES = {
  bash, c, cpp, csharp, css, diff, go, java, javascript, json, kotlin, markdown, php, python, ruby, rust, shell, sql,
  swift, typescript, xml, yaml,
};
for (const [name, lang] of Object.entries(LANGUAGES)) hljs.registerLanguage(name, lang);

const md = new MarkdownIt({
  html: false, // invariant: model output never becomes markup
  linkify: true,
  breaks: true, // a model's single newlines are meant as line breaks
  typographer: false, // keep the model's quotes and dashes byte for byte
  // Returning '' lets markdown-it escape the code itself.
  highlight(code, lang) {
    const name = (lang || '').trim().toLowerCase();
    if (!name || !hljs.getLanguage(name)) return '';
    try {
      return hljs.highlight(code, { language: name, ignoreIllegals: true }).value;
    } catch {
      return '';
    }
  },
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

/**
 * The display name of a fence's language (its label on the code block), or
 * '' for none. Known names and aliases (js, py, sh) get highlight.js's name.
 * @param {string} lang
 * @returns {string}
 */
export function languageName(lang) {
  const name = String(lang || '').trim().toLowerCase();
  if (!name) return '';
  const known = hljs.getLanguage(name);
  return known && known.name ? known.name : name;
}
