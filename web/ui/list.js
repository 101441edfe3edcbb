// The list: counts per phase and transitions per second, live; the
// sandboxes, filtered, sorted and paged by the server (100 a page), their
// rows updated from the watch without a reload.

import { api, logHead } from './api.js';
import { app, PHASES, TRANSIENT } from './state.js';
import { h, fill, age } from './dom.js';
import { button } from './actions.js';

const LIMIT = 100;
const FILTERS = ['phase', 'label', 'name', 'driver', 'node'];
const SORTS = [
  ['created', 'Created'],
  ['name', 'Name A–Z'],
  ['-name', 'Name Z–A'],
  ['age', 'Longest in phase'],
  ['-age', 'Newest in phase'],
];

// since is when view entered its phase: phase_since, else updated_at.
export function since(v) { return Date.parse(v.phase_since || v.updated_at); }

// lateness is how far a transient view is into the server's deadline:
// '' (not transient, or under half), 'aging' (past half) or 'late' (past it).
export function lateness(v, now = Date.now()) {
  if (!TRANSIENT.has(v.phase)) return '';
  const d = app.server.deadline_seconds || 0;
  const a = (now - since(v)) / 1000;
  if (d > 0 && a >= d) return 'late';
  if (d > 0 && a >= d / 2) return 'aging';
  return 'transient';
}

export function phaseBadge(phase) {
  return h('span', { class: `phase phase-${PHASES.includes(phase) ? phase : 'other'}` }, phase || '—');
}

export function outcomeBadge(outcome) {
  if (!outcome) return '';
  return h('span', { class: `outcome outcome-${outcome}` }, outcome.replaceAll('_', ' '));
}

export class ListView {
  constructor(root, params) {
    this.root = root;
    this.filters = Object.fromEntries(FILTERS.map((f) => [f, params.get(f) || '']));
    this.sort = params.get('sort') || 'created';
    this.cursors = [''];
    this.page = 0;
    this.rows = new Map(); // id → {view, tr}
    this.outside = new Set();
    this.listener = (v) => this.onView(v);
    this.countsAt = 0;
  }

  async open() {
    this.render();
    app.listeners.add(this.listener);
    this.ticker = setInterval(() => this.tick(), 1000);
    const [counts, page] = await Promise.all([this.loadCounts(), this.loadPage()]);
    if (!app.watcher && page) {
      // Start after the earliest head read: the views changed since are
      // sent, the current view of every other sandbox is not. (A server
      // without the header: after the newest view shown.)
      const heads = [counts?.head, page.head].filter((x) => x !== null && x !== undefined);
      app.startWatch(heads.length ? Math.min(...heads) : this.maxSeq());
    }
  }

  close() {
    app.listeners.delete(this.listener);
    clearInterval(this.ticker);
    clearTimeout(this.countsTimer);
  }

  maxSeq() {
    let m = 0;
    for (const { view } of this.rows.values()) m = Math.max(m, view.seq || 0);
    return m;
  }

  render() {
    this.countsEl = h('ul', { class: 'counts', 'aria-label': 'Sandboxes by phase' });
    this.rateEl = h('output', { class: 'rate-n', 'aria-live': 'off' }, '0.0');
    this.totalEl = h('span', { class: 'muted' });
    this.noticeEl = h('p', { class: 'notice', role: 'status', 'aria-live': 'polite' });
    this.tbody = h('tbody');
    this.pagerEl = h('nav', { class: 'pager', 'aria-label': 'Pages' });
    const input = (name, label, placeholder) => [
      h('label', { for: `f-${name}` }, label),
      h('input', { id: `f-${name}`, name, value: this.filters[name], placeholder, autocomplete: 'off', spellcheck: 'false' }),
    ];
    const form = h('form', { class: 'filters', role: 'search', 'aria-label': 'Filter sandboxes', onsubmit: (e) => { e.preventDefault(); this.apply(new FormData(e.target)); } },
      h('div', { class: 'field' }, h('label', { for: 'f-phase' }, 'Phase'),
        h('select', { id: 'f-phase', name: 'phase' }, h('option', { value: '' }, 'any'),
          PHASES.map((p) => h('option', { value: p, selected: this.filters.phase === p }, p)))),
      h('div', { class: 'field' }, input('name', 'Name contains', 'web')),
      h('div', { class: 'field' }, input('label', 'Label', 'team=ops')),
      h('div', { class: 'field' }, input('driver', 'Driver', 'sim')),
      h('div', { class: 'field' }, input('node', 'Node', 'local')),
      h('div', { class: 'field' }, h('label', { for: 'f-sort' }, 'Sort'),
        h('select', { id: 'f-sort', name: 'sort' }, SORTS.map(([v, l]) => h('option', { value: v, selected: this.sort === v }, l)))),
      h('div', { class: 'field buttons' },
        h('button', { type: 'submit' }, 'Apply'),
        h('button', { type: 'button', class: 'secondary', onclick: () => app.go('#/') }, 'Clear')));
    fill(this.root,
      h('section', { class: 'summary', 'aria-labelledby': 'counts-title' },
        h('h1', { id: 'counts-title' }, 'Sandboxes'),
        this.countsEl,
        h('p', { class: 'rate' }, h('span', { class: 'rate-label' }, 'transitions/s '), this.rateEl)),
      form,
      this.noticeEl,
      h('div', { class: 'table-wrap', tabindex: '0', role: 'region', 'aria-labelledby': 'table-caption' },
        h('table', { class: 'sandboxes' },
          h('caption', { id: 'table-caption' }, 'Sandboxes ', this.totalEl),
          h('thead', {}, h('tr', {},
            this.th('Name', 'name'), h('th', { scope: 'col' }, 'Phase'), this.th('In phase', 'age'),
            h('th', { scope: 'col' }, 'Gen'), h('th', { scope: 'col' }, 'Outcome'),
            h('th', { scope: 'col', class: 'wide' }, 'Driver'), h('th', { scope: 'col', class: 'wide' }, 'Node'),
            h('th', { scope: 'col', class: 'wide' }, 'Labels'),
            app.canWrite ? h('th', { scope: 'col' }, 'Actions') : null)),
          this.tbody)),
      this.pagerEl);
  }

  // th is a sortable column's header: a button that sorts by key, then
  // by its reverse.
  th(label, key) {
    const cur = this.sort === key ? 'ascending' : this.sort === `-${key}` ? 'descending' : null;
    const next = this.sort === key ? `-${key}` : key;
    return h('th', { scope: 'col', 'aria-sort': cur || 'none' },
      h('button', { type: 'button', class: 'sort', onclick: () => this.go({ ...this.filters, sort: next }) },
        label, cur ? (cur === 'ascending' ? ' ▲' : ' ▼') : ''));
  }

  apply(fd) {
    const f = {};
    for (const k of [...FILTERS, 'sort']) f[k] = (fd.get(k) || '').trim();
    this.go(f);
  }

  // go puts filters in the address (#/?phase=…), which reopens the list.
  go(f) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(f)) if (v && !(k === 'sort' && v === 'created')) q.set(k, v);
    const s = q.toString();
    app.go(s ? `#/?${s}` : '#/');
  }

  async loadCounts() {
    this.countsAt = performance.now();
    try {
      const { data, headers } = await api.phases();
      this.renderCounts(data);
      return { head: logHead(headers) };
    } catch (err) {
      if (err.status !== 401) fill(this.countsEl, h('li', { class: 'error' }, `${err.code}: ${err.message}`));
      return null;
    }
  }

  // countsSoon refreshes the counts once a second at most while the
  // watch brings changes.
  countsSoon() {
    if (this.countsTimer) return;
    const wait = Math.max(0, 1000 - (performance.now() - this.countsAt));
    this.countsTimer = setTimeout(() => { this.countsTimer = null; this.loadCounts(); }, wait);
  }

  renderCounts(counts) {
    const phases = [...PHASES, ...Object.keys(counts).filter((p) => !PHASES.includes(p))];
    let total = 0;
    fill(this.countsEl, phases.map((p) => {
      const n = counts[p] || 0;
      total += n;
      return h('li', {},
        h('button', { type: 'button', class: `count count-${PHASES.includes(p) ? p : 'other'} ${n ? '' : 'zero'}`, 'data-phase': p,
          'aria-pressed': this.filters.phase === p ? 'true' : 'false', 'aria-label': `${n} ${p}; show only ${p}`,
          onclick: () => this.go({ ...this.filters, sort: this.sort, phase: this.filters.phase === p ? '' : p }) },
        h('span', { class: 'n' }, String(n)), h('span', { class: 'p' }, p)));
    }));
    this.countsEl.dataset.total = String(total);
  }

  params(cursor) {
    const q = new URLSearchParams();
    for (const f of FILTERS) if (this.filters[f]) q.set(f, this.filters[f]);
    if (this.sort !== 'created') q.set('sort', this.sort);
    q.set('limit', String(LIMIT));
    if (cursor) q.set('cursor', cursor);
    return q;
  }

  async loadPage() {
    this.tbody.setAttribute('aria-busy', 'true');
    try {
      const { data, headers } = await api.list(this.params(this.cursors[this.page]));
      let items = data.items || [];
      // A server without the name, driver or node filter (or the sort)
      // ignores it: this page is then filtered and sorted here, and says so.
      // (A server that has them answers a total.)
      const notes = [];
      if (typeof data.total !== 'number') {
        const kept = items.filter((v) => this.matches(v));
        if (kept.length !== items.length) { notes.push('this server does not filter by name, driver or node: filtered on this page only'); items = kept; }
        const sorted = this.sortLocal(items);
        if (sorted.some((v, i) => v !== items[i])) { notes.push(`this server does not sort by ${this.sort}: sorted on this page only`); items = sorted; }
      }
      this.next = data.next || '';
      this.total = typeof data.total === 'number' ? data.total : null;
      this.renderRows(items);
      this.renderPager();
      this.outside.clear();
      fill(this.noticeEl, notes.join('; '));
      return { head: logHead(headers) };
    } catch (err) {
      if (err.status !== 401) fill(this.tbody, h('tr', {}, h('td', { colspan: '9', class: 'error' }, `${err.code}: ${err.message}`)));
      return null;
    } finally {
      this.tbody.removeAttribute('aria-busy');
    }
  }

  // matches is whether v passes the filters (what the server checks).
  matches(v) {
    const f = this.filters;
    if (f.phase && v.phase !== f.phase) return false;
    if (f.name && !(v.name || '').toLowerCase().includes(f.name.toLowerCase())) return false;
    if (f.driver && v.driver !== f.driver) return false;
    if (f.node && v.node !== f.node) return false;
    if (f.label) {
      const [k, val] = f.label.split('=');
      if ((v.labels || {})[k] !== val) return false;
    }
    return true;
  }

  sortLocal(items) {
    const by = {
      created: (a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0),
      name: (a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0) || by.created(a, b),
      age: (a, b) => since(a) - since(b) || by.created(a, b),
    };
    const key = this.sort.replace(/^-/, '');
    const f = by[key] || by.created;
    const out = [...items].sort(f);
    if (this.sort.startsWith('-')) out.reverse();
    return out;
  }

  renderRows(items) {
    this.rows.clear();
    const now = Date.now();
    const trs = items.map((v0) => {
      const v = app.newest(v0);
      app.take(v); // a watch that sends it again is not a change
      const tr = this.row(v, now);
      this.rows.set(v.id, { view: v, tr });
      return tr;
    });
    if (!trs.length) trs.push(h('tr', {}, h('td', { colspan: '9', class: 'muted empty' }, 'No sandboxes match.')));
    fill(this.tbody, trs);
  }

  row(v, now = Date.now()) {
    const late = lateness(v, now);
    const labels = Object.entries(v.labels || {}).map(([k, val]) => `${k}=${val}`).join(', ');
    return h('tr', { class: `row ${late}`, 'data-id': v.id, 'data-phase': v.phase },
      h('th', { scope: 'row', class: 'name' }, h('a', { href: `#/sandbox/${encodeURIComponent(v.id)}` }, v.name || v.id)),
      h('td', { class: 'phase-cell' }, phaseBadge(v.phase), late === 'late' ? h('span', { class: 'flag' }, ' past deadline') : ''),
      h('td', { class: 'age', title: `in ${v.phase} since ${v.phase_since || v.updated_at}` }, this.ageText(v, now)),
      h('td', { class: 'num' }, String(v.generation ?? '')),
      h('td', {}, outcomeBadge(v.last_outcome)),
      h('td', { class: 'wide' }, v.driver || ''),
      h('td', { class: 'wide' }, v.node || ''),
      h('td', { class: 'wide labels' }, labels),
      app.canWrite ? h('td', { class: 'actions' }, h('div', { class: 'row-actions' }, ['suspend', 'resume', 'stop', 'start'].map((verb) => button(v, verb, { compact: true })))) : null);
  }

  ageText(v, now) {
    const a = (now - since(v)) / 1000;
    if (!TRANSIENT.has(v.phase)) return age(a);
    return `${age(a)} of ${age(app.server.deadline_seconds)}`;
  }

  renderPager() {
    const pages = this.total !== null ? Math.max(1, Math.ceil(this.total / LIMIT)) : null;
    fill(this.pagerEl,
      h('button', { type: 'button', class: 'secondary', disabled: this.page === 0, onclick: () => this.turn(-1) }, '← Previous'),
      h('span', { class: 'muted', 'aria-live': 'polite' }, `page ${this.page + 1}${pages ? ` of ${pages}` : ''}`),
      h('button', { type: 'button', class: 'secondary', disabled: !this.next, onclick: () => this.turn(1) }, 'Next →'));
    this.totalEl.textContent = this.total !== null ? `(${this.total} match)` : '';
  }

  async turn(d) {
    if (d > 0) {
      this.cursors[this.page + 1] = this.next;
      this.page++;
    } else if (this.page > 0) {
      this.page--;
    }
    await this.loadPage();
    this.tbody.closest('.table-wrap').focus();
  }

  // onView takes a view change from the watch: its row, if shown, is
  // redrawn; one off this page that the filters keep is counted.
  onView(v) {
    this.countsSoon();
    this.rate();
    const r = this.rows.get(v.id);
    if (r) {
      if (r.view.seq >= v.seq) return;
      const tr = this.row(v);
      r.tr.replaceWith(tr);
      this.rows.set(v.id, { view: v, tr });
      return;
    }
    if (this.matches(v)) {
      this.outside.add(v.id);
      fill(this.noticeEl, `${this.outside.size} sandbox${this.outside.size === 1 ? '' : 'es'} off this page changed. `,
        h('button', { type: 'button', class: 'secondary', onclick: () => this.loadPage() }, 'Reload this page'));
    }
  }

  // tick ages the rows and the rate, once a second (no request).
  tick() {
    const now = Date.now();
    for (const [id, { view, tr }] of this.rows) {
      if (!tr.classList.contains(lateness(view, now) || 'row')) {
        const fresh = this.row(view, now); // it crossed into aging or late
        if (!tr.contains(document.activeElement)) {
          tr.replaceWith(fresh);
          this.rows.set(id, { view, tr: fresh });
          continue;
        }
      }
      const cell = tr.querySelector('.age');
      if (cell) cell.textContent = this.ageText(view, now);
    }
    this.rate();
  }

  // rate shows the phase changes per second over the last 10 s.
  rate() {
    const cut = performance.now() - 10000;
    const t = app.transitions;
    while (t.length && t[0] < cut) t.shift();
    this.rateEl.textContent = (t.length / 10).toFixed(1);
  }
}
