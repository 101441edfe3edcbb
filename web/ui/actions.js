// The lifecycle buttons, for a token with write: which verbs a phase
// offers, and running one (a start of a suspended sandbox, and a delete,
// ask first).

import { api } from './api.js';
import { app } from './state.js';
import { h } from './dom.js';

export const VERBS = ['suspend', 'resume', 'stop', 'start', 'delete'];

const offered = {
  suspend: (p) => p === 'ready',
  resume: (p) => p === 'suspended',
  stop: (p) => p === 'ready',
  start: (p) => p === 'stopped' || p === 'suspended',
  delete: (p) => p !== 'deleted' && p !== 'deleting',
};

// offers reports whether phase offers verb.
export function offers(phase, verb) { return offered[verb](phase); }

// run sends verb for view; it answers the view the server returned, or
// null if refused or not confirmed.
export async function run(view, verb) {
  const name = view.name || view.id;
  if (verb === 'start' && view.phase === 'suspended') {
    const ok = await app.confirm(`Start ${name} cold?`,
      `${name} is suspended. A start discards its retained state and boots it cold; resume keeps it. This cannot be undone.`,
      'Discard and start');
    if (!ok) return null;
  }
  if (verb === 'delete') {
    const ok = await app.confirm(`Delete ${name}?`, `${name} and any retained state it holds are deleted. This cannot be undone.`, 'Delete');
    if (!ok) return null;
  }
  try {
    const { data } = await api.command(view.id, verb);
    app.observe(data);
    app.status(`${verb} ${name}: accepted`);
    return data;
  } catch (err) {
    app.status(`${verb} ${name}: ${err.code}: ${err.message}`, 'error');
    return null;
  }
}

// button is the button of verb for view (the caller shows it only to a
// token with write).
export function button(view, verb, { compact = false } = {}) {
  const name = view.name || view.id;
  return h('button', {
    type: 'button',
    class: `action ${verb === 'delete' ? 'danger' : ''} ${compact ? 'compact' : ''}`,
    'data-verb': verb,
    'aria-label': compact ? `${verb} ${name}` : null,
    disabled: !offers(view.phase, verb),
    onclick: async (e) => {
      const b = e.currentTarget;
      b.disabled = true;
      b.setAttribute('aria-busy', 'true');
      await run(app.newest(view), verb);
      b.removeAttribute('aria-busy');
      b.disabled = !offers(app.newest(view).phase, verb);
    },
  }, verb);
}
