// The dashboard's entry: sign-in, the watch every view shares, and the
// routes (#/ the list, #/sandbox/ID one sandbox).

import { api, session, onUnauthenticated } from './api.js';
import { fill } from './dom.js';
import { app } from './state.js';
import { ListView } from './list.js';
import { SandboxView } from './sandbox.js';

const $ = (id) => document.getElementById(id);

let current = null;

async function route() {
  if (!session.token()) return;
  const hash = location.hash || '#/';
  current?.close?.();
  const view = $('view');
  fill(view);
  const m = hash.match(/^#\/sandbox\/([^/?]+)/);
  if (!m) app.listHash = hash;
  current = m ? new SandboxView(view, decodeURIComponent(m[1])) : new ListView(view, new URLSearchParams(hash.split('?')[1] || ''));
  await current.open();
}

async function start() {
  $('signin').hidden = true;
  $('signout').hidden = false;
  try {
    const [who, server] = await Promise.all([api.whoami(), api.server()]);
    const scopes = who.data.scopes || [];
    app.canWrite = scopes.includes('write') || scopes.includes('admin');
    app.server = server.data;
    $('who').textContent = `${who.data.name || 'no auth'} · ${scopes.join(', ')}`;
    $('server').textContent = `node ${server.data.node} · deadline ${server.data.deadline_seconds}s`;
  } catch (err) {
    if (err.status === 401) return;
    app.status(`${err.code}: ${err.message}`, 'error');
  }
  await route();
}

function signOut(message) {
  session.clear();
  app.watcher?.stop();
  app.watcher = null;
  app.recent.clear();
  current?.close?.();
  current = null;
  fill($('view'));
  $('who').textContent = '';
  $('server').textContent = '';
  $('live').textContent = '';
  $('signout').hidden = true;
  $('signin').hidden = false;
  $('signin-error').textContent = message || '';
  $('token').value = '';
  $('token').focus();
}

app.signOut = signOut;
app.route = route;
onUnauthenticated((msg) => signOut(`The server refused the token: ${msg}`));

$('signin-form').addEventListener('submit', async (e) => {
  e.preventDefault();
  const token = $('token').value.trim();
  $('signin-error').textContent = '';
  try {
    await api.whoami(token);
  } catch (err) {
    $('signin-error').textContent = err.status === 401 ? 'This token is not valid here.' : `${err.code}: ${err.message}`;
    return;
  }
  session.save(token);
  $('token').value = '';
  await start();
  $('main').focus();
});

$('signout').addEventListener('click', () => signOut('Signed out.'));
window.addEventListener('hashchange', route);

if (session.token()) start();
else signOut();
