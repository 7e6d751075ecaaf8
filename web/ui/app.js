// Parley chat page: vanilla JS over the structured WebSocket mode
// (ws(s)://<this page's location>/ws?format=json[&session=ID]).
//
// Invariants:
// - At most one socket is live (state.ws); events from a replaced socket are
//   ignored, so a late close of an old socket cannot tear down the new one.
// - At most one reply is in flight (state.reply); Send is disabled until its
//   done event (or an error about the prompt, which has no done event), so
//   replies never interleave on screen.
// - The server's history is the truth: on every session event the view is
//   compared with the history the server sent and redrawn when they differ.
// - Model text reaches the DOM only through ParleyMarkdown.render (html off) or
//   textContent; nothing else is assigned to innerHTML.
// - The conversation list comes from the server (GET v1/conversations): the
//   same list in every browser of the same user. Each message node carries
//   data-index, its position in state.messages (= the server's history), which
//   its actions (edit, regenerate) name.
(() => {
  'use strict';

  // started: the id of the last session a reply completed in. The server stores a session at its first write, so an
  // id it no longer knows means "expired" only when that session had a conversation.
  // settings: only what the user changed from the server's defaults (parley.settings, an older page's full copy, is
  // read once: its fields that differ from that page's defaults become the user's).
  // branches: each fork's parent session and the message it differs at (edit-and-resend), for the ‹ › arrows.
  // versions: earlier replies a Regenerate replaced, per session and message index, to page back through.
  // think: the user's thinking switch (absent: the model's default).
  const KEYS = {
    session: 'parley.session', settings: 'parley.overrides', oldSettings: 'parley.settings', theme: 'parley.theme',
    apiKey: 'parley.key', started: 'parley.started', branches: 'parley.branches', versions: 'parley.versions', think: 'parley.think',
  };
  // Bounds on what the page keeps of branches and earlier versions in this browser.
  const MAX_BRANCH_LINKS = 500;
  const MAX_VERSION_SESSIONS = 50;
  const MAX_VERSIONS = 10;
  // FALLBACK shows in the settings until /info has said what the server's defaults are (Parley's own flag defaults).
  const FALLBACK = Object.freeze({ temperature: 0.8, max_tokens: 256, top_p: 0.95, top_k: 40 });
  const SAMPLING = Object.freeze(['temperature', 'max_tokens', 'top_p', 'top_k']);
  // Reconnect backoff in ms: doubles from MIN to MAX, with up to 50% jitter
  // below the nominal delay so that many pages dropped by one server restart
  // do not all come back in the same instant.
  const BACKOFF_MIN_MS = 500;
  const BACKOFF_MAX_MS = 15000;
  const FINISH_LABELS = {
    stop: 'stop string', length: 'length limit', eos: 'end of text',
    cancelled: 'stopped', error: 'error', interrupted: 'interrupted',
  };

  const $ = (id) => document.getElementById(id);
  const ui = {
    log: $('log'), scroller: $('scroller'), empty: $('empty'), input: $('input'), send: $('send'), stop: $('stop'),
    composer: $('composer'), conn: $('conn'), connText: $('conn-text'),
    sessionWrap: $('session-wrap'), sessionId: $('session-id'),
    newChat: $('new-chat'), theme: $('theme'), openSettings: $('open-settings'),
    settings: $('settings'), settingsForm: $('settings-form'), defaults: $('s-defaults'),
    sServer: $('s-server'), sTemperature: $('s-temperature'), sMaxTokens: $('s-max-tokens'), sTopP: $('s-top-p'),
    sTopK: $('s-top-k'), sSystem: $('s-system'), sServerTools: $('s-server-tools'), model: $('model'),
    sidebar: $('sidebar'), openSidebar: $('open-sidebar'), closeSidebar: $('close-sidebar'), search: $('search'),
    convList: $('conv-list'), convEmpty: $('conv-empty'),
    keyDialog: $('key-dialog'), keyInput: $('key-input'), keyHint: $('key-hint'),
    scrim: $('scrim'), facts: $('facts'), factsText: $('facts-text'), ctxMeter: $('ctx-meter'), ctxText: $('ctx-text'),
    think: $('think'), sKey: $('s-key'), sKeyChange: $('s-key-change'), sKeyForget: $('s-key-forget'),
    attach: $('attach'), attachFile: $('attach-file'), attachments: $('attachments'),
    exportJSON: $('export-json'), exportMD: $('export-md'), importBtn: $('import'), importFile: $('import-file'),
  };

  // Storage can throw (privacy modes, disabled cookies); the page still works
  // without it, it just forgets between reloads.
  const store = {
    get(area, k) { try { return area.getItem(k); } catch { return null; } },
    set(area, k, v) { try { if (v == null) area.removeItem(k); else area.setItem(k, v); } catch { /* not persisted */ } },
  };

  const state = {
    attached: [],        // the next prompt's images, data: URLs
    ws: null,            // the live socket, or null
    ready: false,        // a session event arrived on state.ws
    attempt: 0,          // failed connects since the last session event; drives the backoff
    refused: 0,          // handshakes in a row that never opened (server down, or a 401/403)
    retryTimer: 0,
    sessionId: null,
    messages: [],        // the conversation as the server holds it: [{role, content}]
    reply: null,         // the reply in flight: {node, content, meta, text, tokens, sentAt, firstAt, renderQueued, stopping}
    resetPending: false, // a reset was sent; its session event has not arrived yet
    notice: '',          // shown once the next session opens
    apiKey: '',
    settings: { system: '' }, // the user's overrides of the server's sampling defaults, and the system prompt
    server: null,             // /info's defaults and limits: {defaults: {...}, limits: {max_tokens, context_length}}
    pendingPrompt: '',   // an edited prompt to send once the fork it starts opens
    model: '',           // the model a new session asks for (?model=), when the server serves several
    loadingShown: false, // the connection text shows a model load's progress
    keyRequired: null,   // whether the server asks for an API key: true, false, or null (not known)
    info: null,          // /info's model facts: {name, quantization, parameters, context_length, thinking}
    contextUsed: 0,      // tokens the conversation holds after its last reply (prompt + reply), 0 when not known
    think: null,         // the thinking switch: true, false, or null (the model's default)
  };

  // The conversation list (the sidebar), as the server last listed it.
  const list = { items: [], seq: 0, available: true, timer: 0 };

  // ---------- settings ----------

  function loadSettings() {
    const parse = (key) => {
      try { return JSON.parse(store.get(localStorage, key) || 'null'); } catch { return null; }
    };
    let saved = parse(KEYS.settings);
    const old = parse(KEYS.oldSettings);
    if (old && typeof old === 'object') {
      // An older page kept every field; those equal to its own defaults were
      // never the user's choice.
      saved = { ...old };
      for (const f of SAMPLING) if (saved[f] === FALLBACK[f]) delete saved[f];
      store.set(localStorage, KEYS.oldSettings, null);
    }
    state.settings = sanitize(saved && typeof saved === 'object' ? saved : {});
    store.set(localStorage, KEYS.settings, JSON.stringify(state.settings));
    const think = parse(KEYS.think);
    state.think = typeof think === 'boolean' ? think : null;
  }

  // sanitize keeps each field the user set that is within what the server
  // accepts (parley.Params.Validate, the server's max_tokens limit) and drops
  // anything else, so a bad stored value can never make every prompt fail:
  // a field left out is the server's default.
  function sanitize(s) {
    const cap = state.server && state.server.limits && state.server.limits.max_tokens > 0 ? state.server.limits.max_tokens : 1e9;
    const bounds = { temperature: [0, 10, false], max_tokens: [1, cap, true], top_p: [0, 1, false], top_k: [0, 1 << 20, true] };
    const out = { system: typeof s.system === 'string' ? s.system : '' };
    if (s.server_tools === true) out.server_tools = true;
    for (const f of SAMPLING) {
      const v = s[f];
      if (v === undefined || v === null || v === '') continue;
      const n = typeof v === 'number' ? v : parseFloat(v);
      const [lo, hi, int] = bounds[f];
      if (Number.isFinite(n) && n >= lo && n <= hi) out[f] = int ? Math.round(n) : n;
    }
    return out;
  }

  // serverDefaults is what a prompt gets for each field it leaves out.
  function serverDefaults() {
    const d = state.server && state.server.defaults;
    const out = {};
    for (const f of SAMPLING) out[f] = d && Number.isFinite(d[f]) ? d[f] : FALLBACK[f];
    return out;
  }

  // sampling is the params of a prompt: only the fields the user changed.
  // With the thinking switch set (a reasoning model), think says whether the model thinks first.
  function sampling() {
    const p = {};
    for (const f of SAMPLING) if (Object.hasOwn(state.settings, f)) p[f] = state.settings[f];
    if (state.think !== null && thinks()) p.think = state.think;
    // The server's own tools (MCP): every server the user may use.
    if (state.settings.server_tools) p.tools = [{ type: 'mcp', server_label: '*' }];
    return p;
  }

  // fillSettingsForm shows the settings in effect: the user's where set,
  // else the server's; the hint says what the server's are and its limits.
  function fillSettingsForm(s) {
    const d = serverDefaults();
    const v = (f) => String(Object.hasOwn(s, f) ? s[f] : d[f]);
    ui.sTemperature.value = v('temperature');
    ui.sMaxTokens.value = v('max_tokens');
    ui.sTopP.value = v('top_p');
    ui.sTopK.value = v('top_k');
    ui.sSystem.value = s.system || '';
    ui.sServerTools.checked = s.server_tools === true;
    const lim = state.server && state.server.limits;
    if (lim && lim.max_tokens > 0) ui.sMaxTokens.max = String(lim.max_tokens);
    const parts = [`temperature ${d.temperature}`, `max tokens ${d.max_tokens}`, `top p ${d.top_p}`, `top k ${d.top_k}`];
    let hint = state.server ? `Server defaults: ${parts.join(', ')}.` : 'The server\'s defaults are not known yet.';
    if (lim && lim.max_tokens > 0) hint += ` Max tokens at most ${lim.max_tokens}`;
    if (lim && lim.context_length > 0) hint += `${lim.max_tokens > 0 ? ',' : ' Max tokens:'} less than the context (${lim.context_length} tokens)`;
    if (lim && (lim.max_tokens > 0 || lim.context_length > 0)) hint += '.';
    ui.sServer.textContent = hint;
  }

  // saveSettingsFromForm keeps, of the sampling fields, only those that
  // differ from the server's defaults: the rest follow the server.
  function saveSettingsFromForm() {
    const before = state.settings;
    const d = serverDefaults();
    const form = sanitize({
      temperature: ui.sTemperature.value, max_tokens: ui.sMaxTokens.value,
      top_p: ui.sTopP.value, top_k: ui.sTopK.value, system: ui.sSystem.value, server_tools: ui.sServerTools.checked,
    });
    for (const f of SAMPLING) if (form[f] === d[f]) delete form[f];
    state.settings = form;
    store.set(localStorage, KEYS.settings, JSON.stringify(state.settings));
    if (state.settings.system !== before.system) sendSystem();
  }

  // loadInfo reads the server's sampling defaults and limits (/info).
  async function loadInfo() {
    try {
      const res = await fetch('info', { headers: state.apiKey ? { Authorization: `Bearer ${state.apiKey}` } : {} });
      if (!res.ok) return;
      const info = await res.json();
      if (!info || typeof info !== 'object') return;
      state.info = {
        name: typeof info.name === 'string' ? info.name : '',
        quantization: typeof info.quantization === 'string' ? info.quantization : '',
        parameters: Number.isFinite(info.parameters) ? info.parameters : 0,
        context_length: info.limits && Number.isFinite(info.limits.context_length) ? info.limits.context_length
          : (Number.isFinite(info.context_length) ? info.context_length : 0),
        thinking: typeof info.thinking === 'string' ? info.thinking : '',
        vision: info.vision === true,
      };
      ui.attach.hidden = !state.info.vision;
      showFacts();
      if (typeof info.defaults !== 'object' || !info.defaults) return;
      state.server = { defaults: info.defaults, limits: info.limits || {} };
      state.settings = sanitize(state.settings);
      if (ui.settings.open) fillSettingsForm(state.settings);
    } catch { /* the page's fallback defaults show; prompts still send only what the user changed */ }
  }

  // ---------- the model's facts, the context meter, the thinking switch ----------

  // thinks reports whether the model marks a thought (/info's thinking is a format, "none" without one).
  function thinks() {
    return !!(state.info && state.info.thinking && state.info.thinking !== 'none');
  }

  // shortCount writes a parameter count the way model names do: 260K, 1.5B.
  function shortCount(n) {
    for (const [unit, v] of [['T', 1e12], ['B', 1e9], ['M', 1e6], ['K', 1e3]]) {
      if (n >= v) return `${+(n / v).toFixed(n >= 10 * v ? 0 : 1)}${unit}`;
    }
    return String(n);
  }

  // showFacts shows the model under the conversation: its name, size and
  // quantization, and how much of its context the conversation fills.
  function showFacts() {
    const i = state.info;
    if (!i) { ui.facts.hidden = true; return; }
    const parts = [state.model || i.name];
    if (i.parameters > 0) parts.push(`${shortCount(i.parameters)} parameters`);
    if (i.quantization) parts.push(i.quantization);
    ui.factsText.textContent = parts.filter(Boolean).join(' · ');
    const ctx = i.context_length;
    ui.ctxMeter.hidden = !(ctx > 0);
    ui.ctxText.hidden = !(ctx > 0);
    if (ctx > 0) {
      const used = Math.min(state.contextUsed, ctx);
      ui.ctxMeter.max = ctx;
      ui.ctxMeter.value = used;
      ui.ctxMeter.high = Math.round(ctx * 0.8);
      ui.ctxMeter.low = Math.round(ctx * 0.5);
      ui.ctxMeter.optimum = 0;
      const pct = Math.round((used / ctx) * 100);
      ui.ctxText.textContent = state.contextUsed > 0 ? `context ${used} / ${ctx} (${pct}%)` : `context ${ctx}`;
      ui.ctxMeter.title = ui.ctxText.textContent;
    }
    ui.think.hidden = !thinks();
    showThink();
    ui.facts.hidden = false;
  }

  // showThink labels the thinking switch with what the next prompt asks for.
  function showThink() {
    const on = state.think !== false; // unset: the model's default, which thinks
    ui.think.setAttribute('aria-pressed', on ? 'true' : 'false');
    ui.think.textContent = on ? 'Thinking on' : 'Thinking off';
    ui.think.title = on ? 'The model thinks before it answers; click to answer directly'
      : 'The model answers directly; click to let it think first';
  }

  function toggleThink() {
    state.think = state.think === false;
    store.set(localStorage, KEYS.think, JSON.stringify(state.think));
    showThink();
  }

  // sendSystem tells the server the session's system prompt. An empty setting
  // means "the server's default" and is only sent to clear an earlier one.
  function sendSystem() {
    if (!state.ready) return; // sent when the next session opens
    sendJSON({ type: 'system', content: state.settings.system });
  }

  // ---------- theme ----------

  function effectiveTheme() {
    const t = document.documentElement.dataset.theme;
    if (t === 'dark' || t === 'light') return t;
    return window.matchMedia && window.matchMedia('(prefers-color-scheme: dark)').matches ? 'dark' : 'light';
  }

  function showThemeButton() {
    const next = effectiveTheme() === 'dark' ? 'light' : 'dark';
    ui.theme.setAttribute('aria-label', `Switch to ${next} theme`);
    ui.theme.title = `Switch to ${next} theme`;
    ui.theme.dataset.next = next; // style.css shows the matching icon
  }

  function toggleTheme() {
    const next = effectiveTheme() === 'dark' ? 'light' : 'dark';
    document.documentElement.dataset.theme = next;
    store.set(localStorage, KEYS.theme, next);
    showThemeButton();
  }

  // ---------- connection ----------

  function wsURL() {
    const u = new URL('ws', location.href);
    u.protocol = location.protocol === 'https:' ? 'wss:' : 'ws:';
    u.search = '';
    u.hash = '';
    u.searchParams.set('format', 'json');
    if (state.sessionId) u.searchParams.set('session', state.sessionId);
    if (state.model) u.searchParams.set('model', state.model);
    return u.href;
  }

  function setConn(kind, text) {
    ui.conn.dataset.state = kind;
    ui.connText.textContent = text;
    updateControls();
  }

  function connect() {
    clearTimeout(state.retryTimer);
    state.retryTimer = 0;
    if (state.ws) return;
    setConn('connecting', state.attempt ? 'Reconnecting…' : 'Connecting…');
    let ws;
    try {
      // The API key travels as a subprotocol because browsers cannot set
      // headers on a WebSocket; the server picks parley.v1+json.
      ws = state.apiKey
        ? new WebSocket(wsURL(), ['parley.v1+json', `parley.key.${state.apiKey}`])
        : new WebSocket(wsURL());
    } catch (err) {
      // Only a malformed URL or subprotocol throws here (e.g. a key with
      // characters a subprotocol cannot carry); retrying would not help.
      setConn('offline', 'Cannot connect');
      addNote('error', `Cannot open the connection: ${err.message}`);
      return;
    }
    state.ws = ws;
    let opened = false;
    ws.onopen = () => { opened = true; };
    ws.onmessage = (ev) => { if (state.ws === ws) onMessage(ev.data); };
    ws.onclose = (ev) => { if (state.ws === ws) onClose(ev, opened); };
    ws.onerror = () => { /* a close event always follows; handled there */ };
  }

  function onClose(ev, opened) {
    // A handshake that never opened: the page cannot see the HTTP status, so
    // after a few in a row it names the likely cause it can do something about.
    state.refused = opened ? 0 : state.refused + 1;
    // A refused key brings up the key dialog (ensureKey), so the notice only
    // mentions a key on a server that asks for one.
    if (state.refused === 3) {
      ensureKey().then((asked) => { if (asked) { state.attempt = 0; scheduleReconnect(true); } });
      addNote('note', state.keyRequired && state.apiKey
        ? 'Cannot open a chat connection. Is the server up, and is the API key right? (Settings → Change key.)'
        : 'Cannot open a chat connection. Is the server up?', true);
    }
    state.ws = null;
    state.ready = false;
    state.resetPending = false;
    if (state.reply) finishReply({ finish_reason: 'interrupted' });
    // 1001 is the server going away (restart, drain): say so, then come back.
    if (ev.code === 1001) addNote('note', 'The server closed the connection (going away); reconnecting.', true);
    scheduleReconnect();
  }

  function scheduleReconnect(immediate) {
    clearTimeout(state.retryTimer);
    if (immediate) {
      state.retryTimer = setTimeout(connect, 0);
      return;
    }
    const nominal = Math.min(BACKOFF_MAX_MS, BACKOFF_MIN_MS * 2 ** state.attempt);
    const delay = Math.round(nominal * (0.5 + Math.random() * 0.5));
    state.attempt++;
    setConn(navigator.onLine === false ? 'offline' : 'reconnecting',
      `${navigator.onLine === false ? 'Offline' : 'Disconnected'}; retrying in ${Math.ceil(delay / 1000)} s`);
    state.retryTimer = setTimeout(connect, delay);
  }

  function retryNow() {
    if (state.ws) return;
    connect();
  }

  function sendJSON(obj) {
    if (!state.ws || state.ws.readyState !== WebSocket.OPEN) return false;
    state.ws.send(JSON.stringify(obj));
    return true;
  }

  // ---------- server events ----------

  function onMessage(data) {
    let msg;
    try { msg = JSON.parse(data); } catch { return; } // not ours to show; the JSON mode only sends JSON
    if (!msg || typeof msg !== 'object') return;
    if (state.loadingShown && msg.type !== 'loading') {
      state.loadingShown = false;
      setConn('connected', 'Connected');
    }
    switch (msg.type) {
      case 'session': onSession(msg); break;
      case 'token': onToken(msg); break;
      case 'thinking': onThinking(msg); break;
      case 'done': onDone(msg); break;
      case 'server_tool_call': onServerTool(msg); break;
      case 'server_tool_result': onServerTool(msg); break;
      case 'error': onError(msg); break;
      case 'loading': // a prompt waits for its model to load
        state.loadingShown = true;
        ui.connText.textContent = `Loading ${String(msg.model)}… ${Math.round((Number(msg.progress) || 0) * 100)}%`;
        return;
      default: break; // newer servers may add event types; ignore them
    }
  }

  function onSession(msg) {
    let messages = Array.isArray(msg.messages)
      ? msg.messages.filter((m) => m && typeof m === 'object')
        .map((m) => ({
          role: String(m.role), content: typeof m.content === 'string' ? m.content : '', interrupted: m.interrupted === true,
          reasoning: typeof m.reasoning === 'string' ? m.reasoning : '',
          tool_calls: Array.isArray(m.tool_calls) ? m.tool_calls : [], name: typeof m.name === 'string' ? m.name : '',
          images: Array.isArray(m.images) ? m.images : [],
        }))
      : [];
    // A reply still generating (a reload or a reconnect mid-reply): the
    // history ends with its text so far, and its tokens follow.
    const last = messages[messages.length - 1];
    const live = msg.reply && msg.reply.status === 'generating' && last && last.role === 'assistant' ? last : null;
    if (live) messages = messages.slice(0, -1);
    const wasReset = state.resetPending;
    // Notices about the connection are stale once it is back.
    for (const n of ui.log.querySelectorAll('.msg[data-transient]')) n.remove();
    state.ready = true;
    state.attempt = 0;
    state.resetPending = false;
    state.sessionId = typeof msg.id === 'string' && msg.id ? msg.id : null;
    store.set(localStorage, KEYS.session, state.sessionId);
    ui.sessionId.textContent = state.sessionId || '';
    ui.sessionWrap.hidden = !state.sessionId;
    if (live || !sameHistory(messages, state.messages) || !ui.log.querySelector('.msg')) renderHistory(messages);
    state.messages = messages;
    if (live) followReply(live.content, Number(msg.reply.seq) || 0, live.reasoning);
    if (state.notice) { addNote('note', state.notice); state.notice = ''; }
    // A fresh (or just reset) session starts with the server's default system
    // prompt; apply the user's unless the history already carries it.
    const sys = state.settings.system;
    if (sys && (!msg.resumed || wasReset) && !messages.some((m) => m.role === 'system' && m.content === sys)) sendSystem();
    if (typeof msg.model === 'string' && msg.model) {
      state.model = msg.model;
      ui.model.value = msg.model;
    }
    showFacts();
    showBranches();
    setConn('connected', 'Connected');
    refreshActions();
    refreshList();
    if (state.pendingPrompt && !live) {
      // The fork an edit started is open: send the edited prompt on it.
      ui.input.value = state.pendingPrompt;
      state.pendingPrompt = '';
      autosize();
      sendPrompt();
    }
  }

  // A reasoning model's thought arrives as thinking messages before the
  // answer's tokens: shown collapsed above the answer, with its length and
  // how long the model thought, expandable.
  function onThinking(msg) {
    const r = state.reply;
    if (!r || typeof msg.text !== 'string') return;
    if (!r.firstAt) r.firstAt = performance.now();
    if (!r.thoughtAt) r.thoughtAt = performance.now();
    r.tokens++;
    r.thought += msg.text;
    const box = thoughtBox(r.node);
    box.querySelector('.thought-text').textContent = r.thought;
    box.querySelector('summary').textContent = 'Thinking…';
    if (r.node.dataset.state === 'waiting') {
      r.node.dataset.state = 'streaming';
      updateControls();
    }
  }

  // thoughtBox returns the collapsed thought of a message node, made on first use.
  function thoughtBox(node) {
    let box = node.querySelector('details.thought');
    if (box) return box;
    box = document.createElement('details');
    box.className = 'thought';
    const summary = document.createElement('summary');
    const text = document.createElement('div');
    text.className = 'thought-text';
    box.append(summary, text);
    node.querySelector('.content').before(box);
    return box;
  }

  function showThought(node, thought, seconds) {
    if (!thought) return;
    const box = thoughtBox(node);
    box.querySelector('.thought-text').textContent = thought;
    const took = seconds > 0 ? ` for ${seconds.toFixed(1)} s` : '';
    box.querySelector('summary').textContent = `Thought${took} · ${thought.length} characters`;
  }

  // ---------- models (a server that serves several) ----------

  // loadModels shows the model picker when /v1/models lists several models
  // with their states (a server started with --models or --models-file).
  async function loadModels() {
    try {
      const res = await fetch('v1/models', { headers: state.apiKey ? { Authorization: `Bearer ${state.apiKey}` } : {} });
      if (!res.ok) return;
      const list = (await res.json()).data;
      if (!Array.isArray(list) || list.length < 2 || !list.every((m) => typeof m.state === 'string')) return;
      ui.model.replaceChildren(...list.map((m) => {
        const o = document.createElement('option');
        o.value = String(m.id);
        o.textContent = String(m.id);
        return o;
      }));
      const def = list.find((m) => m.default);
      ui.model.value = state.model || (def ? String(def.id) : String(list[0].id));
      ui.model.hidden = false;
    } catch { /* no picker: the server's default model */ }
  }

  // switchModel starts a new chat with the picked model: a session keeps the
  // model it was started with.
  function switchModel() {
    state.model = ui.model.value;
    if (state.reply) {
      sendJSON({ type: 'cancel' });
      state.reply = null;
    }
    clearLog();
    state.messages = [];
    state.sessionId = null;
    store.set(localStorage, KEYS.session, null);
    ui.sessionId.textContent = '';
    ui.sessionWrap.hidden = true;
    if (state.ws) dropSocket();
    state.attempt = 0;
    scheduleReconnect(true);
    updateControls();
  }

  function onToken(msg) {
    const r = state.reply;
    if (!r) return; // a reply we stopped following (new chat while streaming)
    if (Number.isFinite(msg.seq) && msg.seq > 0) {
      if (msg.seq <= r.seq) return; // already shown
      r.seq = msg.seq;
    }
    if (!r.firstAt) r.firstAt = performance.now();
    if (r.thoughtAt && !r.thoughtEnd) {
      r.thoughtEnd = performance.now();
      showThought(r.node, r.thought, (r.thoughtEnd - r.thoughtAt) / 1000);
    }
    r.tokens++;
    // Special tokens (end of text, control tokens) are not part of the reply text.
    if (!msg.special && typeof msg.text === 'string') r.text += msg.text;
    if (r.node.dataset.state === 'waiting') {
      r.node.dataset.state = 'streaming';
      updateControls();
    }
    scheduleRender(r);
  }

  function onDone(msg) {
    if (!state.reply) return;
    if (state.sessionId) store.set(localStorage, KEYS.started, state.sessionId);
    finishReply(msg);
    refreshList();
  }

  function onError(msg) {
    const code = String(msg.code || 'internal');
    const text = typeof msg.message === 'string' && msg.message ? msg.message : code;
    if (!state.ready) {
      // An error on open. not_found: the stored session expired or never
      // existed here; forget it and start a fresh one at once.
      if (code === 'not_found' && state.sessionId) {
        const hadConversation = store.get(localStorage, KEYS.started) === state.sessionId;
        state.sessionId = null;
        store.set(localStorage, KEYS.session, null);
        state.messages = [];
        // A session that never had a reply was never stored: starting afresh is all there is to it.
        if (hadConversation) state.notice = 'The previous session has expired; this is a new conversation.';
        dropSocket();
        state.attempt = 0;
        scheduleReconnect(true);
        return;
      }
      addNote('error', `Server: ${text} (${code})`);
      dropSocket();
      scheduleReconnect();
      return;
    }
    // An error about our prompt ends it: no done event follows. One that
    // arrives after tokens started is about something else (e.g. a system
    // message) and the reply goes on.
    if (state.reply && state.reply.tokens === 0) {
      const r = state.reply;
      state.reply = null;
      r.node.remove();
      if (r.regen) {
        // The stored session kept its reply: show it again.
        addNote('error', `${text} (${code})`);
        resync();
        return;
      }
      // The server did not take the prompt into its history.
      const last = state.messages[state.messages.length - 1];
      if (last && last.role === 'user') state.messages.pop();
      if (r.userNode) {
        r.userNode.classList.add('rejected');
        r.userNode.removeAttribute('data-index');
      }
      if (!ui.input.value) { ui.input.value = r.prompt; autosize(); } // let the user fix and resend
    }
    addNote('error', `${text} (${code})`);
    updateControls();
    refreshActions();
  }

  // dropSocket closes the live socket without waiting for its close event.
  function dropSocket() {
    const ws = state.ws;
    state.ws = null;
    state.ready = false;
    if (ws) { try { ws.close(1000); } catch { /* already closing */ } }
    if (state.reply) finishReply({ finish_reason: 'interrupted' });
  }

  // ---------- conversation view ----------

  function sameHistory(a, b) {
    return a.length === b.length && a.every((m, i) => m.role === b[i].role && m.content === b[i].content);
  }

  function clearLog() {
    for (const n of [...ui.log.children]) if (n !== ui.empty) n.remove();
    ui.empty.hidden = false;
  }

  function renderHistory(messages) {
    if (state.reply) { state.reply = null; }
    clearLog();
    messages.forEach((m, i) => {
      const node = addMessage(m.role, m.content, imageURLs(m.images));
      node.dataset.index = String(i);
      if (m.role === 'assistant') {
        addCopyButtons(node.querySelector('.content'));
        showThought(node, m.reasoning, 0);
        showToolCalls(node, m.tool_calls);
      }
      if (m.interrupted) {
        node.dataset.finish = 'interrupted';
        const meta = document.createElement('div');
        meta.className = 'meta';
        const tag = document.createElement('span');
        tag.className = 'finish finish-interrupted';
        tag.textContent = FINISH_LABELS.interrupted;
        meta.append(tag);
        node.append(meta);
      }
    });
    scrollToEnd(true);
  }

  // showToolCalls shows a reply's tool calls, each collapsed to its name,
  // expandable to its arguments (pretty-printed when they are JSON).
  function showToolCalls(node, calls) {
    for (const c of calls || []) {
      if (!c || typeof c !== 'object') continue;
      const box = document.createElement('details');
      box.className = 'tool';
      const summary = document.createElement('summary');
      summary.textContent = `Tool call: ${String(c.name || '?')}`;
      const pre = document.createElement('pre');
      pre.textContent = prettyJSON(String(c.arguments || ''));
      box.append(summary, pre);
      node.querySelector('.content').after(box);
    }
  }

  // onServerTool shows a call of a tool that runs on the server, then its
  // result, collapsed inside the reply that made it. The server stores them
  // as messages of their own before the reply; the page's history does too.
  function onServerTool(msg) {
    const r = state.reply;
    if (!r) return;
    if (Number.isFinite(msg.seq) && msg.seq > 0) {
      if (msg.seq <= r.seq) return; // already shown
      r.seq = msg.seq;
    }
    r.steps = r.steps || [];
    if (msg.type === 'server_tool_call') {
      r.steps.push({ role: 'assistant', content: '', tool_calls: [{ id: String(msg.id || ''), name: String(msg.name || ''), arguments: String(msg.arguments || '') }] });
    } else {
      r.steps.push({ role: 'tool', content: typeof msg.content === 'string' ? msg.content : '', tool_call_id: String(msg.id || '') });
    }
    const box = document.createElement('details');
    box.className = 'tool server-tool';
    const summary = document.createElement('summary');
    const pre = document.createElement('pre');
    const name = `${String(msg.server || '?')}/${String(msg.name || '?')}`;
    if (msg.type === 'server_tool_call') {
      summary.textContent = `Server tool call: ${name}`;
      pre.textContent = prettyJSON(String(msg.arguments || ''));
    } else {
      const text = typeof msg.content === 'string' ? msg.content : '';
      summary.textContent = msg.error ? `Server tool failed: ${name}` : `Server tool result: ${name} (${text.length} characters)`;
      pre.textContent = msg.error ? String(msg.error) : prettyJSON(text);
    }
    box.append(summary, pre);
    r.content.before(box);
  }

  function prettyJSON(text) {
    try { return JSON.stringify(JSON.parse(text), null, 2); } catch { return text; }
  }

  // note and error are the page's own notices, never part of the conversation.
  const ROLE_NAMES = { user: 'You', assistant: 'Parley', system: 'System prompt', tool: 'Tool result', note: 'Notice', error: 'Error' };

  // addMessage appends one message and returns its node. Assistant text is
  // rendered as Markdown; everything else is plain text.
  function addMessage(role, text, images = []) {
    const known = Object.hasOwn(ROLE_NAMES, role) ? role : 'system';
    const node = document.createElement('article');
    node.className = `msg ${known}`;
    node.dataset.role = known;
    const who = document.createElement('div');
    who.className = 'who';
    who.textContent = ROLE_NAMES[known];
    const content = document.createElement('div');
    content.className = 'content';
    if (known === 'assistant') content.innerHTML = renderMarkdown(text);
    else if (known === 'tool') {
      // A tool's result is often long (a file, a page): collapsed to its
      // first line, expandable, like the call that asked for it.
      const box = document.createElement('details');
      box.className = 'tool';
      const summary = document.createElement('summary');
      const first = String(text).split('\n', 1)[0];
      summary.textContent = `${first.length > 80 ? `${first.slice(0, 80)}…` : first} (${text.length} characters)`;
      const pre = document.createElement('pre');
      pre.textContent = prettyJSON(text);
      box.append(summary, pre);
      content.append(box);
    } else content.textContent = text;
    node.append(who, content);
    if (images.length > 0) {
      const box = document.createElement('div');
      box.className = 'images';
      for (const src of images) {
        const img = document.createElement('img');
        img.src = src;
        img.alt = 'An image you sent';
        box.append(img);
      }
      content.before(box);
    }
    ui.empty.hidden = true;
    ui.log.append(node);
    return node;
  }

  // addNote shows one of the page's own notices; the same notice twice in a
  // row (a refusal repeated on every retry) is shown once.
  // transient: a notice about the connection, removed when it is back.
  function addNote(kind, text, transient = false) {
    const last = ui.log.lastElementChild;
    if (last && last.dataset.role === kind && last.querySelector('.content').textContent === text) return;
    if (transient) {
      // One connection notice at a time: the newest says how things stand.
      for (const n of ui.log.querySelectorAll('.msg[data-transient]')) n.remove();
    }
    const node = addMessage(kind, text);
    if (transient) node.dataset.transient = 'true';
    scrollToEnd(true);
  }

  function renderMarkdown(text) {
    // The bundle is deferred like this script and always loads first; the
    // fallback only guards a broken deployment.
    if (window.ParleyMarkdown) return window.ParleyMarkdown.render(text);
    const p = document.createElement('p');
    p.className = 'plain';
    p.textContent = text;
    return p.outerHTML;
  }

  // Rendering is batched to one pass per animation frame: tokens arrive far
  // faster than a screen refreshes, and re-rendering Markdown per token would
  // cost O(n²) for long replies.
  function scheduleRender(r) {
    if (r.renderQueued) return;
    r.renderQueued = true;
    requestAnimationFrame(() => {
      r.renderQueued = false;
      if (state.reply !== r) return;
      renderReply(r);
    });
  }

  function renderReply(r) {
    const stick = nearBottom();
    r.content.innerHTML = renderMarkdown(r.text);
    if (stick) scrollToEnd(true);
  }

  function nearBottom() {
    const l = ui.scroller;
    return l.scrollHeight - l.scrollTop - l.clientHeight < 80;
  }

  function scrollToEnd(force) {
    if (force || nearBottom()) ui.scroller.scrollTop = ui.scroller.scrollHeight;
  }

  function finishReply(msg) {
    const r = state.reply;
    state.reply = null;
    const finish = String(msg.finish_reason || 'error');
    if (typeof msg.content === 'string') r.text = msg.content;
    if (typeof msg.thinking === 'string' && msg.thinking) r.thought = msg.thinking;
    if (r.thought) showThought(r.node, r.thought, ((r.thoughtEnd || performance.now()) - r.thoughtAt) / 1000);
    const stick = nearBottom();
    r.content.innerHTML = renderMarkdown(r.text);
    addCopyButtons(r.content);
    r.node.dataset.state = 'done';
    r.node.dataset.finish = finish;
    r.node.removeAttribute('aria-busy');
    // Mirror what the server commits: a finished turn joins the history, a
    // failed one and a cancelled one without text do not (nor does their
    // prompt). After an interruption the next session event tells.
    const toolCalls = Array.isArray(msg.tool_calls) ? msg.tool_calls : [];
    showToolCalls(r.node, toolCalls);
    if (finish === 'error' || (finish === 'cancelled' && r.text === '')) {
      const last = state.messages[state.messages.length - 1];
      if (r.regen) resync(); // nothing was stored: the old reply stands
      else if (last && last.role === 'user') {
        state.messages.pop();
        if (r.userNode) r.userNode.removeAttribute('data-index');
      }
    } else if (finish !== 'interrupted') {
      // The server stored the server tools' calls and results before the reply.
      for (const m of r.steps || []) state.messages.push(m);
      r.node.dataset.index = String(state.messages.length);
      state.messages.push({ role: 'assistant', content: r.text, reasoning: r.thought, tool_calls: toolCalls });
    }
    r.node.append(replyMeta(r, msg, finish));
    const usage = msg.usage || {};
    if (Number.isFinite(usage.prompt_tokens) && Number.isFinite(usage.completion_tokens)) {
      state.contextUsed = usage.prompt_tokens + usage.completion_tokens;
      showFacts();
    }
    if (stick) scrollToEnd(true);
    updateControls();
    refreshActions();
    if (finish !== 'interrupted') ui.input.focus({ preventScroll: true });
  }

  // replyMeta shows the server's figures for the reply (usage and timings);
  // when a field is missing it falls back to what the page measured itself.
  function replyMeta(r, msg, finish) {
    const meta = document.createElement('div');
    meta.className = 'meta';
    const add = (cls, text) => {
      const s = document.createElement('span');
      s.className = cls;
      s.textContent = text;
      meta.append(s);
    };
    const usage = msg.usage || {};
    const t = msg.timings || {};
    const tokens = Number.isFinite(usage.completion_tokens) ? usage.completion_tokens : r.tokens;
    const now = performance.now();
    const ttft = Number.isFinite(t.ttft_ms) ? t.ttft_ms : (r.firstAt ? r.firstAt - r.sentAt : NaN);
    let tps = Number.isFinite(t.tokens_per_second) ? t.tokens_per_second : NaN;
    if (!Number.isFinite(tps) && r.firstAt && r.tokens > 1 && now > r.firstAt) tps = (r.tokens - 1) / ((now - r.firstAt) / 1000);
    add('tokens', `${tokens} token${tokens === 1 ? '' : 's'}`);
    if (Number.isFinite(tps) && tps > 0) add('tps', `${tps >= 100 ? Math.round(tps) : tps.toFixed(1)} tok/s`);
    if (Number.isFinite(ttft)) add('ttft', `TTFT ${ttft >= 100 ? Math.round(ttft) : ttft.toFixed(1)} ms`);
    if (Number.isFinite(usage.cached_prompt_tokens) && Number.isFinite(usage.prompt_tokens)) {
      add('prompt', `prompt ${usage.prompt_tokens} (${usage.cached_prompt_tokens} cached)`);
    }
    add(`finish finish-${finish}`, FINISH_LABELS[finish] || finish);
    return meta;
  }

  // addCopyButtons gives each code block a Copy button and, when its fence
  // named a language, a label with the language's name.
  function addCopyButtons(container) {
    for (const pre of container.querySelectorAll('pre')) {
      if (pre.parentElement.classList.contains('code-block') || pre.closest('details.tool')) continue;
      const wrap = document.createElement('div');
      wrap.className = 'code-block';
      pre.replaceWith(wrap);
      const lang = /(?:^|\s)language-(\S+)/.exec(pre.querySelector('code')?.className || '');
      if (lang) {
        const label = document.createElement('span');
        label.className = 'lang';
        label.textContent = window.ParleyMarkdown && window.ParleyMarkdown.languageName
          ? window.ParleyMarkdown.languageName(lang[1]) : lang[1];
        wrap.append(label);
      }
      const btn = document.createElement('button');
      btn.type = 'button';
      btn.className = 'btn ghost copy';
      btn.textContent = 'Copy';
      btn.setAttribute('aria-label', 'Copy code');
      btn.addEventListener('click', () => copyText(pre.textContent, btn));
      wrap.append(pre, btn);
    }
  }

  async function copyText(text, btn) {
    let ok = false;
    try {
      await navigator.clipboard.writeText(text);
      ok = true;
    } catch {
      // The async clipboard needs a secure context (https or localhost);
      // plain http on a LAN falls back to the legacy command.
      const ta = document.createElement('textarea');
      ta.value = text;
      ta.setAttribute('readonly', '');
      ta.className = 'visually-hidden';
      document.body.append(ta);
      ta.select();
      try { ok = document.execCommand('copy'); } catch { ok = false; }
      ta.remove();
    }
    btn.textContent = ok ? 'Copied' : 'Copy failed';
    setTimeout(() => { btn.textContent = 'Copy'; }, 1500);
  }

  // ---------- user actions ----------

  function sendPrompt() {
    const text = ui.input.value;
    const images = state.attached.slice();
    if ((!text.trim() && images.length === 0) || !state.ready || state.reply || state.resetPending) return;
    const msg = { type: 'prompt', content: text, params: sampling() };
    if (images.length > 0) msg.images = images;
    const ok = sendJSON(msg);
    if (!ok) return;
    const userNode = addMessage('user', text, images);
    userNode.dataset.index = String(state.messages.length);
    state.messages.push({ role: 'user', content: text, images: images.map(dataURLPart) });
    clearAttached();
    ui.input.value = '';
    autosize();
    startReply(userNode, text, false);
  }

  // startReply shows the reply to prompt (userNode's) as waiting; regen: it
  // replaces the reply the conversation had.
  // prefix: a continued reply's text so far (Continue), which the new tokens extend.
  function startReply(userNode, prompt, regen, prefix = '') {
    const node = addMessage('assistant', prefix);
    node.dataset.state = 'waiting';
    node.setAttribute('aria-busy', 'true'); // screen readers read the reply once, when it is done
    state.reply = {
      node, userNode, prompt, content: node.querySelector('.content'), regen,
      text: prefix, thought: '', thoughtAt: 0, thoughtEnd: 0,
      tokens: 0, seq: 0, sentAt: performance.now(), firstAt: 0, renderQueued: false, stopping: false,
    };
    scrollToEnd(true);
    updateControls();
    refreshActions();
  }

  // continueReply asks the server to carry on the last reply (one that
  // stopped at its length, was stopped or interrupted): the reply grows in
  // place, and the stored session keeps it whole.
  function continueReply() {
    if (!state.ready || state.reply) return;
    const i = state.messages.length - 1;
    const last = state.messages[i];
    if (!last || last.role !== 'assistant' || i < 1) return;
    if (!sendJSON({ type: 'continue', params: sampling() })) return;
    const node = ui.log.querySelector(`.msg[data-index="${i}"]`);
    const userNode = ui.log.querySelector(`.msg[data-index="${i - 1}"]`);
    for (const n of [...ui.log.querySelectorAll('.msg')]) {
      // The reply and what followed it (its notes) go; the reply comes back growing.
      if (node && (n === node || n.compareDocumentPosition(node) & Node.DOCUMENT_POSITION_PRECEDING)) n.remove();
    }
    state.messages = state.messages.slice(0, i);
    startReply(userNode, state.messages[i - 1].content, true, last.content);
  }

  // regenerate asks the server for a new last reply: the stored session
  // drops the old one and keeps the new one.
  function regenerate() {
    if (!state.ready || state.reply) return;
    let u = state.messages.length - 1;
    while (u >= 0 && state.messages[u].role !== 'user') u--;
    if (u < 0 || u === state.messages.length - 1) return;
    const ok = sendJSON({ type: 'regenerate', params: sampling() });
    if (!ok) return;
    keepVersion(state.messages.length - 1);
    const userNode = ui.log.querySelector(`.msg[data-index="${u}"]`);
    for (const n of [...ui.log.querySelectorAll('.msg')]) {
      // The old reply and what followed it (its notes included) go.
      if (userNode && n.compareDocumentPosition(userNode) & Node.DOCUMENT_POSITION_PRECEDING) n.remove();
    }
    state.messages = state.messages.slice(0, u + 1);
    startReply(userNode, state.messages[u].content, true);
  }

  // resync drops the socket and opens it again: the session event that
  // follows redraws the history as the server holds it.
  function resync() {
    dropSocket();
    state.attempt = 0;
    scheduleReconnect(true);
  }

  // ---------- branches and earlier versions ----------

  function readJSON(key) {
    try {
      const v = JSON.parse(store.get(localStorage, key) || 'null');
      return v && typeof v === 'object' && !Array.isArray(v) ? v : {};
    } catch { return {}; }
  }

  // linkBranch records that session child is a fork of parent that differs
  // from it at message at (an edited prompt). Forks of a fork at the same
  // message join the first one's parent, so all versions of a prompt are
  // siblings under one root.
  function linkBranch(parent, child, at) {
    const links = readJSON(KEYS.branches);
    const up = links[parent];
    const root = up && up.at === at ? up.parent : parent;
    links[child] = { parent: root, at };
    const ids = Object.keys(links);
    for (const id of ids.slice(0, Math.max(0, ids.length - MAX_BRANCH_LINKS))) delete links[id];
    store.set(localStorage, KEYS.branches, JSON.stringify(links));
  }

  // branchesAt lists the sessions that are versions of session sid's message
  // at (sid among them), oldest first.
  function branchesAt(sid, at) {
    if (!sid) return [];
    const links = readJSON(KEYS.branches);
    const up = links[sid];
    const root = up && up.at === at ? up.parent : sid;
    return [root, ...Object.keys(links).filter((id) => links[id].parent === root && links[id].at === at)];
  }

  // keepVersion keeps the reply at index i of the open session before a
  // Regenerate replaces it, so the arrows can page back to it.
  function keepVersion(i) {
    const m = state.messages[i];
    if (!state.sessionId || !m || m.role !== 'assistant') return;
    const all = readJSON(KEYS.versions);
    const mine = all[state.sessionId] && typeof all[state.sessionId] === 'object' ? all[state.sessionId] : {};
    const list = Array.isArray(mine[i]) ? mine[i] : [];
    list.push({ content: m.content, reasoning: m.reasoning || '' });
    mine[i] = list.slice(-MAX_VERSIONS);
    delete all[state.sessionId];
    all[state.sessionId] = mine; // newest last: the oldest sessions are dropped first
    const ids = Object.keys(all);
    for (const id of ids.slice(0, Math.max(0, ids.length - MAX_VERSION_SESSIONS))) delete all[id];
    store.set(localStorage, KEYS.versions, JSON.stringify(all));
  }

  // versionsAt is the earlier replies kept for message i of the open session.
  // One equal to the conversation's own (a Regenerate that failed) is left out.
  function versionsAt(i) {
    const mine = readJSON(KEYS.versions)[state.sessionId];
    const cur = state.messages[i];
    return mine && Array.isArray(mine[i]) ? mine[i].filter((v) => v && typeof v.content === 'string' && (!cur || v.content !== cur.content)) : [];
  }

  // pager makes the ‹ k/n › control; go(k) shows version k (1-based).
  function pager(k, n, what, go) {
    const nav = document.createElement('span');
    nav.className = 'pager';
    nav.setAttribute('role', 'group');
    nav.setAttribute('aria-label', `${what}: ${k} of ${n}`);
    const prev = actionButton('‹', `Previous ${what}`, () => go(k - 1));
    const next = actionButton('›', `Next ${what}`, () => go(k + 1));
    prev.disabled = k <= 1;
    next.disabled = k >= n;
    const at = document.createElement('span');
    at.className = 'pager-at';
    at.textContent = `${k}/${n}`;
    nav.append(prev, at, next);
    return nav;
  }

  // showVersion shows version k of reply i in its node: the earlier ones are
  // marked as not in the conversation, the last one is the conversation's.
  function showVersion(node, i, k) {
    const earlier = versionsAt(i);
    const m = state.messages[i];
    if (!m || k < 1 || k > earlier.length + 1) return;
    const v = k <= earlier.length ? earlier[k - 1] : m;
    node.dataset.version = String(k);
    node.classList.toggle('earlier', k <= earlier.length);
    const content = node.querySelector('.content');
    content.innerHTML = renderMarkdown(v.content);
    addCopyButtons(content);
    node.querySelector('details.thought')?.remove();
    showThought(node, v.reasoning || '', 0);
    refreshActions();
  }

  // showBranches is refreshActions under its name for the session event: the
  // arrows depend on which session is open.
  function showBranches() { refreshActions(); }

  // ---------- message actions ----------

  function actionButton(text, label, onClick) {
    const b = document.createElement('button');
    b.type = 'button';
    b.className = 'btn ghost';
    b.textContent = text;
    b.setAttribute('aria-label', label);
    b.addEventListener('click', () => onClick(b));
    return b;
  }

  // refreshActions puts each message's actions under it: Copy on replies,
  // Edit on prompts, Regenerate on the last reply; none while a reply runs.
  function refreshActions() {
    for (const n of ui.log.querySelectorAll('.msg-actions')) n.remove();
    const busy = !!state.reply;
    const nodes = [...ui.log.querySelectorAll('.msg[data-index]')];
    nodes.forEach((node, k) => {
      const i = Number(node.dataset.index);
      const m = state.messages[i];
      if (!m || node.querySelector('.edit-box')) return;
      const bar = document.createElement('div');
      bar.className = 'msg-actions';
      if (m.role === 'assistant' && node.dataset.state !== 'waiting' && node.dataset.state !== 'streaming') {
        const earlier = versionsAt(i);
        if (earlier.length && !busy) {
          const k = Number(node.dataset.version) || earlier.length + 1;
          bar.append(pager(k, earlier.length + 1, 'version of this reply', (j) => showVersion(node, i, j)));
        }
        // Copy gives the Markdown source of the version on screen.
        const shownVersion = () => {
          const k = Number(node.dataset.version) || 0;
          return node.classList.contains('earlier') && earlier[k - 1] ? earlier[k - 1].content : m.content;
        };
        bar.append(actionButton('Copy', 'Copy reply', (b) => copyText(shownVersion(), b)));
        if (!busy && state.ready && k === nodes.length - 1 && i === state.messages.length - 1) {
          bar.append(actionButton('Regenerate', 'Regenerate reply', regenerate));
          // A reply cut short (its length limit, Stop, a lost server) can go on.
          const cut = ['length', 'cancelled', 'interrupted'].includes(node.dataset.finish) && !(m.tool_calls || []).length;
          if (cut && m.content) bar.append(actionButton('Continue', 'Continue reply', continueReply));
        }
      }
      if (m.role === 'user' && !busy && state.ready) {
        const forks = branchesAt(state.sessionId, i);
        if (forks.length > 1) {
          const k = forks.indexOf(state.sessionId) + 1;
          bar.append(pager(k, forks.length, 'version of this prompt', (j) => switchSession(forks[j - 1])));
        }
        bar.append(actionButton('Edit', 'Edit prompt', () => startEdit(node, i)));
      }
      if (bar.childElementCount) node.append(bar);
    });
  }

  // startEdit turns prompt i into an editor. Sending the edit forks the
  // conversation before that prompt (the original stays as it was, in the
  // list) and sends the edited prompt on the fork.
  function startEdit(node, i) {
    const content = node.querySelector('.content');
    const box = document.createElement('form');
    box.className = 'edit-box';
    box.setAttribute('aria-label', 'Edit prompt');
    const ta = document.createElement('textarea');
    ta.value = state.messages[i].content;
    ta.rows = 3;
    ta.setAttribute('aria-label', 'Edited prompt');
    const row = document.createElement('div');
    row.className = 'row';
    const cancel = actionButton('Cancel', 'Cancel edit', () => close());
    const send = document.createElement('button');
    send.type = 'submit';
    send.className = 'btn primary';
    send.textContent = 'Save & send';
    row.append(cancel, send);
    box.append(ta, row);
    content.hidden = true;
    content.after(box);
    refreshActions();
    ta.focus();
    function close() {
      box.remove();
      content.hidden = false;
      refreshActions();
    }
    box.addEventListener('submit', (e) => {
      e.preventDefault();
      const text = ta.value;
      if (!text.trim()) return;
      close();
      forkAndSend(i, text);
    });
    ta.addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && !e.shiftKey && !e.isComposing && e.keyCode !== 229) {
        e.preventDefault();
        box.requestSubmit();
      } else if (e.key === 'Escape') {
        e.preventDefault();
        e.stopPropagation();
        close();
      }
    });
  }

  async function forkAndSend(i, text) {
    if (!state.sessionId || state.reply) return;
    let fork;
    try {
      fork = await api('POST', `v1/conversations/conv_${encodeURIComponent(state.sessionId)}/fork`, { messages: i });
    } catch (err) {
      addNote('error', `Could not edit the prompt: ${err.message}`);
      return;
    }
    state.pendingPrompt = text;
    const child = String(fork.id || '').replace(/^conv_/, '');
    linkBranch(state.sessionId, child, i);
    switchSession(child);
  }

  // ---------- the server's HTTP API ----------

  // api calls one of the server's HTTP routes (relative to the page, so a
  // reverse proxy's prefix is kept) with the API key, and returns its JSON;
  // a failure throws an Error with the HTTP status in .status.
  async function api(method, path, body) {
    const headers = {};
    if (state.apiKey) headers.Authorization = `Bearer ${state.apiKey}`;
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    const res = await fetch(new URL(path, location.href), {
      method, headers, cache: 'no-store', body: body === undefined ? undefined : JSON.stringify(body),
    });
    let data = null;
    try { data = await res.json(); } catch { data = null; }
    if (!res.ok) {
      const err = new Error((data && data.error && data.error.message) || `HTTP ${res.status}`);
      err.status = res.status;
      throw err;
    }
    return data;
  }

  // ensureKey asks for an API key when the server refuses the page's (or
  // its lack of one), and keeps the key given in localStorage, so the page
  // asks once. It resolves true when a new key was given.
  let keyAsked = null;
  function ensureKey() {
    if (keyAsked) return keyAsked;
    keyAsked = (async () => {
      try {
        await api('GET', 'v1/conversations?limit=1');
        if (!state.apiKey) state.keyRequired = false;
        return false;
      } catch (err) {
        if (err.status !== 401) return false;
      }
      state.keyRequired = true;
      return askKey(state.apiKey
        ? 'The server refused the API key this page kept. Enter the right one; the page keeps it in this browser.'
        : 'This server needs an API key. The page keeps it in this browser.');
    })().finally(() => { keyAsked = null; });
    return keyAsked;
  }

  // askKey shows the key dialog with hint; it resolves true when a key was
  // given (and kept), false when the dialog was cancelled.
  async function askKey(hint) {
    ui.keyHint.textContent = hint;
    ui.keyInput.value = '';
    ui.keyDialog.returnValue = '';
    ui.keyDialog.showModal();
    await new Promise((resolve) => ui.keyDialog.addEventListener('close', resolve, { once: true }));
    const key = ui.keyInput.value.trim();
    ui.keyInput.value = '';
    if (ui.keyDialog.returnValue !== 'save' || !key) return false;
    state.apiKey = key;
    store.set(localStorage, KEYS.apiKey, key);
    return true;
  }

  // showKeyRow says in the settings whether the page keeps a key, with the
  // buttons to change it and to forget it (sign out).
  function showKeyRow() {
    ui.sKey.textContent = state.apiKey ? 'This browser keeps an API key for this server.' : 'No API key is kept in this browser.';
    ui.sKeyForget.hidden = !state.apiKey;
  }

  // changeKey asks for another key and reconnects with it.
  async function changeKey() {
    ui.settings.close();
    if (!await askKey('Enter the API key to use from now on. The page keeps it in this browser.')) return;
    list.available = true;
    switchSession(null);
    refreshList();
    loadModels();
    loadInfo();
  }

  // forgetKey signs out: the key and the open conversation's id are
  // forgotten in this browser, and the page starts over without them.
  function forgetKey() {
    ui.settings.close();
    store.set(localStorage, KEYS.apiKey, null);
    store.set(localStorage, KEYS.session, null);
    store.set(localStorage, KEYS.started, null);
    location.reload();
  }

  // ---------- export and import ----------

  // EXPORT_FORMAT names the page's JSON export, which import reads back.
  const EXPORT_FORMAT = 'parley.conversation';

  function currentTitle() {
    const item = list.items.find((c) => c.session === state.sessionId);
    if (item && item.title) return String(item.title);
    const first = state.messages.find((m) => m.role === 'user');
    return first ? first.content.split('\n', 1)[0].slice(0, 80) : 'Conversation';
  }

  // conversationMarkdown is the conversation as a Markdown document: a
  // heading per message, replies as they are (they are Markdown already).
  function conversationMarkdown(title, messages) {
    const out = [`# ${title}`, ''];
    for (const m of messages) {
      out.push(`## ${ROLE_NAMES[m.role] || m.role}`, '');
      if (m.reasoning) out.push('<details><summary>Thought</summary>', '', m.reasoning, '', '</details>', '');
      if (m.role === 'tool' || m.role === 'system') out.push('```', m.content, '```', '');
      else out.push(m.content, '');
      for (const c of m.tool_calls || []) out.push(`Tool call \`${c.name}\`:`, '', '```json', prettyJSON(String(c.arguments || '')), '```', '');
    }
    return out.join('\n');
  }

  // exportConversation downloads the conversation on screen as JSON (which
  // Import reads back) or Markdown.
  function exportConversation(kind) {
    if (!state.messages.length) { addNote('note', 'Nothing to export yet.'); return; }
    const title = currentTitle();
    const messages = state.messages.map((m) => {
      const o = { role: m.role, content: m.content };
      if (m.reasoning) o.reasoning = m.reasoning;
      if (m.tool_calls && m.tool_calls.length) o.tool_calls = m.tool_calls;
      if (m.name) o.name = m.name;
      return o;
    });
    const body = kind === 'md'
      ? conversationMarkdown(title, messages)
      : JSON.stringify({ format: EXPORT_FORMAT, version: 1, title, model: state.model || (state.info && state.info.name) || '', exported_at: new Date().toISOString(), messages }, null, 2);
    const blob = new Blob([body], { type: kind === 'md' ? 'text/markdown' : 'application/json' });
    const a = document.createElement('a');
    a.href = URL.createObjectURL(blob);
    a.download = `${title.replace(/[^\p{L}\p{N} _-]+/gu, '').trim().slice(0, 60) || 'conversation'}.${kind}`;
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 60000);
  }

  // importItems turns an export's messages into the Conversations API's items.
  function importItems(messages) {
    const items = [];
    for (const m of messages) {
      if (!m || typeof m !== 'object' || typeof m.content !== 'string') throw new Error('a message without text content');
      if (m.role === 'tool') {
        items.push({ type: 'function_call_output', call_id: String(m.tool_call_id || m.name || 'call'), output: m.content });
        continue;
      }
      if (!['user', 'assistant', 'system', 'developer'].includes(m.role)) throw new Error(`an unknown role: ${String(m.role)}`);
      if (m.content !== '' || !(m.tool_calls || []).length) items.push({ type: 'message', role: m.role, content: m.content });
      for (const c of m.tool_calls || []) {
        items.push({ type: 'function_call', call_id: String(c.id || 'call'), name: String(c.name || ''), arguments: String(c.arguments || '') });
      }
    }
    return items;
  }

  // importConversation reads a file exported by this page (or a bare array
  // of {role, content}) into a new conversation on the server and opens it.
  async function importConversation() {
    const file = ui.importFile.files && ui.importFile.files[0];
    ui.importFile.value = '';
    if (!file) return;
    let data;
    try {
      data = JSON.parse(await file.text());
    } catch {
      addNote('error', `Could not import ${file.name}: it is not JSON (import reads the page's JSON export).`);
      return;
    }
    const messages = Array.isArray(data) ? data : data && data.format === EXPORT_FORMAT ? data.messages : null;
    if (!Array.isArray(messages) || !messages.length) {
      addNote('error', `Could not import ${file.name}: no messages in it.`);
      return;
    }
    let conv;
    try {
      const title = typeof data.title === 'string' && data.title ? data.title.slice(0, 200) : file.name.replace(/\.json$/i, '');
      conv = await api('POST', 'v1/conversations', { items: importItems(messages), metadata: { title } });
    } catch (err) {
      addNote('error', `Could not import ${file.name}: ${err.message}`);
      return;
    }
    switchSession(String(conv.id || '').replace(/^conv_/, ''));
    refreshList();
  }

  // ---------- the conversation list ----------

  const SVG = 'http://www.w3.org/2000/svg';
  function icon(d) {
    const svg = document.createElementNS(SVG, 'svg');
    svg.setAttribute('viewBox', '0 0 24 24');
    svg.setAttribute('width', '16');
    svg.setAttribute('height', '16');
    svg.setAttribute('aria-hidden', 'true');
    const p = document.createElementNS(SVG, 'path');
    p.setAttribute('d', d);
    svg.append(p);
    return svg;
  }

  async function refreshList() {
    if (!list.available) return;
    const seq = ++list.seq;
    const q = ui.search.value.trim();
    let data;
    try {
      data = await api('GET', `v1/conversations?limit=100${q ? `&q=${encodeURIComponent(q)}` : ''}`);
    } catch (err) {
      if (err.status === 404) {
        // A server without the Conversations API: no list to show.
        list.available = false;
        ui.sidebar.hidden = true;
        ui.openSidebar.hidden = true;
      }
      return;
    }
    if (seq !== list.seq) return; // a newer listing is on its way
    list.items = data && Array.isArray(data.data) ? data.data : [];
    renderList();
  }

  function renderList() {
    if (ui.convList.querySelector('.conv-title-input')) return; // not while a title is being edited
    ui.convList.replaceChildren();
    for (const c of list.items) {
      const sid = String(c.session || '');
      const title = String(c.title || '') || 'Untitled';
      const li = document.createElement('li');
      li.className = 'conv';
      li.dataset.id = sid;
      const open = document.createElement('button');
      open.type = 'button';
      open.className = 'conv-open';
      const name = document.createElement('span');
      name.className = 'conv-name';
      name.textContent = title;
      open.append(name);
      const when = shortDate(Number(c.updated_at));
      if (when) {
        const time = document.createElement('time');
        time.className = 'conv-date';
        time.dateTime = new Date(Number(c.updated_at) * 1000).toISOString();
        time.textContent = when;
        open.append(time);
      }
      open.title = title;
      open.setAttribute('aria-label', title); // the title names the button; the date is a visual aid
      open.addEventListener('click', () => { if (sid !== state.sessionId) switchSession(sid); else closeSidebar(); });
      const rename = document.createElement('button');
      rename.type = 'button';
      rename.className = 'btn ghost icon';
      rename.setAttribute('aria-label', `Rename “${title}”`);
      rename.title = 'Rename';
      rename.append(icon('M4 20h4L19 9l-4-4L4 16v4zM14 6l4 4'));
      rename.addEventListener('click', () => startRename(li, c, title));
      const del = document.createElement('button');
      del.type = 'button';
      del.className = 'btn ghost icon';
      del.setAttribute('aria-label', `Delete “${title}”`);
      del.title = 'Delete';
      del.append(icon('M4 7h16M9 7V4h6v3M6 7l1 13h10l1-13'));
      del.addEventListener('click', () => deleteConversation(c, title));
      li.append(open, rename, del);
      ui.convList.append(li);
    }
    ui.convEmpty.hidden = list.items.length > 0;
    ui.convEmpty.textContent = ui.search.value.trim() ? 'No conversation has that in its title.' : 'No conversations yet.';
    markCurrent();
  }

  // shortDate is when a conversation last changed (unix seconds), as the list
  // shows it: the time today, "Yesterday", the day this year, else the date.
  function shortDate(sec) {
    if (!Number.isFinite(sec) || sec <= 0) return '';
    const d = new Date(sec * 1000);
    const now = new Date();
    const day = (x) => new Date(x.getFullYear(), x.getMonth(), x.getDate()).getTime();
    const days = Math.round((day(now) - day(d)) / 86400000);
    if (days === 0) return d.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
    if (days === 1) return 'Yesterday';
    if (d.getFullYear() === now.getFullYear()) return d.toLocaleDateString([], { month: 'short', day: 'numeric' });
    return d.toLocaleDateString([], { year: 'numeric', month: 'short', day: 'numeric' });
  }

  function markCurrent() {
    for (const li of ui.convList.children) {
      if (li.dataset.id === state.sessionId) li.setAttribute('aria-current', 'true');
      else li.removeAttribute('aria-current');
    }
  }

  function startRename(li, c, title) {
    const open = li.querySelector('.conv-open');
    const input = document.createElement('input');
    input.className = 'conv-title-input';
    input.value = title;
    input.setAttribute('aria-label', 'New title');
    open.replaceWith(input);
    input.focus();
    input.select();
    let done = false;
    const finish = async (save) => {
      if (done) return;
      done = true;
      const t = input.value.trim();
      input.remove(); // renderList waits for no title input
      if (save && t && t !== title) {
        try {
          await api('POST', `v1/conversations/${encodeURIComponent(c.id)}`, { title: t });
        } catch (err) {
          addNote('error', `Could not rename: ${err.message}`);
        }
      }
      await refreshList();
      const again = [...ui.convList.children].find((n) => n.dataset.id === c.session);
      if (again) again.querySelector('.conv-open').focus();
    };
    input.addEventListener('keydown', (e) => {
      if (e.key === 'Enter') { e.preventDefault(); finish(true); }
      else if (e.key === 'Escape') { e.preventDefault(); e.stopPropagation(); finish(false); }
    });
    input.addEventListener('blur', () => finish(true));
  }

  async function deleteConversation(c, title) {
    if (!window.confirm(`Delete “${title}”? Its messages are deleted from the server.`)) return;
    try {
      await api('DELETE', `v1/conversations/${encodeURIComponent(c.id)}`);
    } catch (err) {
      if (err.status !== 404) {
        addNote('error', `Could not delete: ${err.message}`);
        return;
      }
    }
    if (c.session === state.sessionId) newChat();
    refreshList();
  }

  // openSidebar opens the drawer (narrow screens) over a scrim that closes it.
  // Focus goes to the current conversation (else the close button), not to
  // search: on a phone a focused field pops the keyboard up over the list.
  function openSidebar() {
    ui.sidebar.classList.add('open');
    ui.scrim.hidden = false;
    ui.openSidebar.setAttribute('aria-expanded', 'true');
    const current = ui.convList.querySelector('.conv[aria-current="true"] .conv-open');
    (current || ui.closeSidebar).focus({ preventScroll: true });
  }

  function closeSidebar() {
    ui.scrim.hidden = true;
    if (!ui.sidebar.classList.contains('open')) return;
    ui.sidebar.classList.remove('open');
    ui.openSidebar.setAttribute('aria-expanded', 'false');
    ui.openSidebar.focus({ preventScroll: true });
  }

  // followReply shows a reply the server is still generating, its text so
  // far up to token seq, and follows it: its tokens and its done event come
  // as for a reply this page asked for.
  // thought: the reply's thought so far (a reasoning model), shown as it was.
  function followReply(text, seq, thought = '') {
    const users = state.messages.filter((m) => m.role === 'user');
    const node = addMessage('assistant', text);
    node.dataset.state = 'streaming';
    node.setAttribute('aria-busy', 'true');
    const userNodes = ui.log.querySelectorAll('.msg.user');
    const now = performance.now();
    state.reply = {
      node, userNode: userNodes[userNodes.length - 1] || null, prompt: users.length ? users[users.length - 1].content : '',
      content: node.querySelector('.content'), text, thought, thoughtAt: thought ? now : 0, thoughtEnd: thought && text ? now : 0,
      tokens: seq, seq, sentAt: now, firstAt: 0, renderQueued: false, stopping: false, resumed: true,
    };
    if (thought) {
      // Still thinking (no answer yet): the box says so and grows; else it is the finished thought.
      const box = thoughtBox(node);
      box.querySelector('.thought-text').textContent = thought;
      box.querySelector('summary').textContent = text ? `Thought · ${thought.length} characters` : 'Thinking…';
    }
    scrollToEnd(true);
    updateControls();
  }

  function stopReply() {
    const r = state.reply;
    if (!r || r.stopping) return;
    if (sendJSON({ type: 'cancel' })) {
      r.stopping = true;
      updateControls();
    }
  }

  // switchSession leaves the conversation on screen for session sid (null:
  // a new one): the socket is dropped and opened on it, and its session
  // event draws its history. A reply still streaming here is stopped.
  function switchSession(sid) {
    if (state.reply) {
      sendJSON({ type: 'cancel' });
      state.reply = null;
    }
    state.contextUsed = 0;
    showFacts();
    clearLog();
    state.messages = [];
    state.sessionId = sid || null;
    store.set(localStorage, KEYS.session, state.sessionId);
    ui.sessionId.textContent = state.sessionId || '';
    ui.sessionWrap.hidden = !state.sessionId;
    dropSocket();
    state.attempt = 0;
    scheduleReconnect(true);
    markCurrent();
    closeSidebar();
    updateControls();
  }

  // newChat starts a new conversation; the one on screen stays in the list.
  function newChat() {
    switchSession(null);
    ui.input.focus();
  }

  function updateControls() {
    const busy = !!state.reply;
    ui.send.disabled = !state.ready || busy || state.resetPending || (!ui.input.value.trim() && state.attached.length === 0);
    ui.stop.hidden = !busy;
    ui.send.hidden = busy;
    ui.stop.disabled = !busy || state.reply.stopping || !state.ready;
    ui.stop.textContent = busy && state.reply.stopping ? 'Stopping…' : 'Stop';
    ui.composer.setAttribute('aria-busy', busy ? 'true' : 'false');
  }

  function autosize() {
    ui.input.style.height = 'auto';
    ui.input.style.height = `${ui.input.scrollHeight + 2}px`;
  }

  // ---------- images ----------

  // The images the next prompt carries, as data: URLs. The server checks each (format, size, pixels) and names a
  // refused one; the page only keeps to image types and a size a WebSocket message can hold.
  const IMAGE_TYPES = ['image/png', 'image/jpeg', 'image/webp', 'image/gif'];

  // imageURLs are a stored message's images ({sha256, media_type, data}) as data: URLs.
  function imageURLs(images) {
    return (Array.isArray(images) ? images : [])
      .filter((im) => im && typeof im.data === 'string' && IMAGE_TYPES.includes(im.media_type))
      .map((im) => `data:${im.media_type};base64,${im.data}`);
  }

  // dataURLPart is a data: URL as a stored message holds the image.
  function dataURLPart(url) {
    const m = /^data:([^;,]+);base64,(.*)$/.exec(url);
    return m ? { media_type: m[1], data: m[2] } : {};
  }

  function attachFiles(files) {
    if (!state.info || !state.info.vision) return;
    for (const f of files) {
      if (!IMAGE_TYPES.includes(f.type)) {
        addNote('error', `${f.name || 'That file'} is not a PNG, JPEG, WebP or GIF image.`);
        continue;
      }
      const reader = new FileReader();
      reader.onload = () => {
        state.attached.push(String(reader.result));
        showAttached();
      };
      reader.readAsDataURL(f);
    }
  }

  function showAttached() {
    ui.attachments.replaceChildren();
    state.attached.forEach((src, i) => {
      const thumb = document.createElement('span');
      thumb.className = 'thumb';
      const img = document.createElement('img');
      img.src = src;
      img.alt = `Image ${i + 1} to send`;
      const remove = document.createElement('button');
      remove.type = 'button';
      remove.className = 'btn ghost';
      remove.textContent = '×';
      remove.setAttribute('aria-label', `Remove image ${i + 1}`);
      remove.addEventListener('click', () => { state.attached.splice(i, 1); showAttached(); });
      thumb.append(img, remove);
      ui.attachments.append(thumb);
    });
    ui.attachments.hidden = state.attached.length === 0;
    updateControls();
  }

  function clearAttached() {
    state.attached = [];
    showAttached();
  }

  ui.attach.addEventListener('click', () => ui.attachFile.click());
  ui.attachFile.addEventListener('change', () => {
    attachFiles([...ui.attachFile.files]);
    ui.attachFile.value = '';
  });
  ui.input.addEventListener('paste', (e) => {
    const files = [...(e.clipboardData ? e.clipboardData.files : [])].filter((f) => IMAGE_TYPES.includes(f.type));
    if (files.length > 0) {
      e.preventDefault();
      attachFiles(files);
    }
  });
  for (const target of [ui.composer, ui.log]) {
    target.addEventListener('dragover', (e) => { if (state.info && state.info.vision) e.preventDefault(); });
    target.addEventListener('drop', (e) => {
      if (!state.info || !state.info.vision || !e.dataTransfer) return;
      e.preventDefault();
      attachFiles([...e.dataTransfer.files]);
    });
  }

  // ---------- start ----------

  function readURL() {
    // ?key= and ?session= are taken from the address once, then removed from
    // it: the key must not linger in the address bar, history or screenshots,
    // and the session id lives on in localStorage.
    const params = new URLSearchParams(location.search);
    const key = params.get('key');
    if (key !== null) store.set(localStorage, KEYS.apiKey, key || null);
    const session = params.get('session');
    if (session) store.set(localStorage, KEYS.session, session);
    if (key !== null || session) {
      params.delete('key');
      params.delete('session');
      const q = params.toString();
      history.replaceState(null, '', location.pathname + (q ? `?${q}` : '') + location.hash);
    }
    state.apiKey = store.get(localStorage, KEYS.apiKey) || '';
    state.sessionId = store.get(localStorage, KEYS.session) || null;
  }

  function bind() {
    ui.composer.addEventListener('submit', (e) => { e.preventDefault(); sendPrompt(); });
    ui.input.addEventListener('keydown', (e) => {
      // Enter sends, Shift+Enter is a newline; never while an IME composes.
      if (e.key === 'Enter' && !e.shiftKey && !e.isComposing && e.keyCode !== 229) {
        e.preventDefault();
        sendPrompt();
      }
    });
    ui.input.addEventListener('input', () => { autosize(); updateControls(); });
    ui.stop.addEventListener('click', stopReply);
    ui.newChat.addEventListener('click', newChat);
    ui.model.addEventListener('change', switchModel);
    ui.conn.addEventListener('click', retryNow);
    ui.theme.addEventListener('click', toggleTheme);
    if (window.matchMedia) window.matchMedia('(prefers-color-scheme: dark)').addEventListener('change', showThemeButton);
    ui.openSettings.addEventListener('click', () => {
      fillSettingsForm(state.settings);
      showKeyRow();
      ui.settings.showModal();
    });
    ui.defaults.addEventListener('click', () => fillSettingsForm({}));
    ui.settings.addEventListener('close', () => {
      if (ui.settings.returnValue === 'save') saveSettingsFromForm();
      ui.settings.returnValue = '';
    });
    window.addEventListener('online', retryNow);
    document.addEventListener('visibilitychange', () => { if (!document.hidden) { retryNow(); refreshList(); } });
    ui.openSidebar.addEventListener('click', openSidebar);
    ui.closeSidebar.addEventListener('click', closeSidebar);
    ui.scrim.addEventListener('click', closeSidebar);
    ui.think.addEventListener('click', toggleThink);
    ui.sKeyChange.addEventListener('click', changeKey);
    ui.sKeyForget.addEventListener('click', forgetKey);
    ui.exportJSON.addEventListener('click', () => exportConversation('json'));
    ui.exportMD.addEventListener('click', () => exportConversation('md'));
    ui.importBtn.addEventListener('click', () => ui.importFile.click());
    ui.importFile.addEventListener('change', importConversation);
    ui.search.addEventListener('input', () => {
      clearTimeout(list.timer);
      list.timer = setTimeout(refreshList, 200);
    });
    document.addEventListener('keydown', (e) => {
      // Esc stops the reply (dialogs and editors handle their own Esc first).
      if (e.key !== 'Escape' || e.defaultPrevented || document.querySelector('dialog[open]')) return;
      if (ui.sidebar.classList.contains('open')) closeSidebar();
      else if (state.reply) { e.preventDefault(); stopReply(); }
    });
  }

  readURL();
  loadSettings();
  showThemeButton();
  bind();
  updateControls();
  // Ask for a key first when the server needs one the page does not have.
  ensureKey().finally(() => {
    connect();
    refreshList();
    loadModels();
    loadInfo();
  });
})();
