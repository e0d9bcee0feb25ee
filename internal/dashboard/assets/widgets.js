// Building blocks shared by the pages: state badges, bars, tables,
// filter forms, pagers and action buttons.
import { h, pretty, qs } from './dom.js';

export const TASK_STATES = ['waiting', 'scheduled', 'queued', 'reserved', 'ready', 'running', 'suspended', 'succeeded', 'failed', 'cancelled', 'paused'];
export const RUN_STATES = ['queued', 'running', 'paused', 'succeeded', 'failed', 'cancelled'];
const TERMINAL = new Set(['succeeded', 'failed', 'cancelled', 'skipped']);

export function terminal(state) {
  return TERMINAL.has(state);
}

// badge shows a state as a coloured label (the word is always written:
// colour is never the only signal).
export function badge(state) {
  return h('span', { class: 'badge state-' + String(state || 'unknown').replace(/[^a-z_]/g, '') }, state || 'unknown');
}

// bar is a horizontal fill of value out of max, hidden from screen
// readers: the text beside it says the numbers.
export function bar(value, max, cls = '') {
  const fill = h('span', { class: 'fill' });
  const ratio = max > 0 ? Math.min(1, value / max) : 0;
  fill.style.width = (ratio * 100).toFixed(1) + '%';
  const full = max > 0 && value >= max;
  return h('span', { class: 'bar ' + cls + (full ? ' full' : ''), 'aria-hidden': 'true' }, fill);
}

// segments is a bar of several parts ([{n, cls, label}]) out of total.
export function segments(parts, total) {
  const el = h('span', { class: 'bar segments', 'aria-hidden': 'true' });
  for (const p of parts) {
    if (!p.n || total <= 0) continue;
    const s = h('span', { class: 'seg ' + p.cls, title: p.n + ' ' + p.label });
    s.style.width = ((p.n / total) * 100).toFixed(2) + '%';
    el.append(s);
  }
  return el;
}

// table builds a captioned table with column headers, inside a wrapper
// that scrolls sideways on a narrow screen. rows are <tr> elements or
// arrays of cells; empty is what an empty table says.
export function table(caption, headers, rows, empty = 'Nothing here yet.') {
  const thead = h('thead', {}, h('tr', {}, headers.map((c) => h('th', { scope: 'col' }, c))));
  const body = rows.length
    ? rows.map((r) => (r instanceof Node ? r : h('tr', {}, r.map((c) => (c instanceof Node && c.tagName === 'TD') || (c instanceof Node && c.tagName === 'TH') ? c : h('td', {}, c)))))
    : [h('tr', {}, h('td', { colspan: headers.length, class: 'empty' }, empty))];
  const cap = h('caption', {}, caption);
  return h('div', { class: 'table-wrap', tabindex: '0', role: 'region', 'aria-label': caption },
    h('table', {}, cap, thead, h('tbody', {}, body)));
}

// dl lists [term, value] pairs, skipping empty values.
export function dl(pairs, cls = 'facts') {
  const items = [];
  for (const [k, v] of pairs) {
    if (v === undefined || v === null || v === '') continue;
    items.push(h('div', {}, h('dt', {}, k), h('dd', {}, v)));
  }
  return h('dl', { class: cls }, items);
}

// jsonBlock shows a JSON value under a heading (nothing for null unless
// always).
export function jsonBlock(title, value, always = false) {
  if ((value === null || value === undefined) && !always) return null;
  return h('section', { class: 'json' }, h('h3', {}, title), h('pre', { tabindex: '0' }, h('code', {}, pretty(value))));
}

// actionButton is a real <button> that runs an API call through ctx.act
// (which disables it meanwhile, reports errors and refreshes the page).
// key identifies it across re-renders so that keyboard focus survives a
// live update. With confirm ({title, body, yes}), the action runs only
// once the confirmation dialog is accepted; declined, nothing is sent.
export function actionButton(ctx, { label, key, run, danger = false, title, confirm }) {
  const b = h('button', { type: 'button', class: danger ? 'danger' : '', 'data-key': key, title }, label);
  b.addEventListener('click', async () => {
    if (confirm && !(await confirmDialog(confirm))) return;
    ctx.act(b, label, run);
  });
  return b;
}

// confirmDialog asks before an action that cannot be undone, in a modal
// <dialog> of the page (not window.confirm, which a page cannot style
// and a test cannot always answer). It resolves to true when the user
// confirms, false when they decline (the "Keep" button, Escape). The
// dialog hangs off <body>, so a live re-render of the page under it
// leaves it alone; "Keep", the safe choice, has the focus.
export function confirmDialog({ title, body, yes }) {
  const old = document.getElementById('confirm');
  if (old) old.remove();
  return new Promise((resolve) => {
    const no = h('button', { type: 'button', 'data-testid': 'confirm-no', value: 'no' }, 'Keep');
    const ok = h('button', { type: 'button', class: 'danger', 'data-testid': 'confirm-yes', value: 'yes' }, yes || 'Confirm');
    const dlg = h('dialog', { id: 'confirm', class: 'confirm', 'aria-labelledby': 'confirm-h', 'aria-describedby': 'confirm-body' },
      h('h2', { id: 'confirm-h' }, title),
      body ? h('p', { id: 'confirm-body' }, body) : null,
      h('div', { class: 'actions' }, no, ok));
    let answer = false;
    no.addEventListener('click', () => dlg.close());
    ok.addEventListener('click', () => {
      answer = true;
      dlg.close();
    });
    dlg.addEventListener('close', () => {
      dlg.remove();
      resolve(answer);
    });
    document.body.append(dlg);
    dlg.showModal();
    no.focus();
  });
}

// filterForm builds a search form of labelled fields. fields: [{name,
// label, type: 'text'|'number'|'select', options, placeholder}]. Submit
// navigates to path with the non-empty values as the query (a new first
// page).
export function filterForm(ctx, { path, label, fields, values }) {
  const controls = fields.map((f) => {
    const id = 'f-' + f.name;
    let input;
    if (f.type === 'select') {
      input = h('select', { id, name: f.name },
        f.options.map(([v, text]) => h('option', { value: v, selected: (values.get(f.name) || '') === v }, text)));
    } else {
      input = h('input', {
        id, name: f.name, type: f.type || 'text', value: values.get(f.name) || '',
        placeholder: f.placeholder, min: f.type === 'number' ? '1' : null, inputmode: f.type === 'number' ? 'numeric' : null,
        autocomplete: 'off', spellcheck: 'false',
      });
    }
    return h('div', { class: 'field' }, h('label', { for: id }, f.label), input);
  });
  const form = h('form', { class: 'filters', role: 'search', 'aria-label': label, action: path, method: 'get' },
    controls,
    h('div', { class: 'field buttons' },
      h('button', { type: 'submit', class: 'primary' }, 'Apply'),
      h('a', { href: path, class: 'button' }, 'Clear')));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const data = {};
    for (const f of fields) data[f.name] = form.elements[f.name].value.trim();
    ctx.navigate(path + qs(data));
  });
  return form;
}

// pager links to the newest page and to the next (older) one, keeping
// the filters in query.
export function pager(path, query, next, shown) {
  const first = new URLSearchParams(query);
  first.delete('after');
  const links = [];
  if (query.get('after')) {
    const s = first.toString();
    links.push(h('a', { href: path + (s ? '?' + s : ''), class: 'button', 'data-key': 'page-first' }, '« Newest'));
  }
  if (next) {
    const n = new URLSearchParams(query);
    n.set('after', next);
    links.push(h('a', { href: path + '?' + n.toString(), class: 'button', rel: 'next', 'data-key': 'page-next' }, 'Older »'));
  }
  return h('nav', { class: 'pager', 'aria-label': 'Pages' },
    h('span', { class: 'muted' }, shown + (shown === 1 ? ' row' : ' rows') + (query.get('after') ? ' (older page)' : '')),
    links);
}

// notFound is the page of an id the API does not know.
export function notFound(what, detail) {
  return h('section', { class: 'notfound' },
    h('h1', {}, what + ' not found'),
    detail ? h('p', {}, detail) : null,
    h('p', {}, h('a', { href: '/' }, 'Back to the overview')));
}

// link is an in-app link.
export function link(href, text) {
  return h('a', { href }, text);
}

// taskLabel names a task of a run: "each[3]" or the step.
export function stepLabel(t) {
  if (!t.step) return '';
  return t.item !== undefined && t.item !== null ? t.step + '[' + t.item + ']' : t.step;
}
