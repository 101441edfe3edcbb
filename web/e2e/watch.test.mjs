// The dashboard's watch client (web/ui/watch.js) against a server that
// drops the stream: it parses the server-sent events by hand (split
// anywhere across chunks), and resumes with Last-Event-ID, the id of the
// last event it took. Run by web/e2e_test.go (TestPageModulesUnderNode) with
// `node --test`; no browser.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';

globalThis.sessionStorage = { getItem: () => 'torpor_t_secret' };
const { watch, Parser } = await import('../ui/watch.js');

// serve answers the n-th GET /v1/watch with answers[n](req, res).
async function serve(answers) {
  const seen = [];
  const srv = createServer((req, res) => {
    seen.push({ auth: req.headers.authorization, last: req.headers['last-event-id'] });
    const f = answers[seen.length - 1];
    if (f) f(req, res);
    else res.writeHead(500).end();
  });
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  return { base: `http://127.0.0.1:${srv.address().port}`, seen, close: () => { srv.closeAllConnections(); srv.close(); } };
}

const view = (id, seq, phase = 'ready') => JSON.stringify({ id, seq, phase });

test('the parser reads the same events whatever the chunks', () => {
  // CRLF, LF and CR line ends, a comment, a field without a colon, a data
  // of two lines, an id that stays for the next event, a half event last.
  const stream = `id: 6\ndata: ${view('a', 6)}\n\n: keep-alive\r\nid: 7\r\nretry\r\n` +
    `data: {"id":"b",\r\ndata: "seq":7}\r\n\r\ndata: ${view('c', 8)}\r\rid: 9\ndata: {"half"`;
  const want = [
    { id: 6, data: view('a', 6) },
    { id: 7, data: '{"id":"b",\n"seq":7}' },
    { id: 7, data: view('c', 8) },
  ];
  for (let i = 0; i <= stream.length; i++) {
    for (let j = i; j <= stream.length; j += 7) {
      const p = new Parser();
      const got = [...p.push(stream.slice(0, i)), ...p.push(stream.slice(i, j)), ...p.push(stream.slice(j))];
      assert.deepEqual(got, want, `cut at ${i} and ${j}`);
    }
  }
});

test('a dropped stream resumes from the last event taken', async () => {
  const s = await serve([
    (req, res) => {
      res.writeHead(200, { 'Content-Type': 'text/event-stream' });
      // Event 6 whole, a comment, event 7 split mid-line and mid-CRLF,
      // then half an event 8 that never ends: the server drops the stream.
      res.write(`id: 6\ndata: ${view('a', 6)}\n\n`);
      // Event 7's data is two lines (joined by a newline), the CRLF between
      // them split across two chunks.
      res.write(`: keep-alive\r\nid: 7\r\nda`);
      res.write(`ta: {"id":"b",\r`);
      res.write(`\ndata: "seq":7,"phase":"suspended"}\r\n\r\nid: 8\ndata: ${view('c', 8)}\n`);
      res.end();
    },
    (req, res) => {
      res.writeHead(200, { 'Content-Type': 'text/event-stream' });
      res.write(`id: 8\ndata: ${view('c', 8)}\n\n`);
    },
  ]);
  const got = [];
  const states = [];
  let w;
  await new Promise((resolve) => {
    w = watch({
      base: s.base,
      after: 5,
      onView: (v) => { got.push(v.seq); if (v.seq === 8) resolve(); },
      onState: (st) => states.push(st),
    });
  });
  w.stop();
  s.close();
  assert.deepEqual(got, [6, 7, 8]);
  assert.deepEqual(s.seen.map((r) => r.last), ['5', '7']);
  assert.deepEqual(s.seen.map((r) => r.auth), ['Bearer torpor_t_secret', 'Bearer torpor_t_secret']);
  assert.deepEqual(states.slice(0, 3), ['live', 'reconnecting', 'live']);
  assert.equal(w.last, 8);
});

test('a fresh watch sends no Last-Event-ID; a refused token ends it', async () => {
  const s = await serve([(req, res) => res.writeHead(401, { 'Content-Type': 'application/json' }).end('{"error":{"code":"UNAUTHENTICATED","message":"no"}}')]);
  await new Promise((resolve) => {
    watch({ base: s.base, after: null, onView: () => assert.fail('a view from a refused watch'), onState: () => {}, onUnauthenticated: resolve });
  });
  s.close();
  assert.deepEqual(s.seen.map((r) => r.last), [undefined]);
});
