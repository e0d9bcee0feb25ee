// Workers: each worker's kinds, slots, free slots, memory, latency, last
// heartbeat and the tasks it runs.
import { api } from '../api.js';
import { h, region } from '../dom.js';
import { workersTable } from './common.js';

export default {
  title: () => 'Workers',
  mount(root, ctx) {
    const list = h('div', {});
    root.append(h('h1', {}, 'Workers'),
      h('p', { class: 'muted' }, 'Capacity as of each worker’s last heartbeat; free slots never above its slots less the tasks it runs.'),
      list);
    const r = region(list);
    return {
      async refresh() {
        const w = await api('/v1/workers');
        if (!ctx.alive()) return;
        const now = Date.now();
        r({ w: w.workers, t: Math.floor(now / 1000) }, (d) => workersTable(d.w, now));
      },
    };
  },
};
