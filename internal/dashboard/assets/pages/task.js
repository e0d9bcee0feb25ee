// A task: its state and why it waits, its settings, input, output and
// error, its attempts as a timeline, and cancel and retry.
import { api, ApiError } from '../api.js';
import { h, fmtDur, fmtTime, qs, region } from '../dom.js';
import { actionButton, badge, dl, jsonBlock, stepLabel, terminal } from '../widgets.js';

// workerName names a worker by its name where the task knows it (its
// current worker), else by its id.
function workerName(t, id) {
  return t.worker_name && t.worker_id === id ? t.worker_name + ' (' + id + ')' : id;
}

// attemptsTimeline draws each attempt on one time axis, from the task's
// creation to its end (or now).
export function attemptsTimeline(t, now = Date.now()) {
  const attempts = t.attempts || [];
  if (!attempts.length) {
    return h('p', { class: 'muted' }, 'No attempt yet.');
  }
  const t0 = new Date(t.created_at).getTime();
  const ends = attempts.map((a) => (a.finished_at ? new Date(a.finished_at).getTime() : now));
  const t1 = Math.max(t0 + 1, t.finished_at ? new Date(t.finished_at).getTime() : now, ...ends);
  const span = t1 - t0;
  const items = attempts.map((a, i) => {
    const start = new Date(a.started_at).getTime();
    const end = ends[i];
    const seg = h('span', { class: 'seg state-' + a.state });
    seg.style.left = (((start - t0) / span) * 100).toFixed(2) + '%';
    seg.style.width = Math.max(0.8, ((end - start) / span) * 100).toFixed(2) + '%';
    return h('li', { class: 'attempt' },
      h('div', { class: 'attempt-head' },
        h('strong', {}, 'Attempt ' + a.attempt), ' ', badge(a.state), ' ',
        h('span', { class: 'muted' }, 'started ' + fmtTime(a.started_at) + ', after ' + fmtDur(start - t0) + ' · ' +
          (a.finished_at ? 'took ' + fmtDur(end - start) : 'running for ' + fmtDur(end - start)) + (a.worker_id ? ' · worker ' + workerName(t, a.worker_id) : ''))),
      h('div', { class: 'track', 'aria-hidden': 'true' }, seg),
      a.error ? h('pre', { class: 'error small' }, a.error) : null);
  });
  return h('ol', { class: 'timeline', 'aria-label': 'Attempts' }, items);
}

// debounced says what a debounced task stands for: "3 triggers, at the
// latest Jan 2, 15:04:05" ('' for a task that is not debounced).
function debounced(t) {
  if (!t.debounce_triggers) return '';
  const n = t.debounce_triggers + (t.debounce_triggers === 1 ? ' trigger' : ' triggers');
  return h('span', { 'data-testid': 'task-debounced' }, n + (t.debounce_until ? ', at the latest ' + fmtTime(t.debounce_until) : ''));
}

export default {
  title: (p) => 'Task ' + p[0],
  noun: 'Task',
  notFoundOn400: true,
  mount(root, ctx) {
    const id = ctx.params[0];
    const head = h('div', {});
    const body = h('div', {});
    root.append(head, body);
    const headR = region(head);
    const bodyR = region(body);
    return {
      async refresh() {
        if (!/^[0-9]+$/.test(id)) throw new ApiError(404, 'not_found', 'No task with id ' + id + '.');
        const t = await api('/v1/tasks/' + id);
        if (!ctx.alive()) return;
        headR({ id: t.id, state: t.state, run: t.run_id, kind: t.kind }, () => {
          const actions = [];
          if (!terminal(t.state)) {
            actions.push(actionButton(ctx, {
              label: 'Cancel task', key: 'task-cancel', danger: true, run: () => api('/v1/tasks/' + t.id + '/cancel', { method: 'POST' }),
              confirm: {
                title: 'Cancel task #' + t.id + '?',
                body: t.state === 'running' ? 'Its running attempt is told to stop, and it is not tried again.' : 'It will not run.',
                yes: 'Cancel task',
              },
            }));
          }
          if ((t.state === 'failed' || t.state === 'cancelled') && !t.run_id) {
            actions.push(actionButton(ctx, { label: 'Retry task', key: 'task-retry', run: () => api('/v1/tasks/' + t.id + '/retry', { method: 'POST' }) }));
          }
          return h('div', { class: 'page-head' },
            h('h1', {}, 'Task #' + t.id, ' ', h('span', { class: 'muted' }, t.kind), ' ', h('span', { 'data-testid': 'task-state' }, badge(t.state))),
            h('div', { class: 'actions' }, actions));
        });
        const now = Date.now();
        bodyR({ t, s: terminal(t.state) ? 0 : Math.floor(now / 1000) }, () => [
          t.explain ? h('p', { class: 'explain', 'data-testid': 'explain' }, h('strong', {}, terminal(t.state) ? 'Outcome: ' : 'Why: '), t.explain) : null,
          h('section', { 'aria-labelledby': 'h-facts' }, h('h2', { id: 'h-facts', class: 'visually-hidden' }, 'Details'),
            dl([
              ['Queue', h('a', { href: '/tasks' + qs({ queue: t.queue }) }, t.queue)],
              ['Concurrency key', t.concurrency_key],
              ['Priority', String(t.priority)],
              ['Attempt', t.attempt + ' of ' + t.max_attempts],
              ['Timeout', t.timeout && t.timeout !== '0s' ? t.timeout : ''],
              ['Run at', fmtTime(t.run_at)],
              ['Debounced', debounced(t)],
              ['Dispatch deadline', fmtTime(t.dispatch_deadline_at)],
              ['Created', fmtTime(t.created_at)],
              ['Started', fmtTime(t.started_at)],
              ['Finished', fmtTime(t.finished_at)],
              ['Worker', t.worker_id ? (t.worker_name ? t.worker_name + ' (' + t.worker_id + ')' : t.worker_id) : ''],
              ['Lease expires', fmtTime(t.lease_expires_at)],
              ['Run', t.run_id ? h('a', { href: '/runs/' + t.run_id }, 'run ' + t.run_id + (t.step ? ' · ' + stepLabel(t) : '')) : ''],
              ['Handover after', t.after ? h('a', { href: '/tasks/' + t.after }, '#' + t.after) : ''],
              ['Paused from', t.paused_from],
              ['Idempotency key', t.idempotency_key],
              ['Cancel requested', t.cancel_requested ? 'yes' : ''],
            ])),
          h('section', { 'aria-labelledby': 'h-attempts' }, h('h2', { id: 'h-attempts' }, 'Attempts'), attemptsTimeline(t, now)),
          h('div', { class: 'json-grid' },
            jsonBlock('Input', t.input, true),
            jsonBlock('Output', t.output),
            t.error ? h('section', { class: 'json' }, h('h3', {}, 'Error'), h('pre', { class: 'error', tabindex: '0' }, t.error)) : null),
        ]);
      },
    };
  },
};
