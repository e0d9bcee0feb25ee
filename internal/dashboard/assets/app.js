// The dashboard app: routes a path to its page, keeps the page live
// (one refresh a second at most, while the tab is visible and updates
// are not paused), asks for the admin token when the API answers 401,
// and runs the actions of buttons.
import { api, ApiError, forgetToken, setToken, token } from './api.js';
import { h } from './dom.js';
import { notFound } from './widgets.js';
import overview from './pages/overview.js';
import tasks from './pages/tasks.js';
import task from './pages/task.js';
import workflows from './pages/workflows.js';
import workflow from './pages/workflow.js';
import runs from './pages/runs.js';
import run from './pages/run.js';
import workers from './pages/workers.js';

const ROUTES = [
  [/^\/$/, overview],
  [/^\/tasks$/, tasks],
  [/^\/tasks\/([^/]+)$/, task],
  [/^\/workflows$/, workflows],
  [/^\/workflows\/([^/]+)$/, workflow],
  [/^\/runs$/, runs],
  [/^\/runs\/([^/]+)$/, run],
  [/^\/workers$/, workers],
];

const INTERVAL = 1000; // the most often the API is polled (a page may ask for less: its interval)
const main = document.getElementById('main');
const liveEl = document.getElementById('live');
const toggle = document.getElementById('live-toggle');
const forgetBtn = document.getElementById('forget-token');

let current = null; // {gen, page, inst, root, stopped}
let gen = 0;
let timer = 0;
let busy = false;
let again = false;
let failures = 0;
let userPaused = false;
let authNeeded = false;

function setLive(state, detail) {
  liveEl.className = 'live live-' + state;
  liveEl.dataset.state = state;
  const words = {
    live: 'Live',
    paused: 'Updates paused',
    hidden: 'Updates paused (tab hidden)',
    offline: 'Offline: retrying',
    auth: 'Sign-in needed',
    connecting: 'Connecting…',
    idle: 'Nothing to update',
  };
  liveEl.textContent = words[state] || state;
  liveEl.title = detail || '';
}

function showForget() {
  forgetBtn.hidden = !token();
}

// route mounts the page of the current location.
function route() {
  clearTimeout(timer);
  gen++;
  const path = location.pathname;
  const query = new URLSearchParams(location.search);
  let page = null;
  let params = [];
  for (const [re, p] of ROUTES) {
    const m = re.exec(path);
    if (m) {
      page = p;
      params = m.slice(1).map((s) => {
        try {
          return decodeURIComponent(s);
        } catch {
          return s;
        }
      });
      break;
    }
  }
  const root = h('div', { class: 'page' });
  main.replaceChildren(root);
  markNav(path);
  if (!page) {
    document.title = 'Not found · sluice';
    root.append(notFound('Page', 'No dashboard page at ' + path + '.'));
    current = null;
    setLive('idle');
    return;
  }
  const ctx = makeContext(gen, params, query);
  document.title = page.title(params) + ' · sluice';
  const inst = page.mount(root, ctx);
  current = { gen, page, inst, root, params, stopped: false };
  if (authNeeded) {
    showAuth();
    return;
  }
  setLive(userPaused ? 'paused' : 'connecting');
  refreshNow();
}

function markNav(path) {
  for (const a of document.querySelectorAll('header nav a')) {
    const href = a.getAttribute('href');
    const on = href === '/' ? path === '/' : path === href || path.startsWith(href + '/');
    if (on) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
}

function makeContext(g, params, query) {
  return {
    params,
    query,
    navigate,
    // act runs an action's API call: the button is disabled meanwhile,
    // an error is reported, and the page refreshes at once after.
    async act(button, label, fn) {
      if (button.disabled) return;
      button.disabled = true;
      button.setAttribute('aria-busy', 'true');
      clearAlert();
      try {
        await fn();
      } catch (e) {
        if (e instanceof ApiError && e.status === 401) {
          needAuth('Your token was not accepted; sign in again.');
          return;
        }
        alertError(label + ' failed: ' + (e.message || e));
      } finally {
        button.disabled = false;
        button.removeAttribute('aria-busy');
      }
      if (g === gen) refreshNow();
    },
    alive: () => g === gen,
    refresh: () => {
      if (g === gen) refreshNow();
    },
  };
}

export function navigate(url, replace = false) {
  if (replace) history.replaceState(null, '', url);
  else history.pushState(null, '', url);
  route();
  main.focus({ preventScroll: true });
  window.scrollTo(0, 0);
}

function alertBox() {
  let el = document.getElementById('alert');
  if (!el) {
    el = h('div', { id: 'alert', class: 'alert', role: 'alert' });
    main.prepend(el);
  }
  return el;
}

function alertError(msg) {
  const el = alertBox();
  el.replaceChildren(h('span', {}, msg), h('button', { type: 'button', class: 'link', onclick: clearAlert }, 'Dismiss'));
}

function clearAlert() {
  const el = document.getElementById('alert');
  if (el) el.remove();
}

// refreshNow runs a refresh at once (or right after the one in flight).
function refreshNow() {
  clearTimeout(timer);
  if (busy) {
    again = true;
    return;
  }
  tick();
}

async function tick() {
  clearTimeout(timer);
  const cur = current;
  if (!cur || cur.stopped || authNeeded) return;
  if (userPaused) {
    setLive('paused');
    return;
  }
  if (document.hidden) {
    setLive('hidden');
    return;
  }
  busy = true;
  const focusKey = document.activeElement && document.activeElement.dataset ? document.activeElement.dataset.key : undefined;
  let delay = cur.page.interval || INTERVAL;
  let error = null;
  try {
    await cur.inst.refresh();
  } catch (e) {
    error = e;
  } finally {
    busy = false;
  }
  if (cur.gen !== gen) {
    // Another page was mounted meanwhile: it asked for its refresh.
    if (again) {
      again = false;
      tick();
    }
    return;
  }
  if (!error) {
    failures = 0;
    setLive('live', 'Updated ' + new Date().toLocaleTimeString());
  } else if (error instanceof ApiError && error.status === 401) {
    needAuth(token() ? 'The server did not accept the stored token; sign in again.' : '');
    return;
  } else if (error instanceof ApiError && (error.status === 404 || (error.status === 400 && cur.page.notFoundOn400))) {
    cur.stopped = true;
    cur.root.replaceChildren(notFound(cur.page.noun || 'Item', error.message));
    document.title = 'Not found · sluice';
    setLive('live');
    return;
  } else if (error instanceof ApiError && error.status === 400) {
    // A bad filter: say so, keep the page, poll on.
    alertError(error.message);
    setLive('live');
  } else {
    failures++;
    delay = Math.min(INTERVAL * 2 ** failures, 15000);
    setLive('offline', String(error.message || error));
  }
  restoreFocus(focusKey);
  if (again) {
    again = false;
    delay = 0;
  }
  timer = setTimeout(tick, delay);
}

// restoreFocus puts the keyboard focus back on the element with the same
// data-key after a re-render replaced the focused one.
function restoreFocus(key) {
  if (!key) return;
  const a = document.activeElement;
  if (a && a !== document.body && a.isConnected) return;
  const el = main.querySelector('[data-key="' + CSS.escape(key) + '"]');
  if (el) el.focus({ preventScroll: true });
}

function needAuth(message) {
  forgetToken();
  showForget();
  authNeeded = true;
  showAuth(message);
}

// showAuth replaces the page with the sign-in form.
function showAuth(message) {
  clearTimeout(timer);
  setLive('auth');
  const input = h('input', { id: 'token', name: 'token', type: 'password', autocomplete: 'current-password', required: true, spellcheck: 'false' });
  const err = h('p', { id: 'auth-error', class: 'error', role: 'alert' }, message || '');
  const submit = h('button', { type: 'submit', class: 'primary' }, 'Sign in');
  const form = h('form', { class: 'auth', 'aria-describedby': 'auth-help' },
    h('div', { class: 'field' }, h('label', { for: 'token' }, 'Admin token'), input),
    submit, err);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const tok = input.value.trim();
    if (!tok) return;
    submit.disabled = true;
    err.textContent = '';
    try {
      await api('/v1/environment', { bearer: tok });
      setToken(tok);
      authNeeded = false;
      showForget();
      route();
    } catch (e) {
      if (e instanceof ApiError && e.status === 401) err.textContent = 'The server rejected that token.';
      else if (e instanceof ApiError && e.status === 403) err.textContent = 'That is a worker token: the dashboard needs the admin token.';
      else err.textContent = 'Could not check the token: ' + (e.message || e);
      input.select();
    } finally {
      submit.disabled = false;
    }
  });
  main.replaceChildren(h('section', { class: 'signin', 'aria-labelledby': 'signin-h' },
    h('h1', { id: 'signin-h' }, 'Sign in'),
    h('p', { id: 'auth-help' }, 'This server needs its admin token (sluice server --admin-token, or SLUICE_ADMIN_TOKEN). ' +
      'The dashboard keeps it in this browser tab only, until you close the tab or choose “Forget token”.'),
    form));
  document.title = 'Sign in · sluice';
  input.focus();
}

// In-app links load their page without reloading.
document.addEventListener('click', (ev) => {
  if (ev.defaultPrevented || ev.button !== 0 || ev.metaKey || ev.ctrlKey || ev.shiftKey || ev.altKey) return;
  const a = ev.target.closest('a[href]');
  if (!a || a.target || a.hasAttribute('download')) return;
  const url = new URL(a.href, location.href);
  if (url.origin !== location.origin || url.pathname.startsWith('/v1/') || url.pathname.startsWith('/assets/')) return;
  if (url.pathname === '/metrics' || url.pathname === '/healthz' || url.pathname === '/readyz') return;
  ev.preventDefault();
  if (url.hash && url.pathname === location.pathname && url.search === location.search) {
    const target = document.getElementById(url.hash.slice(1));
    if (target) target.focus();
    return;
  }
  navigate(url.pathname + url.search);
});

window.addEventListener('popstate', route);

document.addEventListener('visibilitychange', () => {
  if (!document.hidden) refreshNow();
});

toggle.addEventListener('click', () => {
  userPaused = !userPaused;
  toggle.setAttribute('aria-pressed', String(userPaused));
  toggle.textContent = userPaused ? 'Resume updates' : 'Pause updates';
  if (userPaused) {
    clearTimeout(timer);
    setLive('paused');
  } else {
    refreshNow();
  }
});

forgetBtn.addEventListener('click', () => {
  forgetToken();
  showForget();
  authNeeded = false;
  route();
});

showForget();
route();
