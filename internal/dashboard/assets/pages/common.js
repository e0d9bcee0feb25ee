// Tables shared by several pages: queues and workers.
import { h, fmtAgo, fmtNum, qs } from '../dom.js';
import { api } from '../api.js';
import { actionButton, badge, bar, table } from '../widgets.js';

// queueRunning says a queue's slot use: "2 / 2" with a bar for a limited
// queue without keys, "5 running · 2 per key" for a keyed one.
export function queueRunning(q) {
  const limit = q.concurrency_limit;
  if (limit === null || limit === undefined) {
    return h('span', { class: 'slots' }, h('span', { class: 'num' }, fmtNum(q.running) + ' / ∞'), h('span', { class: 'muted' }, ' no limit'));
  }
  if (q.keyed) {
    return h('span', { class: 'slots' }, h('span', { class: 'num' }, fmtNum(q.running) + ' running'),
      h('span', { class: 'muted' }, ' · limit ' + fmtNum(limit) + ' per key'));
  }
  return h('span', { class: 'slots' }, bar(q.running, limit), h('span', { class: 'num', 'data-testid': 'queue-running' }, fmtNum(q.running) + ' / ' + fmtNum(limit)));
}

function count(q, state) {
  const n = (q.counts && q.counts[state]) || 0;
  return n ? fmtNum(n) : h('span', { class: 'muted' }, '0');
}

function tasksLink(q, state, content) {
  return h('a', { href: '/tasks' + qs({ queue: q.name, state }) }, content);
}

// shortDur drops the zero units of a Go duration: "1m0s" → "1m", "1h0m0s" → "1h".
function shortDur(d) {
  return String(d).replace(/m0s$/, 'm').replace(/h0m$/, 'h');
}

// queueTags names a queue's settings beyond its limits: handover, a
// strategy other than waiting, a rate limit, a debounce, key weights,
// slots lent to waiting parents.
function queueTags(q) {
  const tags = [];
  if (q.handover) tags.push(h('span', { class: 'tag', title: 'handover on' }, 'handover'));
  if (q.strategy && q.strategy !== 'queue') tags.push(h('span', { class: 'tag', title: 'what a trigger does when its sub-queue is full' }, q.strategy));
  if (q.rate_limit) {
    const r = q.rate_limit;
    // A burst is shown when set (left out, it is the limit: the
    // period's allowance may start at once).
    const burst = r.burst ? ' burst ' + r.burst : '';
    tags.push(h('span', { class: 'tag', title: r.burst ? 'rate limit: at most ' + r.burst + ' at once, the rest spread evenly' : 'rate limit' },
      r.limit + '/' + shortDur(r.period) + burst + (r.per_key ? ' per key' : '')));
  }
  if (q.debounce) {
    // Triggers closer than the period apart merge into one pending task;
    // max_wait ("0s" or absent: no cap) bounds how late it starts.
    const d = q.debounce;
    const period = shortDur(d.period);
    const maxWait = d.max_wait && d.max_wait !== '0s' ? shortDur(d.max_wait) : '';
    const parts = [maxWait ? 'max wait ' + maxWait : '', d.per_key ? 'per key' : ''].filter(Boolean);
    tags.push(h('span', {
      class: 'tag', 'data-testid': 'queue-debounce',
      title: 'debounce: triggers of a kind' + (d.per_key ? ' and key' : '') + ' closer than ' + period + ' apart merge into one task, started ' +
        period + ' after the last' + (maxWait ? ', at the latest ' + maxWait + ' after the first' : ''),
    }, 'debounce ' + period + (parts.length ? ' (' + parts.join(', ') + ')' : '')));
  }
  // Key weights (fair queueing): named when one or two, counted beyond,
  // every one (up to 20) in the title.
  const weights = Object.entries(q.key_weights || {}).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([k, w]) => k + ' ×' + w);
  if (weights.length) {
    const shown = weights.slice(0, 20).join(', ') + (weights.length > 20 ? ', …' : '');
    tags.push(h('span', { class: 'tag', 'data-testid': 'queue-weights', title: 'key weights in fair queueing (every other key: ×1): ' + shown },
      weights.length <= 2 ? weights.join(', ') : weights.length + ' weighed keys'));
  }
  if (q.lent) tags.push(h('span', { class: 'tag', title: 'slots lent to parents waiting for a child' }, q.lent + ' lent'));
  return tags;
}

// queuesTable lists queues with their slots, counts, backlog and a pause
// or resume button.
export function queuesTable(ctx, queues) {
  const rows = queues.map((q) => {
    const backlog = q.max_backlog === null || q.max_backlog === undefined
      ? h('span', {}, fmtNum(q.active), h('span', { class: 'muted' }, ' · no ceiling'))
      : h('span', { class: 'slots' }, bar(q.active, q.max_backlog), h('span', { class: 'num' }, fmtNum(q.active) + ' / ' + fmtNum(q.max_backlog)));
    const action = q.paused
      ? actionButton(ctx, { label: 'Resume', key: 'q-resume-' + q.name, run: () => api('/v1/queues/' + encodeURIComponent(q.name) + '/resume', { method: 'POST' }) })
      : actionButton(ctx, { label: 'Pause', key: 'q-pause-' + q.name, run: () => api('/v1/queues/' + encodeURIComponent(q.name) + '/pause', { method: 'POST' }) });
    action.setAttribute('aria-label', (q.paused ? 'Resume' : 'Pause') + ' queue ' + q.name);
    return h('tr', { 'data-queue': q.name },
      h('th', { scope: 'row' }, h('a', { href: '/tasks' + qs({ queue: q.name }) }, q.name), queueTags(q)),
      h('td', {}, queueRunning(q)),
      h('td', { class: 'n' }, tasksLink(q, 'queued', count(q, 'queued'))),
      h('td', { class: 'n' }, tasksLink(q, 'ready', count(q, 'ready'))),
      h('td', { class: 'n' }, tasksLink(q, 'running', count(q, 'running'))),
      h('td', { class: 'n' }, tasksLink(q, 'scheduled', count(q, 'scheduled'))),
      h('td', { class: 'n' }, count(q, 'waiting')),
      h('td', { class: 'n' }, count(q, 'paused')),
      h('td', {}, backlog),
      h('td', { 'data-testid': 'queue-state' }, q.paused ? badge('paused') : h('span', { class: 'badge state-active' }, 'active')),
      h('td', {}, action));
  });
  return table('Queues', ['Queue', 'Running / limit', 'Queued', 'Ready', 'Running', 'Scheduled', 'Waiting', 'Paused', 'Backlog', 'State', 'Action'],
    rows, 'No queues yet: a queue appears when a task names it or PUT /v1/queues/{name} creates it.');
}

// workersTable lists workers with their capacity and last heartbeat.
// Running is the server's count now; free slots, memory and p99 are the
// worker's report at its last heartbeat, the column before them, so the
// two counts are not read as one moment's (WorkerInfo.free_slots).
export function workersTable(workers, now = Date.now()) {
  const rows = workers.map((w) => {
    const used = w.slots - w.free_slots;
    const mem = w.memory_used_ratio ? Math.round(w.memory_used_ratio * 100) + '%' : h('span', { class: 'muted' }, 'n/a');
    const tasks = (w.tasks || []).slice(0, 5).map((id, i) => [i ? ', ' : '', h('a', { href: '/tasks/' + id }, '#' + id)]);
    if ((w.tasks || []).length > 5) tasks.push(' …');
    return h('tr', { 'data-worker': w.id },
      h('th', { scope: 'row' }, w.name || w.id, w.name && w.name !== w.id ? h('div', { class: 'muted small' }, w.id) : null),
      h('td', {}, (w.kinds || []).join(', ')),
      h('td', { class: 'n' }, fmtNum(w.slots)),
      h('td', { class: 'n' }, fmtNum(w.running)),
      h('td', { title: w.last_heartbeat_at }, fmtAgo(w.last_heartbeat_at, now)),
      h('td', { title: 'as the worker reported at its last heartbeat, ' + fmtAgo(w.last_heartbeat_at, now) },
        h('span', { class: 'slots' }, bar(used, w.slots), h('span', { class: 'num' }, fmtNum(w.free_slots) + ' free'))),
      h('td', { class: 'n' }, mem),
      h('td', { class: 'n' }, w.p99_latency && w.p99_latency !== '0s' ? w.p99_latency : h('span', { class: 'muted' }, 'n/a')),
      h('td', { title: w.lease_expires_at }, fmtAgo(w.lease_expires_at, now)),
      h('td', {}, tasks.length ? tasks : h('span', { class: 'muted' }, 'none')));
  });
  return table('Workers', ['Worker', 'Kinds', 'Slots', 'Running now', 'Last heartbeat', 'Free slots at heartbeat', 'Memory at heartbeat', 'p99 at heartbeat', 'Lease', 'Tasks'],
    rows, 'No workers connected: start one with `sluice worker`.');
}

