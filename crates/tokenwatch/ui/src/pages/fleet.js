// Fleet overview (#/): what hurts now — a banner per model with active alerts (since when, why),
// then one row per model with latency percentiles, rates, errors, KV cache, GPU memory, sparklines.
// Figures a model's runtime reported (no proxy/OTLP record of it) carry a marker and, on hover,
// the histogram bucket each percentile lies in.

import { getJSON } from '../api.js';
import { h, setText, badge, modelHref } from '../dom.js';
import { seconds, bytes, ratio, num, timeOfDay, ago } from '../format.js';
import { drawSparkline, PALETTE } from '../charts.js';
import { activeByModel, alertTitle, alertSentence, causeText } from './alert_text.js';

const WINDOWS = ['1m', '5m', '1h'];
const SEV_ORDER = { critical: 0, warning: 1, info: 2 };
// Row cells whose figure is from records or the runtime (`figure_source`), with its fleet column.
const FIGURE_CELLS = [['ttft50', 'ttft_p50_s'], ['ttft99', 'ttft_p99_s'], ['itl50', 'itl_p50_s'],
  ['itl99', 'itl_p99_s'], ['rps', 'requests_per_s'], ['tps', 'output_tokens_per_s'], ['err', 'error_ratio']];

const SPARKS = [
  ['ttft_p99_s', 'TTFT P99', PALETTE[1], 'seconds'],
  ['requests_per_s', 'req/s', PALETTE[0], 'requests/s'],
  ['kv_cache_usage', 'KV cache', PALETTE[4], 'ratio'],
  ['gpu_memory_used_bytes', 'GPU memory', PALETTE[3], 'bytes'],
];

let st = null;

function mount(el, ctx) {
  const win = WINDOWS.includes(ctx.params.get('window')) ? ctx.params.get('window') : '1m';
  const picker = h('div', { class: 'picker' }, 'window ',
    WINDOWS.map((w) => h('button', { class: w === win ? 'on' : '', onclick: () => ctx.setParams({ window: w }) }, w)));
  const banner = h('div', { class: 'banner', id: 'incidents' });
  const tbody = h('tbody');
  const table = h('table', { class: 'fleet grid' },
    h('thead', {}, h('tr', {},
      h('th', {}, 'model'), h('th', {}, 'alerts'),
      h('th', { class: 'n' }, 'TTFT P50'), h('th', { class: 'n' }, 'TTFT P99'),
      h('th', { class: 'n' }, 'ITL P50'), h('th', { class: 'n' }, 'ITL P99'),
      h('th', { class: 'n' }, 'req/s'), h('th', { class: 'n' }, 'tok/s out'), h('th', { class: 'n' }, 'errors'),
      h('th', { class: 'n' }, 'KV cache'), h('th', { class: 'n' }, 'GPU memory'),
      SPARKS.map(([, label]) => h('th', { class: 'spark', title: 'last 5 minutes' }, label)))),
    tbody);
  const empty = h('p', { class: 'muted', hidden: true }, 'No model has been seen yet: send traffic through the proxy, or configure scrape targets / OTLP.');
  el.append(h('div', { class: 'page-head' }, h('h1', {}, 'Fleet'), picker), banner,
    h('div', { class: 'scroll' }, table), empty,
    h('p', { class: 'muted small' }, `Numbers over the last ${win}; sparklines show the last 5 minutes. Click a model for its charts.`),
    h('p', { class: 'muted small', id: 'runtime-legend', hidden: true },
      'ʳ reported by the serving runtime (its scraped histograms and counters: no proxy or OTLP record of the model); a percentile lies within its histogram bucket, shown on hover.'),
    h('p', { class: 'muted small', id: 'both-legend', hidden: true },
      '⇄ the proxy and the runtime both see the model: on hover, the runtime\'s own percentile beside the client-felt one, and the time in front of the runtime (network, gateways, queueing before it).'));
  st = { win, banner, tbody, empty, legend: el.querySelector('#runtime-legend'), both: el.querySelector('#both-legend'), rows: new Map() };
}

function rowFor(model) {
  let row = st.rows.get(model);
  if (row) return row;
  const cells = {};
  const td = (k, cls = 'n') => (cells[k] = h('td', { class: cls }));
  const sparks = SPARKS.map(([key, , color, unit]) => {
    const c = h('canvas', { class: 'spark', dataset: { spark: key } });
    return { key, color, unit, canvas: c };
  });
  const tr = h('tr', { dataset: { model } },
    h('td', {}, h('a', { href: modelHref(model) }, model)),
    td('alerts', ''), td('ttft50'), td('ttft99'), td('itl50'), td('itl99'),
    td('rps'), td('tps'), td('err'), td('kv'), td('gpu'),
    sparks.map((s) => h('td', { class: 'spark' }, s.canvas)));
  tr.addEventListener('click', (e) => {
    if (e.target.closest('a')) return;
    location.hash = modelHref(model);
  });
  row = { tr, cells, sparks };
  st.rows.set(model, row);
  return row;
}

function fillRow(row, m) {
  const c = row.cells;
  const alertKey = `${m.worst_severity}|${m.alerts_firing}|${m.alerts_pending}`;
  if (row.alertKey !== alertKey) {
    row.alertKey = alertKey;
    c.alerts.replaceChildren(m.worst_severity
      ? badge(m.worst_severity, `${m.alerts_firing} firing`)
      : m.alerts_pending ? badge('pending', `${m.alerts_pending} pending`) : badge('none', 'ok'));
  }
  setText(c.ttft50, seconds(m.ttft_p50_s));
  setText(c.ttft99, seconds(m.ttft_p99_s));
  setText(c.itl50, seconds(m.itl_p50_s));
  setText(c.itl99, seconds(m.itl_p99_s));
  setText(c.rps, num(m.requests_per_s, 2));
  setText(c.tps, num(m.output_tokens_per_s));
  setText(c.err, ratio(m.error_ratio));
  markSource(c, m);
  setText(c.kv, ratio(m.kv_cache_usage));
  const gpu = m.gpu_memory_used_bytes == null ? bytes(null)
    : `${bytes(m.gpu_memory_used_bytes)} / ${bytes(m.gpu_memory_total_bytes)} (${ratio(m.gpu_memory_used_ratio)})`;
  setText(c.gpu, gpu);
  const cls = m.worst_severity ? `hurt sev-row-${m.worst_severity}` : '';
  if (row.tr.className !== cls) row.tr.className = cls;
  for (const s of row.sparks) drawSparkline(s.canvas, m.sparklines?.[s.key], { color: s.color, unit: s.unit });
}

// Marks the figures the runtime reported, with the bucket of each latency percentile as a title;
// where the proxy and the runtime both see the model, the runtime's own percentile and the time
// in front of it (network, gateways, queueing before the runtime) beside the client-felt one.
function markSource(cells, m) {
  const runtime = m.figure_source === 'runtime';
  const within = (b) => `within (${seconds(b.lower)}, ${b.upper == null ? '+Inf' : seconds(b.upper)}]`;
  for (const [cell, column] of FIGURE_CELLS) {
    const el = cells[cell];
    const on = runtime && m[column] != null;
    el.classList.toggle('src-runtime', on);
    const beside = !runtime && m[column] != null ? m.runtime_view?.[column] : null;
    el.classList.toggle('src-both', beside != null);
    const b = m.bucket_bounds?.[column];
    let title = '';
    if (on) title = b ? `from the runtime's histogram: ${within(b)}` : "from the runtime's counters";
    else if (beside) {
      const gap = m.client_minus_runtime?.[column];
      const range = gap ? `${gap.at_least == null ? '−∞' : seconds(gap.at_least)} to ${seconds(gap.at_most)}` : '–';
      title = `client-felt (proxy) ${seconds(m[column])}; the runtime reports ${seconds(beside.value)} (${within(beside.bucket)}): `
        + `${range} in front of the runtime`;
    }
    if (el.title !== title) el.title = title;
  }
}

function renderBanner(alertList) {
  const groups = activeByModel(alertList);
  if (!groups.length) {
    st.banner.className = 'banner healthy';
    st.banner.replaceChildren(h('strong', {}, 'All clear'), ' — no alert is firing or pending.');
    return;
  }
  st.banner.className = `banner hurt sev-${groups[0].worst}`;
  st.banner.replaceChildren(...groups.map((g) => {
    const lead = g.alerts[0];
    const cause = g.alerts.map((a) => causeText(a)).find(Boolean);
    const since = lead.fired_at_unix_ms ?? lead.active_at_unix_ms;
    return h('div', { class: 'incident', dataset: { model: g.model } },
      h('div', {}, badge(lead.severity), ' ',
        h('a', { href: modelHref(g.model), class: 'model' }, g.model || '(no model)'), ' — ',
        h('a', { href: `#/alerts/${encodeURIComponent(lead.id)}` }, alertTitle(lead)),
        ` ${lead.state} since ${timeOfDay(since)} (${ago(since)})`,
        g.alerts.length > 1 ? h('span', { class: 'muted' }, ` · +${g.alerts.length - 1} more alert(s)`) : null),
      h('div', { class: 'sentence' }, alertSentence(lead)),
      cause ? h('div', { class: 'cause' }, 'likely cause: ', cause) : null);
  }));
}

async function refresh(ctx) {
  const [fleet, alertBody] = await Promise.all([
    getJSON('/api/v1/fleet', { window: st.win }, ctx.signal),
    getJSON('/api/v1/alerts', {}, ctx.signal),
  ]);
  if (ctx.signal.aborted) return;
  renderBanner(alertBody?.alerts ?? []);
  const models = [...(fleet?.models ?? [])].sort((a, b) =>
    (SEV_ORDER[a.worst_severity] ?? 9) - (SEV_ORDER[b.worst_severity] ?? 9) || a.model_id.localeCompare(b.model_id));
  const seen = new Set();
  models.forEach((m, i) => {
    const row = rowFor(m.model_id);
    seen.add(m.model_id);
    if (st.tbody.children[i] !== row.tr) st.tbody.insertBefore(row.tr, st.tbody.children[i] ?? null);
    fillRow(row, m);
  });
  for (const [model, row] of st.rows) {
    if (!seen.has(model)) {
      row.tr.remove();
      st.rows.delete(model);
    }
  }
  st.empty.hidden = models.length > 0;
  if (st.legend) st.legend.hidden = !models.some((m) => m.figure_source === 'runtime');
  if (st.both) st.both.hidden = !models.some((m) => m.runtime_view && Object.keys(m.runtime_view).length);
}

export default { name: 'fleet', nav: 'fleet', title: 'Fleet', mount, refresh, unmount: () => { st = null; } };
