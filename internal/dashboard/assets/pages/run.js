// A run: its step graph (each step's state, an arrow from each step it
// needs, and each fan-out's window fill), a timeline of every attempt of
// its tasks, what it waits for, and pause, resume, cancel and retry.
import { api, ApiError } from '../api.js';
import { h, fmtDur, fmtNum, fmtTime, qs, region } from '../dom.js';
import { actionButton, badge, dl, jsonBlock, segments, stepLabel, table, terminal } from '../widgets.js';

const LIST_LIMIT = 200; // tasks of the run read per refresh
const TIMELINE_ROWS = 100; // tasks drawn on the timeline
const DETAILS_PER_REFRESH = 20; // task reads (with attempts) per refresh

// levels places each step in a column: with `needs`, one past the deepest
// step it needs; without, in the order listed (one after another).
export function levels(runSteps, def) {
  const defs = new Map(((def && def.steps) || []).map((s) => [s.name, s]));
  const dag = [...defs.values()].some((s) => s.needs && s.needs.length);
  const level = new Map();
  const depth = (name, seen = new Set()) => {
    if (level.has(name)) return level.get(name);
    if (seen.has(name)) return 0;
    seen.add(name);
    const needs = (defs.get(name) && defs.get(name).needs) || [];
    const d = needs.length ? 1 + Math.max(...needs.map((n) => depth(n, seen))) : 0;
    level.set(name, d);
    return d;
  };
  const cols = [];
  runSteps.forEach((s, i) => {
    const d = dag ? depth(s.name) : i;
    (cols[d] = cols[d] || []).push(s);
  });
  return { cols: cols.filter(Boolean), dag, defs };
}

// fill says how far a fan-out step is: "each: 7/20 done, 3 running,
// window 3".
export function fill(s) {
  const c = s.counts || {};
  const done = (c.succeeded || 0) + (c.failed || 0) + (c.cancelled || 0);
  const running = c.running || 0;
  const queued = (c.queued || 0) + (c.ready || 0) + (c.reserved || 0) + (c.scheduled || 0);
  const parts = [s.name + ': ' + fmtNum(done) + '/' + fmtNum(s.items) + ' done', fmtNum(running) + ' running'];
  if (queued) parts.push(fmtNum(queued) + ' queued');
  if (c.waiting) parts.push(fmtNum(c.waiting) + ' waiting');
  if (c.paused) parts.push(fmtNum(c.paused) + ' paused');
  parts.push(s.window ? 'window ' + s.window : 'no window');
  return {
    text: parts.join(', '),
    bar: segments([
      { n: c.succeeded || 0, cls: 'state-succeeded', label: 'succeeded' },
      { n: (c.failed || 0) + (c.cancelled || 0), cls: 'state-failed', label: 'failed or cancelled' },
      { n: running, cls: 'state-running', label: 'running' },
      { n: queued, cls: 'state-queued', label: 'queued' },
      { n: c.paused || 0, cls: 'state-paused', label: 'paused' },
    ], s.items || 0),
  };
}

function stepNode(run, s, info, prev, dag) {
  const d = info || {};
  let deps;
  if (d.needs && d.needs.length) deps = 'needs ' + d.needs.join(', ');
  else if (!dag && prev) deps = 'after ' + prev;
  else deps = 'first';
  const fan = s.items !== undefined && s.items !== null ? fill(s) : null;
  let tasks = null;
  if (fan) {
    tasks = h('a', { href: '/tasks' + qs({ run_id: run.id }) }, fmtNum(s.items) + ' item tasks');
  } else if (s.tasks && s.tasks.length) {
    tasks = s.tasks.map((id, i) => [i ? ', ' : '', h('a', { href: '/tasks/' + id }, 'task #' + id)]);
  }
  return h('li', { class: 'step state-' + s.state, 'data-step': s.name },
    h('div', { class: 'step-head' }, h('strong', {}, s.name), ' ', badge(s.state)),
    h('div', { class: 'muted small' }, [d.kind || (d.workflow ? 'workflow ' + d.workflow : ''), deps].filter(Boolean).join(' · ')),
    fan ? h('div', { class: 'fill' }, fan.bar, h('p', { class: 'small', 'data-testid': 'window-fill' }, fan.text)) : null,
    tasks ? h('div', { class: 'small' }, tasks) : null,
    s.error ? h('p', { class: 'error small' }, s.error) : null);
}

// edgesOf lists the graph's edges, [from, to]: each step's needs; in a
// workflow without needs, each step after the one before it.
export function edgesOf(runSteps, dag, defs) {
  const names = new Set(runSteps.map((s) => s.name));
  const edges = [];
  runSteps.forEach((s, i) => {
    if (!dag) {
      if (i) edges.push([runSteps[i - 1].name, s.name]);
      return;
    }
    for (const n of (defs.get(s.name) && defs.get(s.name).needs) || []) {
      if (names.has(n)) edges.push([n, s.name]);
    }
  });
  return edges;
}

const SVG = 'http://www.w3.org/2000/svg';

// graph draws the steps column by column (a step's column comes after
// every step it needs) over an SVG layer that drawEdges fills with an
// arrow per dependency once the steps are laid out.
function graph(run, def) {
  const { cols, dag, defs } = levels(run.steps || [], def);
  if (!cols.length) return h('p', { class: 'muted' }, 'No steps yet.');
  let prev = null;
  const colEls = cols.map((col, i) => h('li', { class: 'col' },
    h('span', { class: 'visually-hidden' }, (dag ? 'Stage ' : 'Step ') + (i + 1) + ': '),
    h('ul', {}, col.map((s) => {
      const node = stepNode(run, s, defs.get(s.name), prev, dag);
      prev = s.name;
      return node;
    }))));
  const edges = edgesOf(run.steps || [], dag, defs);
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('class', 'edges');
  svg.setAttribute('aria-hidden', 'true');
  svg.dataset.edges = JSON.stringify(edges);
  return h('div', { class: 'graph-box' }, svg, h('ol', { class: 'graph', 'aria-label': 'Steps, in the order they run' }, colEls));
}

// drawEdges draws the arrows of the graph in box from the steps' places
// on the page: from the right side of a step to the left side of the
// step that needs it, or, where they are stacked (a phone), from the
// bottom of one to the top of the other. It redraws only what moved.
export function drawEdges(box) {
  const svg = box && box.querySelector('svg.edges');
  if (!svg || !box.isConnected) return;
  const origin = box.getBoundingClientRect();
  const at = (name) => {
    const el = box.querySelector('[data-step="' + CSS.escape(name) + '"]');
    if (!el) return null;
    const r = el.getBoundingClientRect();
    const x = r.left - origin.left + box.scrollLeft;
    const y = r.top - origin.top + box.scrollTop;
    return { l: x, r: x + r.width, t: y, b: y + r.height, cx: x + r.width / 2, cy: y + r.height / 2 };
  };
  const paths = [];
  for (const [from, to] of JSON.parse(svg.dataset.edges || '[]')) {
    const a = at(from);
    const b = at(to);
    if (!a || !b) continue;
    let d;
    if (b.l >= a.r - 1) {
      const k = Math.max(12, (b.l - a.r) / 2);
      d = `M${a.r},${a.cy} C${a.r + k},${a.cy} ${b.l - k},${b.cy} ${b.l},${b.cy}`;
    } else {
      const k = Math.max(10, (b.t - a.b) / 2);
      d = `M${a.cx},${a.b} C${a.cx},${a.b + k} ${b.cx},${b.t - k} ${b.cx},${b.t}`;
    }
    paths.push([from, to, d]);
  }
  const w = Math.ceil(box.scrollWidth);
  const ht = Math.ceil(box.scrollHeight);
  const key = JSON.stringify([w, ht, paths]);
  if (svg.dataset.drawn === key) return;
  svg.dataset.drawn = key;
  svg.setAttribute('width', String(w));
  svg.setAttribute('height', String(ht));
  svg.setAttribute('viewBox', `0 0 ${w} ${ht}`);
  const marker = document.createElementNS(SVG, 'marker');
  for (const [k, v] of Object.entries({ id: 'edge-arrow', viewBox: '0 0 8 8', refX: '7', refY: '4', markerWidth: '7', markerHeight: '7', orient: 'auto-start-reverse' })) marker.setAttribute(k, v);
  const tip = document.createElementNS(SVG, 'path');
  tip.setAttribute('d', 'M0,0 L8,4 L0,8 z');
  tip.setAttribute('class', 'edge-tip');
  marker.append(tip);
  const defs = document.createElementNS(SVG, 'defs');
  defs.append(marker);
  svg.replaceChildren(defs, ...paths.map(([from, to, d]) => {
    const p = document.createElementNS(SVG, 'path');
    p.setAttribute('d', d);
    p.setAttribute('class', 'edge');
    p.setAttribute('marker-end', 'url(#edge-arrow)');
    p.dataset.from = from;
    p.dataset.to = to;
    return p;
  }));
}

// timeline draws every attempt of the run's tasks on one time axis from
// the run's creation to its end (or now).
function timeline(run, tasks, details, total, now) {
  const t0 = new Date(run.created_at).getTime();
  const attemptsOf = (t) => {
    const d = details.get(t.id);
    if (d && d.attempts) return d.attempts;
    return t.started_at ? [{ attempt: t.attempt, state: t.state === 'running' ? 'running' : t.state, started_at: t.started_at, finished_at: t.finished_at }] : [];
  };
  let t1 = run.finished_at ? new Date(run.finished_at).getTime() : now;
  for (const t of tasks) {
    for (const a of attemptsOf(t)) t1 = Math.max(t1, a.finished_at ? new Date(a.finished_at).getTime() : now);
  }
  const span = Math.max(1, t1 - t0);
  const rows = tasks.map((t) => {
    const track = h('div', { class: 'track', 'aria-hidden': 'true' });
    const words = [];
    for (const a of attemptsOf(t)) {
      const s = new Date(a.started_at).getTime();
      const e = a.finished_at ? new Date(a.finished_at).getTime() : now;
      const seg = h('span', { class: 'seg state-' + a.state, title: 'attempt ' + a.attempt + ': ' + a.state + ', ' + fmtDur(e - s) + (a.error ? ' — ' + a.error : '') });
      seg.style.left = (((s - t0) / span) * 100).toFixed(2) + '%';
      seg.style.width = Math.max(0.6, ((e - s) / span) * 100).toFixed(2) + '%';
      track.append(seg);
      words.push('attempt ' + a.attempt + ' ' + a.state + ' at +' + fmtDur(s - t0) + ' for ' + fmtDur(e - s));
    }
    return [
      h('a', { href: '/tasks/' + t.id }, '#' + t.id),
      stepLabel(t),
      badge(t.state),
      h('div', {}, track, h('span', { class: 'visually-hidden' }, words.length ? words.join('; ') : 'not started')),
    ];
  });
  const note = total > tasks.length
    ? h('p', { class: 'muted small' }, 'Showing ' + tasks.length + ' of ' + (total >= LIST_LIMIT ? 'at least ' : '') + fmtNum(total) + ' tasks; ',
      h('a', { href: '/tasks' + qs({ run_id: run.id }) }, 'all of the run’s tasks'), '.')
    : null;
  return [
    h('p', { class: 'axis muted small' }, h('span', {}, fmtTime(run.created_at)), h('span', {}, '+' + fmtDur(span))),
    table('Attempts of the run’s tasks', ['Task', 'Step', 'State', 'Attempts over time'], rows, 'No tasks yet.'),
    note,
  ];
}

export default {
  title: (p) => 'Run ' + p[0],
  noun: 'Run',
  notFoundOn400: true,
  mount(root, ctx) {
    const id = ctx.params[0];
    const head = h('div', {});
    const why = h('div', {});
    const steps = h('div', {});
    const info = h('div', {});
    const times = h('div', {});
    root.append(head, why,
      h('section', { 'aria-labelledby': 'h-graph' }, h('h2', { id: 'h-graph' }, 'Steps'), steps),
      h('section', { 'aria-labelledby': 'h-timeline' }, h('h2', { id: 'h-timeline' }, 'Timeline'), times),
      h('section', { 'aria-labelledby': 'h-details' }, h('h2', { id: 'h-details' }, 'Details'), info));
    const headR = region(head);
    const whyR = region(why);
    const stepsR = region(steps);
    const infoR = region(info);
    const timesR = region(times);
    // The arrows follow the steps when the page's width changes.
    const resized = new ResizeObserver(() => {
      if (!ctx.alive()) resized.disconnect();
      else drawEdges(steps.querySelector('.graph-box'));
    });
    resized.observe(steps);
    let def = null;
    let defKey = '';
    const details = new Map(); // task id → task with attempts
    const seen = new Map(); // task id → what the list said when details were read

    return {
      async refresh() {
        if (!/^[0-9]+$/.test(id)) throw new ApiError(404, 'not_found', 'No run with id ' + id + '.');
        const run = await api('/v1/runs/' + id);
        const key = run.workflow + '@' + run.version;
        if (key !== defKey) {
          try {
            def = (await api('/v1/workflows/' + encodeURIComponent(run.workflow) + qs({ version: run.version }))).definition;
          } catch (e) {
            if (e instanceof ApiError && e.status === 401) throw e;
            def = null;
          }
          defKey = key;
        }
        const page = await api('/v1/tasks' + qs({ run_id: run.id, limit: LIST_LIMIT }));
        const tasks = page.tasks.slice().sort((a, b) => a.id - b.id).slice(0, TIMELINE_ROWS);
        const sig = (t) => [t.state, t.attempt, t.started_at, t.finished_at].join('|');
        const stale = tasks.filter((t) => t.attempt > 0 && seen.get(t.id) !== sig(t)).slice(0, DETAILS_PER_REFRESH);
        await Promise.all(stale.map(async (t) => {
          try {
            details.set(t.id, await api('/v1/tasks/' + t.id));
            seen.set(t.id, sig(t));
          } catch (e) {
            if (e instanceof ApiError && e.status === 401) throw e;
          }
        }));
        if (!ctx.alive()) return;
        const now = Date.now();

        headR({ id: run.id, s: run.state, w: run.workflow, v: run.version, r: run.retry || 0, p: run.parent_run || 0 }, () => {
          const acts = [];
          const path = '/v1/runs/' + run.id;
          if (run.state === 'running' || run.state === 'queued') {
            acts.push(actionButton(ctx, { label: 'Pause run', key: 'run-pause', run: () => api(path + '/pause', { method: 'POST' }) }));
          }
          if (run.state === 'paused') {
            acts.push(actionButton(ctx, { label: 'Resume run', key: 'run-resume', run: () => api(path + '/resume', { method: 'POST' }) }));
          }
          // A failed or cancelled run runs again from where it failed; a
          // child run is retried by its parent's retry (the server says
          // so), so it has no button of its own.
          if ((run.state === 'failed' || run.state === 'cancelled') && !run.parent_run) {
            acts.push(actionButton(ctx, {
              label: 'Retry run', key: 'run-retry', run: () => api(path + '/retry', { method: 'POST' }),
              title: 'Run again what did not succeed; steps and items that succeeded keep their outputs',
            }));
          }
          if (!terminal(run.state)) {
            acts.push(actionButton(ctx, {
              label: 'Cancel run', key: 'run-cancel', danger: true, run: () => api(path + '/cancel', { method: 'POST' }),
              confirm: {
                title: 'Cancel run #' + run.id + '?',
                body: 'No further step of it starts, and its unfinished tasks are cancelled. A cancelled run cannot be resumed.',
                yes: 'Cancel run',
              },
            }));
          }
          return h('div', { class: 'page-head' },
            h('h1', {}, 'Run #' + run.id, ' ',
              h('a', { href: '/workflows/' + encodeURIComponent(run.workflow) + qs({ version: run.version }) }, run.workflow + ' v' + run.version), ' ',
              h('span', { 'data-testid': 'run-state' }, badge(run.state)),
              run.retry ? [' ', h('span', { class: 'muted small', 'data-testid': 'run-retry' }, 'retry ' + run.retry)] : null),
            h('div', { class: 'actions' }, acts));
        });
        whyR(run.explain || '', (x) => (x ? h('p', { class: 'explain', 'data-testid': 'explain' }, h('strong', {}, terminal(run.state) ? 'Outcome: ' : 'Why: '), x) : null));
        stepsR({ s: run.steps, d: defKey, def: !!def }, () => graph(run, def));
        drawEdges(steps.querySelector('.graph-box'));
        infoR({ run: { ...run, steps: null } }, () => [
          dl([
            ['Concurrency key', run.concurrency_key],
            ['Created', fmtTime(run.created_at)],
            ['Started', fmtTime(run.started_at)],
            ['Finished', fmtTime(run.finished_at)],
            ['Idempotency key', run.idempotency_key],
            ['Tasks', h('a', { href: '/tasks' + qs({ run_id: run.id }) }, 'list the run’s tasks')],
          ]),
          h('div', { class: 'json-grid' },
            jsonBlock('Input', run.input, true),
            jsonBlock('Output', run.output),
            run.error ? h('section', { class: 'json' }, h('h3', {}, 'Error'), h('pre', { class: 'error', tabindex: '0' }, run.error)) : null),
        ]);
        const live = !terminal(run.state);
        timesR({ tasks, d: tasks.map((t) => seen.get(t.id)), n: page.tasks.length, t: live ? Math.floor(now / 1000) : 0 },
          () => timeline(run, tasks, details, page.tasks.length + (page.next ? 1 : 0), now));
      },
    };
  },
};
