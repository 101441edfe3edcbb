// GET /v1/watch read with fetch and a stream reader, since EventSource
// cannot send an Authorization header: the server-sent events are parsed
// here, and a dropped stream is resumed with Last-Event-ID, the seq of the
// last view taken, after a back-off.

import { headers, session } from './api.js';

// watch calls onView(view) for each view change after seq `after` (null:
// from the current view of every sandbox), and onState('live' |
// 'reconnecting' | 'stopped', detail) when the stream's state changes,
// until stop() is called. A 401 calls onUnauthenticated and stops. base
// is the server's origin ('' on the page).
export function watch({ after, onView, onState, onUnauthenticated, base = '' }) {
  const ctl = new AbortController();
  let last = after;
  let delay = 500;
  let stopped = false;

  async function once() {
    const h = headers(session.token());
    if (last !== null && last !== undefined) h['Last-Event-ID'] = String(last);
    const res = await fetch(`${base}/v1/watch`, { headers: h, signal: ctl.signal, cache: 'no-store' });
    if (res.status === 401) {
      stopped = true;
      onUnauthenticated?.();
      return;
    }
    if (res.status === 403) { // a token without read: no retry will do
      stopped = true;
      onState('stopped', 'the token may not watch');
      return;
    }
    if (!res.ok || !res.body) {
      let msg = `${res.status}`;
      try { msg = (await res.json()).error.message; } catch { /* keep the status */ }
      throw new Error(msg);
    }
    onState('live');
    delay = 500;
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    const parser = new Parser();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      for (const ev of parser.push(value)) {
        let view = null;
        try { view = JSON.parse(ev.data); } catch { /* a garbled event is skipped */ }
        if (ev.id !== null) last = ev.id;
        if (view) onView(view);
      }
    }
  }

  (async () => {
    while (!stopped) {
      try {
        await once();
        if (stopped) break;
        onState('reconnecting', 'the stream ended');
      } catch (err) {
        if (ctl.signal.aborted) break;
        onState('reconnecting', err.message);
      }
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 10000);
    }
    onState('stopped');
  })();

  return {
    stop() { stopped = true; ctl.abort(); },
    get last() { return last; },
  };
}

// Parser takes a server-sent event stream in chunks cut anywhere and
// returns the events each chunk completes, {id, data}: id the last id
// field seen (a number, or null if none yet), data the event's data lines
// joined with newlines. Comments and other fields are skipped.
export class Parser {
  constructor() {
    this.buf = '';
    this.id = null;
    this.data = [];
  }

  push(chunk) {
    const out = [];
    this.buf += chunk;
    // A line ends at CRLF, LF or CR; a CR last may be half a CRLF.
    const cut = this.buf.endsWith('\r') ? this.buf.length - 1 : this.buf.length;
    const lines = this.buf.slice(0, cut).split(/\r\n|\r|\n/);
    this.buf = lines.pop() + this.buf.slice(cut); // an unfinished line waits for more
    for (const line of lines) {
      if (line === '') {
        if (this.data.length) out.push({ id: this.id, data: this.data.join('\n') });
        this.data = [];
        continue;
      }
      if (line.startsWith(':')) continue; // a comment
      const i = line.indexOf(':');
      const field = i < 0 ? line : line.slice(0, i);
      let v = i < 0 ? '' : line.slice(i + 1);
      if (v.startsWith(' ')) v = v.slice(1);
      if (field === 'data') this.data.push(v);
      else if (field === 'id' && /^\d+$/.test(v)) this.id = Number(v);
    }
    return out;
  }
}
