// The HTTP API as the page calls it: every request carries the token from
// session storage in its Authorization header (never in a URL, never a
// cookie); errors come back as APIError with the contract's code.

const KEY = 'torpor.token';

export const session = {
  token: () => sessionStorage.getItem(KEY),
  save: (t) => sessionStorage.setItem(KEY, t),
  clear: () => sessionStorage.removeItem(KEY),
};

export class APIError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

// onUnauthenticated is called when the server refuses the token (401):
// the app signs out.
let unauthenticated = () => {};
export function onUnauthenticated(f) { unauthenticated = f; }

// A uuid (v4) for idempotency keys, from getRandomValues, which a page
// served over plain http off loopback has too (randomUUID it has not).
export function uuid() {
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const x = [...b].map((v) => v.toString(16).padStart(2, '0')).join('');
  return `${x.slice(0, 8)}-${x.slice(8, 12)}-${x.slice(12, 16)}-${x.slice(16, 20)}-${x.slice(20)}`;
}

export function headers(token = session.token()) {
  return token ? { Authorization: `Bearer ${token}` } : {};
}

// request calls the API; it answers {data, headers, status}: data is the
// JSON body (or the text, with text: true).
export async function request(path, { method = 'GET', token, text = false, signal, key } = {}) {
  const h = headers(token ?? session.token());
  if (key) h['Idempotency-Key'] = key;
  let res;
  try {
    res = await fetch(path, { method, headers: h, signal, cache: 'no-store' });
  } catch (err) {
    if (err.name === 'AbortError') throw err;
    throw new APIError(0, 'UNAVAILABLE', `the server did not answer: ${err.message}`);
  }
  if (!res.ok) {
    let code = 'UNKNOWN';
    let message = `${res.status} ${res.statusText}`;
    try {
      const body = await res.json();
      if (body && body.error) ({ code, message } = body.error);
    } catch { /* not the contract's body */ }
    if (res.status === 401 && token === undefined) unauthenticated(message);
    throw new APIError(res.status, code, message);
  }
  const data = text ? await res.text() : await res.json();
  return { data, headers: res.headers, status: res.status };
}

export const api = {
  whoami: (token) => request('/v1/whoami', { token }),
  server: () => request('/v1/server'),
  phases: () => request('/v1/phases'),
  list: (params) => request(`/v1/sandboxes?${params}`),
  get: (id) => request(`/v1/sandboxes/${encodeURIComponent(id)}`),
  history: (id, after = 0) => request(`/v1/sandboxes/${encodeURIComponent(id)}/events${after ? `?after=${after}` : ''}`),
  logs: (id, tail = 50) => request(`/v1/sandboxes/${encodeURIComponent(id)}/logs?tail=${tail}`, { text: true }),
  // command sends a lifecycle verb with a fresh idempotency key.
  command: (id, verb) => request(
    verb === 'delete' ? `/v1/sandboxes/${encodeURIComponent(id)}` : `/v1/sandboxes/${encodeURIComponent(id)}/${verb}`,
    { method: verb === 'delete' ? 'DELETE' : 'POST', key: uuid() },
  ),
};

// The log's head before the answer's views were read (the server's
// Torpor-Log-Head header), or null when the server does not send it.
export function logHead(hdrs) {
  const v = hdrs.get('Torpor-Log-Head');
  return v !== null && /^\d+$/.test(v) ? Number(v) : null;
}
