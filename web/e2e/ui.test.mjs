// Pure parts of the page's modules under node (no browser): how a
// transient sandbox is judged against the server's deadline, and which
// events of a timeline carry an outcome badge. Run by web/e2e_test.go
// (TestPageModulesUnderNode) with `node --test`.

import { test } from 'node:test';
import assert from 'node:assert/strict';

const { app } = await import('../ui/state.js');
const { lateness, since } = await import('../ui/list.js');
const { outcome, detail, idlePolicy, expiry, resumeLatency } = await import('../ui/sandbox.js');
const { time } = await import('../ui/dom.js');

test('a transient phase is judged against the deadline, from phase_since', () => {
  app.server.deadline_seconds = 120;
  const now = Date.parse('2026-12-06T12:00:00Z');
  const at = (s) => new Date(now - s * 1000).toISOString();
  for (const [v, want] of [
    [{ phase: 'suspending', phase_since: at(10), updated_at: at(1) }, 'transient'],
    [{ phase: 'starting', phase_since: at(61), updated_at: at(1) }, 'aging'],
    [{ phase: 'deleting', phase_since: at(121), updated_at: at(1) }, 'late'],
    // No phase_since (a server before it): updated_at stands in.
    [{ phase: 'provisioning', updated_at: at(130) }, 'late'],
    [{ phase: 'stopping', updated_at: at(5) }, 'transient'],
    // Settled phases are never late, however old.
    [{ phase: 'ready', phase_since: at(100000), updated_at: at(1) }, ''],
    [{ phase: 'suspended', phase_since: at(100000), updated_at: at(1) }, ''],
    [{ phase: 'hibernating', phase_since: at(100000), updated_at: at(1) }, ''], // a phase this page does not know
  ]) {
    assert.equal(lateness(v, now), want, JSON.stringify(v));
  }
  assert.equal(since({ phase_since: at(3), updated_at: at(1) }), now - 3000);
});

test('the timeline tells restored, cold_start_fallback and restore_failed apart', () => {
  for (const [e, want] of [
    [{ type: 'sandbox.resumed', data: { generation: 2, outcome: 'restored' } }, 'restored'],
    [{ type: 'sandbox.resumed', data: { generation: 3, outcome: 'cold_start_fallback' } }, 'cold_start_fallback'],
    [{ type: 'sandbox.start_requested', data: { generation: 3, fallback: true } }, 'cold_start_fallback'],
    [{ type: 'sandbox.start_requested', data: { generation: 3 } }, ''],
    [{ type: 'sandbox.resume_failed', data: { generation: 2, message: 'boom' } }, 'restore_failed'],
    // A strict resume whose restore failed after the consumption.
    [{ type: 'sandbox.stopped', data: { generation: 2, reason: 'RetainedStateLost' } }, 'restore_failed'],
    [{ type: 'sandbox.stopped', data: { generation: 2 } }, ''],
    [{ type: 'sandbox.suspend_rejected', data: { generation: 1, reason: 'DeadlineExceeded' } }, 'suspend_timed_out'],
    [{ type: 'sandbox.suspend_rejected', data: { generation: 1 } }, 'suspend_rejected'],
    [{ type: 'sandbox.suspended', data: { generation: 1, restore_ref: 'sim:x' } }, ''],
    [{ type: 'sandbox.something_new' }, ''],
  ]) {
    assert.equal(outcome(e), want, JSON.stringify(e));
  }
});

test('the timeline says where activity came from', () => {
  for (const [e, want] of [
    [{ type: 'sandbox.active', data: { source: 'forward', at: '2026-12-06T12:00:00Z' } }, 'by forward'],
    [{ type: 'sandbox.active', data: { source: 'touch', at: '2026-12-06T12:00:00Z' } }, 'by touch'],
    [{ type: 'sandbox.exited', data: { generation: 1, code: 3 } }, 'exit 3'],
    [{ type: 'sandbox.forward_opened', data: { source: 'x' } }, ''],
    [{ type: 'sandbox.idle_timeout', data: { policy: { after: '15m0s', action: 'suspend', fallback: 'none' }, last_active_at: '2026-12-06T12:00:00Z', action: 'stop' } },
      'idle since 2026-12-06T12:00:00Z → stop'],
  ]) {
    assert.equal(detail(e), want, JSON.stringify(e));
  }
});

test('the timeline says resume latency as the metric defines it, from the command accepted', () => {
  const resume = { at: '2026-12-06T12:00:00.000Z', generation: 3 };
  for (const [e, want] of [
    [{ type: 'sandbox.resumed', time: '2026-12-06T12:00:00.400Z', data: { generation: 3, outcome: 'restored', restore_started_at: '2026-12-06T12:00:00.015Z', running_at: '2026-12-06T12:00:00.240Z' } },
      '→restore_started 15 ms · →running 240 ms'],
    [{ type: 'sandbox.resumed', time: '2026-12-06T12:00:00.400Z', data: { generation: 3, outcome: 'restored', restore_started_at: '2026-12-06T12:00:00.015Z', running_at: '2026-12-06T12:00:00.240Z', loaded_at: '2026-12-06T12:00:01.000Z' } },
      '→restore_started 15 ms · →running 240 ms · →loaded 1000 ms'],
    // A driver that says no stage (sim), a fallback's cold start.
    [{ type: 'sandbox.resumed', time: '2026-12-06T12:00:00.400Z', data: { generation: 3, outcome: 'restored' } }, ''],
    [{ type: 'sandbox.resumed', time: '2026-12-06T12:00:00.400Z', data: { generation: 4, outcome: 'cold_start_fallback' } }, ''],
    // ready: the resumed generation's attach, at its own time.
    [{ type: 'supervisor.attached', time: '2026-12-06T12:00:00.312Z', data: { generation: 3 } }, '→ready 312 ms'],
    [{ type: 'supervisor.attached', time: '2026-12-06T12:00:00.312Z', data: { generation: 2 } }, ''],
    [{ type: 'sandbox.retained_state_consumed', time: '2026-12-06T12:00:00.100Z', data: { generation: 3 } }, ''],
  ]) {
    assert.equal(resumeLatency(e, resume), want, JSON.stringify(e));
  }
  assert.equal(resumeLatency({ type: 'supervisor.attached', time: '2026-12-06T12:00:00.312Z', data: { generation: 3 } }, null), '', 'no resume before it');
});

test('the sandbox page says what its idle policy does', () => {
  for (const [p, want] of [
    [undefined, ''],
    [{ after: '15m0s', action: 'suspend', fallback: 'none' }, 'suspend after 15m0s idle'],
    [{ after: '15m0s', action: 'suspend', fallback: 'stop' }, 'suspend after 15m0s idle, else stop'],
    [{ after: '1h0m0s', action: 'stop', fallback: 'none' }, 'stop after 1h0m0s idle'],
  ]) {
    assert.equal(idlePolicy(p), want, JSON.stringify(p));
  }
});

test('the sandbox page shows wake on traffic, the expiry, its pause and the retention', () => {
  const at = '2026-12-06T13:00:00Z';
  const held = '2026-12-06T12:30:00Z';
  for (const [v, want] of [
    [{}, [['wake on traffic', 'off']]],
    [{ wake_on_traffic: true, expires_at: at, on_expiry: 'stop' },
      [['wake on traffic', 'on'], ['expires', `${time(at)}, then stop`]]],
    [{ expires_at: at, on_expiry: 'delete', ttl_pauses_while_suspended: true },
      [['wake on traffic', 'off'], ['expires', `${time(at)}, then delete (pauses while suspended)`]]],
    [{ expires_at: at, on_expiry: 'delete', ttl_pauses_while_suspended: true, expiry_paused: true, retain_for: '1h0m0s', restore: { held: true, expires_at: held } },
      [['wake on traffic', 'off'], ['expires', `${time(at)}, then delete (paused while suspended)`],
        ['retains state for', '1h0m0s'], ['retained state expires', time(held)]]],
    // A state consumed or invalidated has no expires_at (the view clears it): no row.
    [{ retain_for: '1h0m0s', restore: { held: false, consumed: true } }, [['wake on traffic', 'off'], ['retains state for', '1h0m0s']]],
  ]) {
    assert.deepEqual(expiry(v), want, JSON.stringify(v));
  }
});
