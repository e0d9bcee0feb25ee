// Overview: the environment limit and admission headroom, the active
// runs and their progress, the latest failures, every queue's slots and
// counts, and the workers' capacity. The lists of runs and tasks it reads
// are bounded (a few of each) and the workers are read every 10 seconds,
// so it stays cheap however many tasks, runs and workers there are, in
// as many tabs as are open (docs/dashboard.md has the measurement).
import { api } from '../api.js';
import { h, fmtAgo, fmtNum, qs, region } from '../dom.js';
import { badge, bar, stepLabel, table, terminal } from '../widgets.js';
import { queuesTable, workersTable } from './common.js';

const ACTIVE_RUNS = 5; // running runs shown, newest first
const FAILURES = 5; // failed tasks shown, newest first
// The list of workers is the overview's one big read (every worker, with
// its tasks: 300 KiB for 1,000 workers) and it changes at the workers'
// heartbeats: it is read every WORKERS_EVERY ms, not at each refresh, and
// WORKERS_SHOWN of them are drawn (the Workers page has them all).
const WORKERS_EVERY = 10000;
const WORKERS_SHOWN = 20;

function card(title, main, detail, meter) {
  return h('div', { class: 'card' }, h('h3', {}, title), h('p', { class: 'big' }, main), meter || null, detail ? h('p', { class: 'muted' }, detail) : null);
}

function envCards(env, queues, workers) {
  const sum = (state) => queues.reduce((n, q) => n + ((q.counts && q.counts[state]) || 0), 0);
  const slots = workers.reduce((n, w) => n + w.slots, 0);
  const free = workers.reduce((n, w) => n + w.free_slots, 0);
  const limit = env.max_running
    ? card('Environment limit', fmtNum(env.running) + ' / ' + fmtNum(env.max_running), 'tasks holding a slot across every queue', bar(env.running, env.max_running))
    : card('Environment limit', fmtNum(env.running) + ' / ∞', 'no environment limit (--max-running)');
  const headroom = env.max_active
    ? card('Admission headroom', fmtNum(Math.max(0, env.max_active - env.active)),
      fmtNum(env.active) + ' unfinished of a ceiling of ' + fmtNum(env.max_active) + '; triggers over it get 429', bar(env.active, env.max_active))
    : card('Admission headroom', 'no ceiling', fmtNum(env.active) + ' unfinished tasks (--max-active sets a ceiling)');
  return [
    limit,
    headroom,
    card('Waiting', fmtNum(sum('queued') + sum('scheduled') + sum('waiting')),
      fmtNum(sum('queued')) + ' queued · ' + fmtNum(sum('scheduled')) + ' scheduled · ' + fmtNum(sum('waiting')) + ' in a window · ' + fmtNum(sum('paused')) + ' paused'),
    card('Worker capacity', fmtNum(free) + ' free', fmtNum(slots) + ' slots on ' + fmtNum(workers.length) + (workers.length === 1 ? ' worker' : ' workers') + '; free as of their last heartbeats',
      bar(slots - free, slots)),
  ];
}

// windowActive counts a fan-out step's items let through its window and
// not finished (what the window holds); waiting and paused items do not
// count.
export function windowActive(c) {
  return ['queued', 'scheduled', 'ready', 'reserved', 'running', 'suspended'].reduce((n, st) => n + ((c && c[st]) || 0), 0);
}

// runProgress says how far a run is: steps done of its steps, and for
// each running fan-out step its items done and its window's fill
// ("each: 7/20 done · window 3/3").
export function runProgress(run) {
  const steps = run.steps || [];
  const done = steps.filter((s) => terminal(s.state)).length;
  const now = steps.filter((s) => s.state === 'running').map((s) => {
    if (s.items === undefined || s.items === null) return s.name;
    const c = s.counts || {};
    const itemsDone = (c.succeeded || 0) + (c.failed || 0) + (c.cancelled || 0);
    return s.name + ': ' + fmtNum(itemsDone) + '/' + fmtNum(s.items) + ' done · ' +
      (s.window ? 'window ' + fmtNum(windowActive(c)) + '/' + fmtNum(s.window) : fmtNum(windowActive(c)) + ' active, no window');
  });
  return { done, total: steps.length, now };
}

function runsTable(runs, now) {
  return table('Active runs, newest first', ['Run', 'Workflow', 'State', 'Steps done', 'Running now', 'Started'], runs.map((run) => {
    const p = runProgress(run);
    return h('tr', { 'data-run': run.id },
      h('th', { scope: 'row' }, h('a', { href: '/runs/' + run.id }, '#' + run.id)),
      h('td', {}, h('a', { href: '/runs/' + run.id }, run.workflow), h('span', { class: 'muted' }, ' v' + run.version)),
      h('td', {}, badge(run.state)),
      h('td', { 'data-testid': 'run-progress' }, h('span', { class: 'slots' }, bar(p.done, p.total), h('span', { class: 'num' }, p.done + '/' + p.total + ' steps'))),
      h('td', { class: 'wrap', 'data-testid': 'run-now' }, p.now.length ? p.now.join('; ') : h('span', { class: 'muted' }, '—')),
      h('td', { title: run.started_at || '' }, fmtAgo(run.started_at || run.created_at, now)));
  }), 'No run is running.');
}

function failuresTable(tasks, now) {
  return table('Latest failed tasks, newest first', ['Task', 'Kind', 'Queue', 'Run', 'Error', 'Finished'], tasks.map((t) => {
    const err = (t.error || '').split('\n')[0];
    return h('tr', { 'data-failed': t.id },
      h('th', { scope: 'row' }, h('a', { href: '/tasks/' + t.id }, '#' + t.id)),
      h('td', {}, t.kind),
      h('td', {}, t.queue),
      h('td', {}, t.run_id ? [h('a', { href: '/runs/' + t.run_id }, 'run ' + t.run_id), ' ', h('span', { class: 'muted' }, stepLabel(t))] : h('span', { class: 'muted' }, '—')),
      h('td', { class: 'error-cell', title: t.error || '' }, err.length > 80 ? err.slice(0, 79) + '…' : err),
      h('td', { title: t.finished_at || '' }, fmtAgo(t.finished_at, now)));
  }), 'No failed task.');
}

export default {
  title: () => 'Overview',
  // Every 2 s rather than every second: the page most often left open,
  // in several tabs, reads the most (docs/dashboard.md, "Live updates").
  interval: 2000,
  mount(root, ctx) {
    const env = h('div', { class: 'cards', 'aria-label': 'Environment', role: 'group' });
    const runs = h('div', {});
    const failures = h('div', {});
    const queues = h('div', {});
    const workers = h('div', {});
    root.append(
      h('h1', {}, 'Overview'),
      env,
      h('div', { class: 'split' },
        h('section', { 'aria-labelledby': 'h-runs' },
          h('h2', { id: 'h-runs' }, 'Active runs ', h('a', { class: 'small', href: '/runs' + qs({ state: 'running' }) }, 'all running')), runs),
        h('section', { 'aria-labelledby': 'h-failures' },
          h('h2', { id: 'h-failures' }, 'Latest failures ', h('a', { class: 'small', href: '/tasks' + qs({ state: 'failed' }) }, 'all failed')), failures)),
      h('section', { 'aria-labelledby': 'h-queues' }, h('h2', { id: 'h-queues' }, 'Queues'), queues),
      h('section', { 'aria-labelledby': 'h-workers' }, h('h2', { id: 'h-workers' }, 'Workers'), workers));
    const envR = region(env);
    const runsR = region(runs);
    const failuresR = region(failures);
    const queuesR = region(queues);
    const workersR = region(workers);
    let w = null;
    let wAt = 0;
    return {
      async refresh() {
        const fresh = !w || Date.now() - wAt >= WORKERS_EVERY;
        const [e, q, ws, r, f] = await Promise.all([
          api('/v1/environment'), api('/v1/queues'), fresh ? api('/v1/workers') : null,
          api('/v1/runs' + qs({ state: 'running', limit: ACTIVE_RUNS })),
          api('/v1/tasks' + qs({ state: 'failed', limit: FAILURES })),
        ]);
        // A listed run lacks its steps: read each (a handful).
        const active = await Promise.all(r.runs.map((run) => api('/v1/runs/' + run.id).catch((err) => {
          if (err.status === 404) return null; // gone meanwhile
          throw err;
        })));
        if (!ctx.alive()) return;
        if (ws) {
          w = ws;
          wAt = Date.now();
        }
        const now = Date.now();
        const t = Math.floor(now / 1000);
        envR({ e, q: q.queues, w: w.workers }, (d) => envCards(d.e, d.q, d.w));
        runsR({ r: active.filter(Boolean).map((x) => ({ ...x, input: null, output: null, steps: (x.steps || []).map((s) => ({ ...s, output: null, tasks: null })) })), t },
          (d) => runsTable(d.r, now));
        failuresR({ f: f.tasks.map((x) => [x.id, x.state, x.error, x.finished_at, x.run_id, x.step, x.item]), t }, () => failuresTable(f.tasks, now));
        queuesR(q.queues, (d) => queuesTable(ctx, d));
        workersR({ w: w.workers.slice(0, WORKERS_SHOWN), n: w.workers.length, t }, (d) => [
          workersTable(d.w, now),
          d.n > d.w.length ? h('p', { class: 'muted small', 'data-testid': 'workers-more' }, 'Showing ' + d.w.length + ' of ' + fmtNum(d.n) + ' workers; ',
            h('a', { href: '/workers' }, 'all workers'), '.') : null,
        ]);
      },
    };
  },
};
