// What the dashboard's views share: the server, the token's scopes, the
// watch and the views it sent.

import { watch } from './watch.js';

const $ = (id) => document.getElementById(id);

// The phases of CONTRACT §1; a phase not here is shown as it comes.
export const PHASES = ['provisioning', 'ready', 'stopping', 'stopped', 'starting', 'suspending', 'suspended', 'deleting', 'deleted', 'error'];
export const TRANSIENT = new Set(['provisioning', 'stopping', 'starting', 'suspending', 'deleting']);

// app is what the views share: the server, the token's scopes, the live
// views seen on the watch, and hooks for the current view.
export const app = {
  signOut: () => {},
  server: { deadline_seconds: 120, node: '' },
  canWrite: false,
  // recent holds the newest view of each sandbox the watch sent (at most
  // RECENT of them), so a page read from a lagging view is corrected.
  recent: new Map(),
  listeners: new Set(),
  watcher: null,
  // transitions are the times of the phase changes the watch saw.
  transitions: [],
  status(msg, kind = 'info') {
    const el = $('status');
    el.textContent = msg;
    el.dataset.kind = kind;
    clearTimeout(app.statusTimer);
    app.statusTimer = setTimeout(() => { el.textContent = ''; }, 6000);
  },
  // confirm asks with the dialog; resolves true on Yes.
  confirm(title, text, ok) {
    const dlg = $('confirm');
    $('confirm-title').textContent = title;
    $('confirm-text').textContent = text;
    $('confirm-ok').textContent = ok;
    dlg.returnValue = '';
    dlg.showModal();
    return new Promise((resolve) => {
      dlg.addEventListener('close', () => resolve(dlg.returnValue === 'ok'), { once: true });
    });
  },
  // take folds a view into recent; true if it is newer than what we had.
  take(v) {
    const old = app.recent.get(v.id);
    if (old && old.seq >= v.seq) return false;
    if (old) app.recent.delete(v.id);
    app.recent.set(v.id, v);
    if (app.recent.size > RECENT) app.recent.delete(app.recent.keys().next().value);
    return true;
  },
  // observe takes a view from the watch or a command's answer: a newer
  // one is kept, counted as a transition if its phase moved, and passed
  // to the current view's listeners.
  observe(v) {
    const old = app.recent.get(v.id);
    if (!app.take(v)) return;
    if (!old || old.phase !== v.phase) app.transitions.push(performance.now());
    for (const f of app.listeners) f(v);
  },
  // go shows hash: a new address opens its view (hashchange); the
  // address shown now is reloaded.
  go(hash) {
    if ((location.hash || '#/') === hash) app.route();
    else location.hash = hash;
  },
  // listHash is the address of the list last shown, filters and all.
  listHash: '#/',
  route: () => {},
  // newest is v, or the newer view of the same sandbox the watch sent.
  newest(v) {
    const r = app.recent.get(v.id);
    return r && r.seq > v.seq ? r : v;
  },
  // startWatch starts the shared watch after seq `after` once; a view
  // that asks again later is served by the same one.
  startWatch(after) {
    if (app.watcher) return;
    app.watcher = watch({
      after,
      onView: (v) => app.observe(v),
      onState(state, detail) {
        const el = $('live');
        el.dataset.state = state;
        el.textContent = state === 'live' ? 'live' : state === 'reconnecting' ? 'reconnecting…' : '';
        el.title = detail || '';
      },
      onUnauthenticated: () => app.signOut('The server refused the token.'),
    });
  },
};

const RECENT = 5000;

