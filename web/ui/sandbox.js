// One sandbox: its current view, its timeline from the history (each
// event with time, actor, command, phase after, generation, outcome), its
// workload's last log lines, and the lifecycle buttons for a token with
// write. The watch keeps it current.

import { api, logHead } from './api.js';
import { app } from './state.js';
import { h, fill, time, age } from './dom.js';
import { VERBS, button } from './actions.js';
import { phaseBadge, outcomeBadge, lateness, since } from './list.js';

// outcome is what an event says of a suspend or resume, if anything, as
// the view's last_outcome folds it (events/view.go).
export function outcome(e) {
  const d = e.data || {};
  if (d.outcome) return d.outcome;
  switch (e.type) {
    case 'sandbox.resume_failed': return 'restore_failed';
    case 'sandbox.suspend_rejected': return d.reason === 'DeadlineExceeded' ? 'suspend_timed_out' : 'suspend_rejected';
    case 'sandbox.start_requested': return d.fallback ? 'cold_start_fallback' : '';
    case 'sandbox.stopped': return d.reason === 'RetainedStateLost' ? 'restore_failed' : '';
    default: return '';
  }
}

// detail is the rest of an event worth a glance: a reason, an exit code,
// a message, a deadline, where activity came from.
export function detail(e) {
  const d = e.data || {};
  const parts = [];
  if (d.reason) parts.push(d.reason);
  if (e.type === 'sandbox.exited' && d.code !== undefined) parts.push(`exit ${d.code}`);
  if (d.message) parts.push(d.message);
  if (d.phase && e.type === 'sandbox.deadline_passed') parts.push(`in ${d.phase}`);
  if (d.node && e.type === 'sandbox.retained_state_consumed') parts.push(`on ${d.node}`);
  if (d.source && e.type === 'sandbox.active') parts.push(`by ${d.source}`);
  if (e.type === 'sandbox.idle_timeout') parts.push(`idle since ${d.last_active_at || '?'} → ${d.action || '?'}`);
  return parts.join(' · ');
}

// resumeLatency is what an event of a timeline says of resume latency
// (README "Resume latency", the metric's and the bench's one definition):
// the stages it ends, each from the resume command accepted. resume is
// the newest sandbox.resume_requested before e ({ at: its time,
// generation }); sandbox.resumed{restored} ends restore_started, running
// (and loaded, for a lazy restore) at the times it carries, the resumed
// generation's supervisor.attached ends ready at its own time; '' for
// any other event.
export function resumeLatency(e, resume) {
  if (!resume) return '';
  const d = e.data || {};
  const ms = (t) => `${Math.max(0, Date.parse(t) - Date.parse(resume.at))} ms`;
  if (e.type === 'sandbox.resumed' && d.outcome === 'restored') {
    return [['restore_started', d.restore_started_at], ['running', d.running_at], ['loaded', d.loaded_at]]
      .filter(([, t]) => t).map(([stage, t]) => `→${stage} ${ms(t)}`).join(' · ');
  }
  if (e.type === 'supervisor.attached' && d.generation === resume.generation) return `→ready ${ms(e.time)}`;
  return '';
}

// idlePolicy says what a view's idle policy does (README "Idle and wake"),
// '' when it has none.
export function idlePolicy(p) {
  if (!p || !p.after) return '';
  const fallback = p.action !== 'stop' && p.fallback === 'stop' ? ', else stop' : '';
  return `${p.action || 'suspend'} after ${p.after} idle${fallback}`;
}

// expiry is what a view's wake and expiry policies say (README "Wake on
// traffic", "Expiry and retention"), as [label, text] rows of the sandbox
// page; a policy the view lacks has no row, but wake on traffic's.
// expires_at is the effective expiry; while expiry_paused it is the value
// it had on entering suspended, to move later by the stay.
export function expiry(v) {
  const rows = [['wake on traffic', v.wake_on_traffic ? 'on' : 'off']];
  if (v.expires_at) {
    const pause = v.expiry_paused ? ' (paused while suspended)' : v.ttl_pauses_while_suspended ? ' (pauses while suspended)' : '';
    rows.push(['expires', `${time(v.expires_at)}, then ${v.on_expiry || 'delete'}${pause}`]);
  }
  if (v.retain_for) rows.push(['retains state for', v.retain_for]);
  const r = v.restore || {};
  if (r.expires_at) rows.push(['retained state expires', time(r.expires_at)]);
  return rows;
}

export class SandboxView {
  constructor(root, id) {
    this.root = root;
    this.id = id;
    this.view = null;
    this.lastSeq = 0;
    this.listener = (v) => { if (this.view && v.id === this.view.id) this.onView(v); };
  }

  async open() {
    this.headEl = h('div', { class: 'sandbox-head' });
    this.actionsEl = h('div', { class: 'actions-bar', role: 'group', 'aria-label': 'Lifecycle' });
    this.viewEl = h('dl', { class: 'view' });
    this.timelineBody = h('tbody');
    this.logsEl = h('pre', { class: 'logs', tabindex: '0', 'aria-label': 'Last log lines' });
    fill(this.root,
      h('p', {}, h('a', { href: app.listHash }, '← All sandboxes')),
      this.headEl,
      this.actionsEl,
      h('div', { class: 'columns' },
        h('section', { 'aria-labelledby': 'view-title' }, h('h2', { id: 'view-title' }, 'Current view'), this.viewEl),
        h('section', { 'aria-labelledby': 'logs-title', class: 'logs-section' },
          h('h2', { id: 'logs-title' }, 'Last log lines ',
            h('button', { type: 'button', class: 'secondary compact', onclick: () => this.loadLogs() }, 'Refresh')),
          this.logsEl)),
      h('section', { 'aria-labelledby': 'timeline-title' },
        h('h2', { id: 'timeline-title' }, 'Timeline'),
        h('div', { class: 'table-wrap', tabindex: '0', role: 'region', 'aria-labelledby': 'timeline-title' },
          h('table', { class: 'timeline' },
            h('thead', {}, h('tr', {}, ['Seq', 'Time', 'Event', 'Actor', 'Command', 'Phase after', 'Gen', 'Outcome'].map((c) => h('th', { scope: 'col' }, c)))),
            this.timelineBody))));
    app.listeners.add(this.listener);
    this.ticker = setInterval(() => this.view && this.renderHead(), 1000);
    try {
      const { data } = await api.get(this.id);
      this.view = app.newest(data);
      app.take(this.view);
    } catch (err) {
      if (err.status !== 401) fill(this.headEl, h('h1', {}, this.id), h('p', { class: 'error', role: 'alert' }, `${err.code}: ${err.message}`));
      return;
    }
    this.render();
    await Promise.all([this.loadHistory(), this.loadLogs(), app.watcher ? null : this.startWatch()]);
  }

  // startWatch starts the shared watch when this page is the first one
  // opened: from the log's head that GET /v1/phases names (not from this
  // sandbox's seq, which would send every sandbox changed since), then
  // reads the view again, which holds whatever changed before that head.
  async startWatch() {
    let head = null;
    try {
      head = logHead((await api.phases()).headers);
    } catch { /* the watch starts from the view's seq */ }
    if (app.watcher) return;
    app.startWatch(head ?? this.view.seq);
    try {
      const { data } = await api.get(this.view.id);
      app.observe(data);
    } catch { /* the watch brings the next change */ }
  }

  close() {
    app.listeners.delete(this.listener);
    clearInterval(this.ticker);
  }

  render() {
    this.renderHead();
    const v = this.view;
    const row = (k, val) => [h('dt', {}, k), h('dd', {}, val === '' || val === undefined || val === null ? '—' : val)];
    const restore = v.restore || {};
    fill(this.viewEl,
      row('id', h('code', {}, v.id)),
      row('phase', phaseBadge(v.phase)),
      row('in phase since', time(v.phase_since || v.updated_at)),
      row('generation', String(v.generation ?? '')),
      row('last outcome', outcomeBadge(v.last_outcome)),
      row('reason', v.reason),
      row('exit code', v.exit_code ?? ''),
      row('driver', v.driver),
      row('node', v.node),
      row('labels', Object.entries(v.labels || {}).map(([k, val]) => `${k}=${val}`).join(', ')),
      row('retained state', restore.held ? `held${restore.bytes ? ` (${restore.bytes} bytes)` : ''}` : restore.consumed ? 'consumed' : 'none'),
      row('forwards', (v.forwards || []).map((f) => `${f.address} → ${f.port}`).join(', ')),
      row('last active', v.last_active_at ? time(v.last_active_at) : ''),
      row('idle policy', idlePolicy(v.idle)),
      expiry(v).map(([k, val]) => row(k, val)),
      row('updated', time(v.updated_at)),
      row('seq', String(v.seq)));
    fill(this.actionsEl, app.canWrite ? VERBS.map((verb) => button(v, verb)) : []);
  }

  renderHead() {
    const v = this.view;
    const late = lateness(v);
    const a = (Date.now() - since(v)) / 1000;
    fill(this.headEl,
      h('h1', {}, v.name || v.id, ' ', phaseBadge(v.phase)),
      h('p', { class: `muted ${late}` }, `${v.phase} for ${age(a)}`,
        late ? ` (deadline ${age(app.server.deadline_seconds)})` : '',
        late === 'late' ? h('strong', { class: 'flag' }, ' — past its deadline') : ''));
  }

  async loadHistory() {
    try {
      const { data } = await api.history(this.view.id, this.lastSeq);
      const items = (data.items || []).filter((e) => e.seq > this.lastSeq);
      if (!this.lastSeq) this.timelineBody.replaceChildren();
      for (const e of items) {
        this.lastSeq = Math.max(this.lastSeq, e.seq);
        if (e.type === 'sandbox.resume_requested') this.resume = { at: e.time, generation: (e.data || {}).generation };
        const lat = resumeLatency(e, this.resume);
        if (lat && e.type === 'supervisor.attached') this.resume = null; // ready ends it
        const more = [detail(e), lat].filter(Boolean).join(' · ');
        const o = outcome(e);
        const gen = e.data && e.data.generation !== undefined ? String(e.data.generation) : '';
        this.timelineBody.append(h('tr', { class: `event ${o ? `has-outcome outcome-row-${o}` : ''}`, 'data-type': e.type, 'data-seq': e.seq },
          h('td', { class: 'num' }, String(e.seq)),
          h('td', { class: 'time' }, h('time', { datetime: e.time }, time(e.time))),
          h('th', { scope: 'row', class: 'type' }, e.type.replace(/^sandbox\./, ''), more ? h('span', { class: 'muted detail' }, ` ${more}`) : ''),
          h('td', { class: 'actor' }, e.actor || ''),
          h('td', { class: 'command' }, e.command_id ? h('code', { title: e.command_id }, e.command_id.slice(0, 8)) : ''),
          h('td', {}, e.phase ? phaseBadge(e.phase) : ''),
          h('td', { class: 'num' }, gen),
          h('td', { class: 'outcome-cell' }, outcomeBadge(o))));
      }
    } catch (err) {
      if (err.status !== 401) app.status(`history: ${err.code}: ${err.message}`, 'error');
    }
  }

  async loadLogs() {
    try {
      const { data } = await api.logs(this.view.id, 50);
      this.logsEl.textContent = data || '(no output)';
    } catch (err) {
      this.logsEl.textContent = `(${err.code}: ${err.message})`;
    }
  }

  onView(v) {
    if (this.view.seq >= v.seq) return;
    const moved = v.phase !== this.view.phase;
    this.view = v;
    const focused = this.actionsEl.contains(document.activeElement) ? document.activeElement.dataset.verb : null;
    this.render();
    if (focused) this.actionsEl.querySelector(`[data-verb="${focused}"]`)?.focus();
    this.loadHistory();
    if (moved) this.loadLogs();
  }
}
