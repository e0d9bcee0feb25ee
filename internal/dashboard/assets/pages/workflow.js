// A workflow: its versions, the steps of the chosen one (kinds, needs,
// fan-outs and their windows) and the definition itself; pause and resume
// its new runs.
import { api } from '../api.js';
import { h, fmtTime, pretty, qs, region } from '../dom.js';
import { actionButton, badge, table } from '../widgets.js';

// stepsTable lists a definition's steps.
export function stepsTable(def) {
  const steps = (def && def.steps) || [];
  return table('Steps', ['Step', 'Kind', 'Needs', 'Fan-out', 'Queue', 'Key', 'If'], steps.map((s, i) => [
    h('strong', {}, s.name),
    s.kind || (s.workflow ? 'workflow ' + s.workflow : ''),
    s.needs && s.needs.length ? s.needs.join(', ') : h('span', { class: 'muted' }, i ? 'after ' + steps[i - 1].name : 'first'),
    s.with_items ? [h('code', {}, s.with_items), s.concurrency ? ', window ' + s.concurrency : ', no window'] : '',
    s.queue ? h('code', {}, s.queue) : '',
    s.concurrency_key ? h('code', {}, s.concurrency_key) : '',
    s.if ? h('code', {}, s.if) : '',
  ]));
}

// runConcurrency says the workflow's limit on its own runs, its key and
// what a new run of a full key does (its strategy), or nothing.
function runConcurrency(def) {
  const c = def && def.concurrency;
  if (!c) return null;
  const strategy = {
    queue: 'a new run waits queued',
    cancel_in_progress: 'a new run cancels the oldest and takes its place',
    cancel_newest: 'a new run is refused',
  }[c.strategy || 'queue'] || '';
  return h('p', { 'data-testid': 'run-concurrency' }, 'Run concurrency: at most ' + c.limit + ' active runs',
    c.key ? [' per ', h('code', {}, c.key)] : '',
    ', strategy ', h('code', {}, c.strategy || 'queue'), strategy ? ' (' + strategy + ')' : '', '.');
}

export default {
  title: (p) => 'Workflow ' + p[0],
  noun: 'Workflow',
  mount(root, ctx) {
    const name = ctx.params[0];
    const want = Number(ctx.query.get('version')) || 0;
    const head = h('div', {});
    const body = h('div', {});
    root.append(head, body);
    const headR = region(head);
    const bodyR = region(body);
    const versions = new Map(); // version → WorkflowInfo (immutable)
    const path = '/v1/workflows/' + encodeURIComponent(name);
    return {
      async refresh() {
        const latest = await api(path);
        versions.set(latest.version, latest);
        const v = want && want <= latest.version ? want : latest.version;
        if (!versions.has(v)) versions.set(v, await api(path + qs({ version: v })));
        if (!ctx.alive()) return;
        const cur = versions.get(v);
        headR({ n: latest.name, v: latest.version, p: latest.paused, sel: v }, () => {
          const act = latest.paused
            ? actionButton(ctx, { label: 'Resume workflow', key: 'wf-resume', run: () => api(path + '/resume', { method: 'POST' }) })
            : actionButton(ctx, { label: 'Pause workflow', key: 'wf-pause', run: () => api(path + '/pause', { method: 'POST' }), title: 'New runs wait queued until resumed' });
          const vlinks = [];
          for (let i = latest.version; i >= 1 && vlinks.length < 50; i--) {
            vlinks.push(h('li', {}, i === v
              ? h('a', { href: '/workflows/' + encodeURIComponent(name) + '?version=' + i, 'aria-current': 'page' }, 'v' + i)
              : h('a', { href: '/workflows/' + encodeURIComponent(name) + '?version=' + i }, 'v' + i)));
          }
          return [
            h('div', { class: 'page-head' },
              h('h1', {}, 'Workflow ', latest.name, ' ', latest.paused ? badge('paused') : null),
              h('div', { class: 'actions' }, h('a', { class: 'button', href: '/runs' + qs({ workflow: latest.name }) }, 'Runs'), act)),
            h('nav', { class: 'versions', 'aria-label': 'Versions' }, h('span', { class: 'muted' }, 'Versions: '), h('ul', {}, vlinks)),
          ];
        });
        bodyR({ v: cur.version, c: cur.created_at }, () => [
          h('p', { class: 'muted' }, 'Version ' + cur.version + ', uploaded ' + fmtTime(cur.created_at) + '.'),
          runConcurrency(cur.definition),
          h('section', { 'aria-labelledby': 'h-steps' }, h('h2', { id: 'h-steps' }, 'Steps'), stepsTable(cur.definition)),
          h('section', { 'aria-labelledby': 'h-def' }, h('h2', { id: 'h-def' }, 'Definition'),
            h('pre', { class: 'definition', tabindex: '0' }, h('code', {}, pretty(cur.definition)))),
        ]);
      },
    };
  },
};
