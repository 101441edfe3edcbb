// The dashboard in headless Chromium against a real node (web/e2e_test.go
// starts it and sets the environment): `node dashboard.mjs write|read|paint`.
// Exit status 0 when every check held; a failed check throws.
//
//   write: sign in with the write token, see the counts the API answers,
//          suspend TARGET from its row and see it turn suspended without a
//          reload, find the transitions in its timeline with actor and
//          outcome, resume it from its page; a start of SUSPENDED asks
//          first; screenshots in SHOTS (list.png, sandbox.png, list-phone.png,
//          sandbox-phone.png).
//   read:  sign in with the read token: no action buttons anywhere, and a
//          suspend forged from the page is PERMISSION_DENIED.
//   paint: with SANDBOXES in the view, the time from navigation to the
//          table's first rows visible.

import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} is not set (web/e2e_test.go sets it)`);
  return v;
};
const URL = env('TORPOR_URL');
const SHOTS = env('SHOTS');
const mode = process.argv[2];
const WAIT = { timeout: 20000 };

// api calls the API from node, as a second witness of what the page shows.
async function api(path, token = env('TORPOR_ADMIN_TOKEN')) {
  const res = await fetch(URL + path, { headers: { Authorization: `Bearer ${token}` } });
  assert.equal(res.status, 200, `GET ${path}: ${res.status}`);
  return res.json();
}

async function launch() {
  const profile = mkdtempSync(join(tmpdir(), 'torpor-chromium-'));
  const ctx = await chromium.launchPersistentContext(profile, {
    executablePath: env('CHROMIUM'),
    headless: true,
    viewport: { width: 1280, height: 800 },
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  const page = ctx.pages()[0] || await ctx.newPage();
  const problems = [];
  page.on('pageerror', (err) => problems.push(`page error: ${err.message}`));
  page.on('console', (m) => { if (m.type() === 'error') problems.push(`console: ${m.text()}`); });
  return {
    page,
    problems,
    async close() { await ctx.close(); rmSync(profile, { recursive: true, force: true }); },
  };
}

// signIn signs in from the keyboard: the token field has the focus when
// the page opens, Enter submits.
async function signIn(page, token) {
  await page.goto(URL);
  await page.getByLabel('Token').waitFor(WAIT);
  assert.equal(await page.evaluate(() => document.activeElement?.id), 'token', 'the token field has the focus');
  await page.keyboard.type(token);
  await page.keyboard.press('Enter');
  await page.locator('tbody tr.row').first().waitFor(WAIT);
  // Every field has its label.
  const unlabelled = await page.locator('input, select').evaluateAll((els) => els.filter((e) => !e.labels?.length && !e.getAttribute('aria-label')).map((e) => e.outerHTML));
  assert.deepEqual(unlabelled, []);
}

const row = (page, name) => page.locator('tbody tr.row', { has: page.getByRole('link', { name, exact: true }) });

// waitRows waits until the table's rows are names (in that order if
// ordered, else in any).
async function waitRows(page, names, ordered = false) {
  const want = ordered ? names : [...names].sort();
  try {
    await page.waitForFunction(({ want, ordered }) => {
      let got = [...document.querySelectorAll('tbody tr.row th a')].map((a) => a.textContent);
      if (!ordered) got = got.sort();
      return JSON.stringify(got) === JSON.stringify(want);
    }, { want, ordered }, WAIT);
  } catch (err) {
    const got = await page.locator('tbody tr.row th a').allTextContents();
    assert.deepEqual(got, want, `rows: ${err.message}`);
  }
}

// timelineRow is the row of event type in the sandbox page's timeline.
const timelineRow = (page, type) => page.locator(`.timeline tr[data-type="${type}"]`);

async function write() {
  const { page, problems, close } = await launch();
  try {
    const token = env('TORPOR_WRITE_TOKEN');
    await signIn(page, token);
    assert.equal(await page.evaluate(() => sessionStorage.getItem('torpor.token')) !== null, true, 'the token is in session storage');
    assert.equal(await page.evaluate(() => document.cookie), '', 'no cookie');
    assert.ok(!page.url().includes(token), 'the token is not in the URL');

    // The counts are the API's.
    const counts = await api('/v1/phases');
    for (const [phase, n] of Object.entries(counts)) {
      await page.locator(`.counts button[data-phase="${phase}"] .n`).filter({ hasText: new RegExp(`^${n}$`) }).waitFor(WAIT);
    }
    const total = Object.values(counts).reduce((a, b) => a + b, 0);
    assert.ok(total >= 7, `counts ${JSON.stringify(counts)}`);
    console.log(`counts seen: ${JSON.stringify(counts)}`);

    // The watch is live; mark the document so that a reload would show.
    await page.locator('#live[data-state="live"]').waitFor(WAIT);
    await page.evaluate(() => { window.notReloaded = true; });

    // The stuck suspend is highlighted as transient against the deadline.
    await row(page, 'stuck-1').and(page.locator('.transient, .aging, .late')).waitFor(WAIT);

    // Suspend TARGET from its row: it turns suspended, without a reload.
    const target = env('TARGET');
    const r = row(page, target);
    assert.equal(await r.getAttribute('data-phase'), 'ready');
    await r.getByRole('button', { name: `suspend ${target}` }).click();
    await page.locator(`tbody tr.row[data-phase="suspended"]`, { has: page.getByRole('link', { name: target, exact: true }) }).waitFor(WAIT);
    assert.equal(await page.evaluate(() => window.notReloaded), true, 'the page was reloaded');
    const after = await api('/v1/phases');
    await page.locator(`.counts button[data-phase="suspended"] .n`).filter({ hasText: new RegExp(`^${after.suspended}$`) }).waitFor(WAIT);
    console.log(`${target}: suspended through its row, seen without a reload`);
    await page.screenshot({ path: join(SHOTS, 'list.png') });

    // A start of a suspended sandbox asks first; Cancel sends nothing.
    const held = env('SUSPENDED');
    await row(page, held).getByRole('button', { name: `start ${held}` }).click();
    const dialog = page.getByRole('dialog');
    await dialog.waitFor(WAIT);
    assert.match(await dialog.textContent(), /discards its retained state/);
    await dialog.getByRole('button', { name: 'Cancel' }).click();
    await dialog.waitFor({ state: 'hidden', ...WAIT });
    const heldView = (await api(`/v1/sandboxes?limit=100`)).items.find((v) => v.name === held);
    assert.equal(heldView.phase, 'suspended', 'a cancelled start sent nothing');
    const heldHistory = await api(`/v1/sandboxes/${heldView.id}/events`);
    assert.ok(!heldHistory.items.some((e) => e.type === 'sandbox.start_requested' && e.seq > heldView.seq - 100 && e.data.generation > 1),
      'no start was requested');

    // Its page: the transitions in the timeline, with actor and phase after.
    await r.getByRole('link', { name: target, exact: true }).click();
    await page.waitForURL(/#\/sandbox\//);
    const actor = `token:servetest-write`;
    const req = timelineRow(page, 'sandbox.suspend_requested');
    await req.waitFor(WAIT);
    assert.equal((await req.locator('.actor').textContent()).trim(), actor);
    await timelineRow(page, 'sandbox.suspended').locator('.phase', { hasText: 'suspended' }).waitFor(WAIT);

    // Resume from its page: ready again, the timeline says restored, by whom.
    // From the keyboard: Tab reaches the button, Enter presses it.
    // (suspend, disabled now, is skipped).
    await page.getByRole('link', { name: '← All sandboxes' }).focus();
    await page.keyboard.press('Tab');
    assert.equal(await page.evaluate(() => document.activeElement?.dataset.verb), 'resume');
    await page.keyboard.press('Enter');
    await page.locator('.sandbox-head .phase', { hasText: /^ready$/ }).waitFor(WAIT);
    const resumed = timelineRow(page, 'sandbox.resumed');
    await resumed.locator('.outcome', { hasText: 'restored' }).waitFor(WAIT);
    await timelineRow(page, 'sandbox.resume_requested').locator('.actor', { hasText: actor }).waitFor(WAIT);
    assert.equal(await page.evaluate(() => window.notReloaded), true, 'the page was reloaded');
    console.log(`${target}: resumed from its page; timeline: ${(await page.locator('.timeline tbody tr').allTextContents()).length} events`);
    await page.locator('.logs').waitFor(WAIT);
    await page.screenshot({ path: join(SHOTS, 'sandbox.png'), fullPage: true });

    // Outcomes at a glance: the fallback and the failed restore.
    await page.goto(`${URL}/#/`);
    await row(page, 'flaky-1').locator('.outcome-cold_start_fallback').waitFor(WAIT);
    await row(page, 'cache-1').locator('.outcome-restore_failed').waitFor(WAIT);

    // Filters: a phase's count shows that phase only; a label and a name
    // from the form.
    await page.locator('.counts button[data-phase="suspended"]').click();
    await page.waitForURL(/phase=suspended/);
    await page.locator('.counts button[data-phase="suspended"][aria-pressed="true"]').waitFor(WAIT);
    const suspendedNames = (await api('/v1/sandboxes?phase=suspended')).items.map((v) => v.name).sort();
    await waitRows(page, suspendedNames);
    await page.getByRole('button', { name: 'Clear' }).click();
    await page.getByLabel('Label').fill('team=web');
    await page.getByLabel('Label').press('Enter');
    await waitRows(page, ['web-1', 'web-2']);
    await page.getByLabel('Label').fill('');
    await page.getByLabel('Name contains').fill('-1');
    await page.getByLabel('Sort').selectOption('-name');
    await page.getByRole('button', { name: 'Apply' }).click();
    await waitRows(page, ['web-1', 'stuck-1', 'flaky-1', 'db-1', 'cache-1', 'batch-1'], true);
    await page.getByRole('button', { name: 'Clear' }).click();
    await page.locator('tbody tr.row').nth(6).waitFor(WAIT);

    // A phone's width: nothing wider than the screen but the table's own
    // scrolling region.
    await page.setViewportSize({ width: 375, height: 800 });
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth);
    assert.ok(overflow <= 375, `the page is ${overflow}px wide at 375px`);
    await page.screenshot({ path: join(SHOTS, 'list-phone.png'), fullPage: true });
    await row(page, target).getByRole('link', { name: target, exact: true }).click();
    await timelineRow(page, 'sandbox.resumed').waitFor(WAIT);
    const pageWidth = await page.evaluate(() => document.documentElement.scrollWidth);
    assert.ok(pageWidth <= 375, `the sandbox page is ${pageWidth}px wide at 375px`);
    await page.screenshot({ path: join(SHOTS, 'sandbox-phone.png'), fullPage: true });

    // Sign out: the token leaves session storage.
    await page.getByRole('button', { name: 'Sign out' }).click();
    assert.equal(await page.evaluate(() => sessionStorage.getItem('torpor.token')), null);
    await page.getByLabel('Token').waitFor(WAIT);
    assert.deepEqual(problems, []);
  } finally {
    await close();
  }
}

async function read() {
  const { page, problems, close } = await launch();
  try {
    const token = env('TORPOR_READ_TOKEN');
    await signIn(page, token);
    await page.locator('#live[data-state="live"]').waitFor(WAIT);
    assert.equal(await page.locator('button.action').count(), 0, 'action buttons on the list for a read token');
    const target = env('TARGET');
    await row(page, target).getByRole('link', { name: target, exact: true }).click();
    await page.locator('.timeline tbody tr').first().waitFor(WAIT);
    assert.equal(await page.locator('button.action').count(), 0, 'action buttons on a sandbox page for a read token');

    // A suspend forged from the page with the read token is refused.
    const before = (await api('/v1/sandboxes?limit=100')).items.find((v) => v.name === target);
    const forged = await page.evaluate(async ({ id, token }) => {
      const res = await fetch(`/v1/sandboxes/${id}/suspend`, { method: 'POST', headers: { Authorization: `Bearer ${token}` } });
      return { status: res.status, body: await res.json() };
    }, { id: before.id, token });
    assert.equal(forged.status, 403);
    assert.equal(forged.body.error.code, 'PERMISSION_DENIED');
    const after = await api(`/v1/sandboxes/${before.id}`);
    assert.equal(after.seq, before.seq, 'the forged suspend changed the sandbox');
    console.log(`read token: no action buttons; forged suspend: ${forged.status} ${forged.body.error.code}`);

    // A sandbox's page opened first (a link, a reload): its watch starts
    // at the log's head and shows a change made elsewhere, live.
    const other = (await api('/v1/sandboxes?limit=100')).items.find((v) => v.name === 'web-2');
    await page.goto('about:blank'); // a new document, not a hash change
    await page.goto(`${URL}/#/sandbox/${other.id}`);
    await page.locator('#live[data-state="live"]').waitFor(WAIT);
    await timelineRow(page, 'supervisor.attached').first().waitFor(WAIT);
    const res = await fetch(`${URL}/v1/sandboxes/${other.id}/suspend`, { method: 'POST', headers: { Authorization: `Bearer ${env('TORPOR_ADMIN_TOKEN')}` } });
    assert.equal(res.status, 202);
    await page.locator('.sandbox-head .phase', { hasText: /^suspended$/ }).waitFor(WAIT);
    await timelineRow(page, 'sandbox.suspended').waitFor(WAIT);
    assert.equal((await timelineRow(page, 'sandbox.suspend_requested').locator('.actor').textContent()).trim(), 'token:admin');
    console.log('a sandbox page opened first: a suspend made elsewhere seen live');
    // The refusal logs a console error (a failed fetch); nothing else may.
    assert.deepEqual(problems.filter((p) => !p.includes('403')), []);
  } finally {
    await close();
  }
}

async function paint() {
  const { page, problems, close } = await launch();
  try {
    const n = Number(env('SANDBOXES'));
    await signIn(page, env('TORPOR_READ_TOKEN'));
    const counts = await api('/v1/phases');
    const total = Object.values(counts).reduce((a, b) => a + b, 0);
    assert.ok(total >= n, `${total} sandboxes in the view, want ${n}`);
    for (const [label, hash] of [['creation order', '#/'], ['sorted by age in phase', '#/?sort=age'], ['creation order, again', '#/']]) {
      // A navigation from a blank page: the token stays in the tab's
      // session storage, as after a reload.
      await page.goto('about:blank');
      const t0 = Date.now();
      await page.goto(`${URL}/${hash}`);
      await page.locator('tbody tr.row').first().waitFor({ state: 'visible', timeout: 30000 });
      const wall = Date.now() - t0;
      const inPage = await page.evaluate(() => performance.now());
      const rows = await page.locator('tbody tr.row').count();
      // Where the time went: the page's requests, by path, in ms.
      const calls = await page.evaluate(() => performance.getEntriesByType('resource')
        .filter((e) => e.name.includes('/v1/') && !e.name.includes('/v1/watch'))
        .map((e) => `${new URL(e.name).pathname} ${e.duration.toFixed(0)}`).join(', '));
      console.log(`first paint with ${total} sandboxes, ${label}: ${wall} ms (in page ${inPage.toFixed(0)} ms since navigation), ${rows} rows; requests: ${calls}`);
      assert.equal(rows, 100);
    }
    // Paging: Next shows the following 100, Previous the first again.
    const names = () => page.locator('tbody tr.row th a').allTextContents();
    const first = await names();
    await page.getByRole('button', { name: 'Next →' }).click();
    await page.getByText('page 2', { exact: false }).waitFor(WAIT);
    const second = await names();
    assert.equal(second.length, 100);
    assert.ok(!second.some((n) => first.includes(n)), 'page 2 repeats page 1');
    await page.getByRole('button', { name: '← Previous' }).click();
    await page.getByText('page 1', { exact: false }).waitFor(WAIT);
    assert.deepEqual(await names(), first);
    assert.deepEqual(problems, []);
  } finally {
    await close();
  }
}

const modes = { write, read, paint };
if (!modes[mode]) {
  console.error('usage: node dashboard.mjs write|read|paint');
  process.exit(2);
}
try {
  await modes[mode]();
} catch (err) {
  console.error(err);
  process.exit(1);
}
