// The dashboard's only way to the server: the /v1 HTTP API, with the
// admin token (if the server wants one) kept in sessionStorage, for this
// browser tab's session only.

const TOKEN_KEY = 'sluice.adminToken';

// ApiError is an answer that was not 2xx: status, the API's error code
// and message.
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.code = code;
  }
}

export function token() {
  try {
    return sessionStorage.getItem(TOKEN_KEY) || '';
  } catch {
    return '';
  }
}

export function setToken(t) {
  sessionStorage.setItem(TOKEN_KEY, t);
}

export function forgetToken() {
  try {
    sessionStorage.removeItem(TOKEN_KEY);
  } catch {
    // storage disabled: nothing was kept
  }
}

// api calls the API: api('/v1/queues'), api('/v1/runs/3/pause', {method:
// 'POST'}). It resolves to the decoded JSON body and rejects with an
// ApiError (or a TypeError when the server cannot be reached).
export async function api(path, { method = 'GET', body, bearer } = {}) {
  const headers = { Accept: 'application/json' };
  const tok = bearer !== undefined ? bearer : token();
  if (tok) headers.Authorization = 'Bearer ' + tok;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const res = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: 'omit',
    cache: 'no-store',
    redirect: 'error',
  });
  let data = null;
  const text = await res.text();
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (!res.ok) {
    const e = (data && data.error) || {};
    throw new ApiError(res.status, e.code || 'http_' + res.status, e.message || res.statusText || 'HTTP ' + res.status);
  }
  return data;
}
