// Tasks: filters by state, queue, key, kind and run; one page at a time
// from the API (its cursor), newest first; "Why?" shows what a waiting
// task waits for.
import { api } from '../api.js';
import { h, fmtAgo, qs, region } from '../dom.js';
import { TASK_STATES, badge, filterForm, pager, stepLabel, table, terminal } from '../widgets.js';

const FILTERS = ['state', 'queue', 'concurrency_key', 'kind', 'run_id', 'limit', 'after'];

export default {
  title: () => 'Tasks',
  mount(root, ctx) {
    const q = ctx.query;
    const expanded = new Set(); // task ids whose explain is shown
    const explains = new Map(); // id → explain text
    const list = h('div', {});
    root.append(
      h('h1', {}, 'Tasks'),
      filterForm(ctx, {
        path: '/tasks',
        label: 'Filter tasks',
        values: q,
        fields: [
          { name: 'state', label: 'State', type: 'select', options: [['', 'Any state'], ...TASK_STATES.map((s) => [s, s])] },
          { name: 'queue', label: 'Queue', placeholder: 'any' },
          { name: 'concurrency_key', label: 'Concurrency key', placeholder: 'any' },
          { name: 'kind', label: 'Kind', placeholder: 'any' },
          { name: 'run_id', label: 'Run', type: 'number', placeholder: 'any' },
          { name: 'limit', label: 'Per page', type: 'select', options: [['', '50'], ['25', '25'], ['100', '100'], ['200', '200']] },
        ],
      }),
      list);
    const r = region(list);
    let lastPage = null;
    const paint = () => {
      if (lastPage) r({ page: lastPage, e: [...expanded].map((id) => [id, explains.get(id)]) }, () => render(lastPage));
    };

    const render = (page) => {
      const rows = [];
      for (const t of page.tasks) {
        const open = expanded.has(t.id);
        const why = terminal(t.state) ? null : h('button', {
          type: 'button', class: 'small', 'aria-expanded': String(open), 'aria-controls': 'why-' + t.id, 'data-key': 'why-' + t.id,
          onclick: () => {
            if (expanded.has(t.id)) expanded.delete(t.id);
            else expanded.add(t.id);
            paint();
            ctx.refresh();
          },
        }, open ? 'Hide' : 'Why?');
        rows.push(h('tr', { 'data-task': t.id },
          h('th', { scope: 'row' }, h('a', { href: '/tasks/' + t.id }, '#' + t.id)),
          h('td', {}, t.kind),
          h('td', {}, h('a', { href: '/tasks' + qs({ queue: t.queue }) }, t.queue)),
          h('td', {}, t.concurrency_key || h('span', { class: 'muted' }, '—')),
          h('td', {}, badge(t.state)),
          h('td', { class: 'n' }, t.attempt + ' / ' + t.max_attempts),
          h('td', { class: 'n' }, String(t.priority)),
          h('td', {}, t.run_id ? [h('a', { href: '/runs/' + t.run_id }, 'run ' + t.run_id), ' ', h('span', { class: 'muted' }, stepLabel(t))] : ''),
          h('td', { title: t.created_at }, fmtAgo(t.created_at)),
          h('td', {}, why)));
        if (open) {
          rows.push(h('tr', { class: 'explain-row', id: 'why-' + t.id },
            h('td', { colspan: 10 }, h('span', { class: 'explain' }, explains.get(t.id) || 'Asking the server…'))));
        }
      }
      return [
        table('Tasks, newest first', ['Task', 'Kind', 'Queue', 'Key', 'State', 'Attempt', 'Priority', 'Run', 'Created', 'Waiting for'], rows,
          'No tasks match these filters.'),
        pager('/tasks', q, page.next, page.tasks.length),
      ];
    };

    return {
      async refresh() {
        const params = {};
        for (const k of FILTERS) params[k] = q.get(k);
        if (!params.limit) params.limit = '50';
        const page = await api('/v1/tasks' + qs(params));
        const visible = new Set(page.tasks.filter((t) => !terminal(t.state)).map((t) => t.id));
        await Promise.all([...expanded].filter((id) => visible.has(id)).map(async (id) => {
          try {
            const t = await api('/v1/tasks/' + id);
            explains.set(id, t.explain || 'Not waiting: ' + t.state);
          } catch (e) {
            explains.set(id, 'Could not explain: ' + e.message);
          }
        }));
        if (!ctx.alive()) return;
        lastPage = page;
        paint();
      },
    };
  },
};
