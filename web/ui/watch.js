// GET /v1/watch read with fetch and a stream reader, since EventSource
// cannot send an Authorization header: the server-sent events are parsed
// here, and a dropped stream is resumed with Last-Event-ID, the seq of the
// last view taken, after a back-off.

import { headers, session } from './api.js';

// watch calls onView(view) for each view change after seq `after` (null:
// from the current view of every sandbox), and onState('live' |
// 'reconnecting' | 'stopped', detail) when the stream's state changes,
// until stop() is called. A 401 calls onUnauthenticated and stops.
export function watch({ after, onView, onState, onUnauthenticated }) {
  const ctl = new AbortController();
  let last = after;
  let delay = 500;
  let stopped = false;

  async function once() {
    const h = headers(session.token());
    if (last !== null && last !== undefined) h['Last-Event-ID'] = String(last);
    const res = await fetch('/v1/watch', { headers: h, signal: ctl.signal, cache: 'no-store' });
    if (res.status === 401) {
      stopped = true;
      onUnauthenticated?.();
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
    let buf = '';
    let id = null;
    let data = [];
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += value;
      const lines = buf.split(/\r\n|\r|\n/);
      buf = lines.pop(); // an unfinished line waits for more
      for (const line of lines) {
        if (line === '') {
          if (data.length) {
            let view = null;
            try { view = JSON.parse(data.join('\n')); } catch { /* a garbled event is skipped */ }
            if (id !== null) last = id;
            if (view) onView(view);
          }
          data = [];
          continue;
        }
        if (line.startsWith(':')) continue; // a comment
        const i = line.indexOf(':');
        const field = i < 0 ? line : line.slice(0, i);
        let v = i < 0 ? '' : line.slice(i + 1);
        if (v.startsWith(' ')) v = v.slice(1);
        if (field === 'data') data.push(v);
        else if (field === 'id' && /^\d+$/.test(v)) id = Number(v);
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
