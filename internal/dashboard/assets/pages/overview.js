// Overview: the environment limit and admission headroom, every queue's
// slots and counts, and the workers' capacity. It lists no tasks, so it
// stays fast however many there are.
import { api } from '../api.js';
import { h, fmtNum, region } from '../dom.js';
import { bar } from '../widgets.js';
import { queuesTable, workersTable } from './common.js';

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

export default {
  title: () => 'Overview',
  mount(root, ctx) {
    const env = h('div', { class: 'cards', 'aria-label': 'Environment', role: 'group' });
    const queues = h('div', {});
    const workers = h('div', {});
    root.append(
      h('h1', {}, 'Overview'),
      env,
      h('section', { 'aria-labelledby': 'h-queues' }, h('h2', { id: 'h-queues' }, 'Queues'), queues),
      h('section', { 'aria-labelledby': 'h-workers' }, h('h2', { id: 'h-workers' }, 'Workers'), workers));
    const envR = region(env);
    const queuesR = region(queues);
    const workersR = region(workers);
    return {
      async refresh() {
        const [e, q, w] = await Promise.all([api('/v1/environment'), api('/v1/queues'), api('/v1/workers')]);
        if (!ctx.alive()) return;
        envR({ e, q: q.queues, w: w.workers }, (d) => envCards(d.e, d.q, d.w));
        queuesR(q.queues, (d) => queuesTable(ctx, d));
        const now = Date.now();
        workersR({ w: w.workers, t: Math.floor(now / 1000) }, (d) => workersTable(d.w, now));
      },
    };
  },
};
