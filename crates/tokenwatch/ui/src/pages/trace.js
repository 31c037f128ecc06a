// One trace (#/traces/ID): every proxied request of the trace and its OTLP spans as a waterfall,
// with the trace's logs; refreshed each poll since spans and logs arrive after the requests.

import { getJSON } from '../api.js';
import { h, setText } from '../dom.js';
import { Waterfall } from '../waterfall.js';

let st = null;

function mount(el, ctx) {
  const lead = h('p', { class: 'lead' });
  const host = h('div');
  el.append(h('div', { class: 'page-head' }, h('h1', {}, 'Trace ', h('span', { class: 'mono' }, ctx.arg)),
    h('a', { href: '#/requests' }, '← requests')), lead, host);
  st = { id: ctx.arg.toLowerCase(), lead, waterfall: new Waterfall(host) };
}

async function refresh(ctx) {
  const trace = await getJSON(`/api/v1/traces/${encodeURIComponent(st.id)}`, {}, ctx.signal);
  if (ctx.signal.aborted || !st) return;
  const models = [...new Set((trace.requests ?? []).map((r) => r.model_id))];
  setText(st.lead, `${trace.requests?.length ?? 0} proxied request(s)${models.length ? ` to ${models.join(', ')}` : ''}, `
    + `${trace.spans?.length ?? 0} span(s), ${trace.logs?.length ?? 0} log record(s).`);
  st.waterfall.update(trace);
}

function unmount() {
  st?.waterfall.destroy();
  st = null;
}

export default { name: 'trace', nav: 'requests', title: 'Trace', mount, refresh, unmount };
