// Applies the remembered theme before first paint (loaded synchronously in
// <head>, so there is no flash of the wrong theme). No stored choice: the CSS
// follows prefers-color-scheme. app.js owns the toggle.
(() => {
  'use strict';
  try {
    const t = localStorage.getItem('parley.theme');
    if (t === 'dark' || t === 'light') document.documentElement.dataset.theme = t;
  } catch {
    // Storage can be unavailable (privacy mode, file://): follow the system.
  }
})();
