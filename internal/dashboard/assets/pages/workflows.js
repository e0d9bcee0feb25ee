// Workflows: every workflow's latest version, whether it is paused, and
// links to its definition and runs.
import { api } from '../api.js';
import { h, fmtTime, qs, region } from '../dom.js';
import { badge, table } from '../widgets.js';

export default {
  title: () => 'Workflows',
  mount(root, ctx) {
    const list = h('div', {});
    root.append(h('h1', {}, 'Workflows'), list);
    const r = region(list);
    return {
      async refresh() {
        const res = await api('/v1/workflows');
        if (!ctx.alive()) return;
        r(res.workflows, (wfs) => table('Workflows', ['Workflow', 'Latest version', 'State', 'Created', 'Runs'],
          wfs.map((w) => [
            h('a', { href: '/workflows/' + encodeURIComponent(w.name) }, w.name),
            'v' + w.version,
            w.paused ? badge('paused') : h('span', { class: 'badge state-active' }, 'active'),
            fmtTime(w.created_at),
            h('a', { href: '/runs' + qs({ workflow: w.name }) }, 'runs'),
          ]), 'No workflows yet: upload one with `sluice apply FILE`.'));
      },
    };
  },
};
