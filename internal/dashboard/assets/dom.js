// DOM helpers. Every piece of data reaches the page as text (textContent,
// attribute values), never as HTML, so nothing the API returns can inject
// markup.

// h builds an element: h('a', {href: '/x', class: 'c'}, 'text', child…).
// Attributes: class, text, on<event> (a function), data-*, aria-*, and
// any other as a plain attribute (false, null and undefined are left out;
// true sets an empty attribute). Children: nodes, strings, numbers,
// arrays; null and false are skipped.
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') {
      el.addEventListener(k.slice(2), v);
    } else if (k === 'text') {
      el.textContent = String(v);
    } else if (k === 'class') {
      el.className = v;
    } else {
      el.setAttribute(k, v === true ? '' : String(v));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.append(c);
    else el.append(document.createTextNode(String(c)));
  }
}

// region returns a function that re-renders el from data only when data
// changed since the last call, so that a poll that finds nothing new
// leaves the page (and what the keyboard focuses) alone.
export function region(el) {
  let last;
  return (data, render) => {
    const key = JSON.stringify(data);
    if (key === last) return;
    last = key;
    const out = render(data);
    el.replaceChildren(...(Array.isArray(out) ? out : [out]).filter(Boolean));
  };
}

// fmtTime formats an RFC 3339 time in the browser's locale ("" for none).
export function fmtTime(iso) {
  if (!iso) return '';
  const d = new Date(iso);
  if (Number.isNaN(d.getTime()) || d.getFullYear() < 1971) return '';
  return d.toLocaleString(undefined, {
    month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit', second: '2-digit',
  });
}

// fmtAgo says how long ago iso was ("3s ago"), or how far ahead ("in 5s").
export function fmtAgo(iso, now = Date.now()) {
  if (!iso) return '';
  const t = new Date(iso).getTime();
  if (Number.isNaN(t) || t < 31536000000) return '';
  const ms = now - t;
  return ms >= 0 ? fmtDur(ms) + ' ago' : 'in ' + fmtDur(-ms);
}

// fmtDur formats milliseconds: 850ms, 4.2s, 3m 5s, 2h 10m, 3d 4h.
export function fmtDur(ms) {
  if (ms < 1000) return Math.max(0, Math.round(ms)) + 'ms';
  const s = ms / 1000;
  if (s < 60) return (s < 10 ? s.toFixed(1) : Math.round(s)) + 's';
  const m = Math.floor(s / 60);
  if (m < 60) return m + 'm ' + Math.floor(s % 60) + 's';
  const hr = Math.floor(m / 60);
  if (hr < 48) return hr + 'h ' + (m % 60) + 'm';
  return Math.floor(hr / 24) + 'd ' + (hr % 24) + 'h';
}

// fmtNum groups digits (10,000).
export function fmtNum(n) {
  return Number(n || 0).toLocaleString('en-US');
}

// pretty formats a JSON value for a <pre>: indented, but an array or
// object that fits on one line stays on one line.
export function pretty(v, indent = '') {
  if (v === undefined) return '';
  const flat = JSON.stringify(v);
  if (flat === undefined || v === null || typeof v !== 'object' || flat.length + indent.length <= 72) return flat;
  const inner = indent + '  ';
  if (Array.isArray(v)) {
    return '[\n' + v.map((x) => inner + pretty(x, inner)).join(',\n') + '\n' + indent + ']';
  }
  return '{\n' + Object.entries(v).map(([k, x]) => inner + JSON.stringify(k) + ': ' + pretty(x, inner)).join(',\n') + '\n' + indent + '}';
}

// qs builds a query string of the non-empty values of obj ("" if none).
export function qs(obj) {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(obj)) {
    if (v !== undefined && v !== null && v !== '') p.set(k, String(v));
  }
  const s = p.toString();
  return s ? '?' + s : '';
}
