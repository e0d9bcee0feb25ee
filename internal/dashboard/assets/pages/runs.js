// Runs: filters by workflow and state, one page at a time from the API,
// newest first.
import { api } from '../api.js';
import { h, fmtAgo, fmtTime, qs, region } from '../dom.js';
import { RUN_STATES, badge, filterForm, pager, table } from '../widgets.js';

const FILTERS = ['workflow', 'state', 'limit', 'after'];

export default {
  title: () => 'Runs',
  mount(root, ctx) {
    const q = ctx.query;
    const list = h('div', {});
    root.append(
      h('h1', {}, 'Runs'),
      filterForm(ctx, {
        path: '/runs',
        label: 'Filter runs',
        values: q,
        fields: [
          { name: 'workflow', label: 'Workflow', placeholder: 'any' },
          { name: 'state', label: 'State', type: 'select', options: [['', 'Any state'], ...RUN_STATES.map((s) => [s, s])] },
          { name: 'limit', label: 'Per page', type: 'select', options: [['', '50'], ['25', '25'], ['100', '100'], ['200', '200']] },
        ],
      }),
      list);
    const r = region(list);
    return {
      async refresh() {
        const params = {};
        for (const k of FILTERS) params[k] = q.get(k);
        if (!params.limit) params.limit = '50';
        const page = await api('/v1/runs' + qs(params));
        if (!ctx.alive()) return;
        r({ page, t: Math.floor(Date.now() / 5000) }, () => [
          table('Runs, newest first', ['Run', 'Workflow', 'State', 'Key', 'Created', 'Started', 'Finished', 'Waiting for'], page.runs.map((run) => [
            h('a', { href: '/runs/' + run.id }, '#' + run.id),
            [h('a', { href: '/workflows/' + encodeURIComponent(run.workflow) + qs({ version: run.version }) }, run.workflow), h('span', { class: 'muted' }, ' v' + run.version)],
            badge(run.state),
            run.concurrency_key || '',
            h('span', { title: fmtTime(run.created_at) }, fmtAgo(run.created_at)),
            fmtTime(run.started_at),
            fmtTime(run.finished_at),
            run.explain ? h('span', { class: 'small' }, run.explain) : '',
          ]), 'No runs match these filters.'),
          pager('/runs', q, page.next, page.runs.length),
        ]);
      },
    };
  },
};
