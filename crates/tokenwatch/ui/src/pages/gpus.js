// GPU page (#/gpus?range=15m): per device memory over time (used, total, each process), with
// the leak detector's trend drawn when a leak alert fired for it, and the current device table.

import { getJSON } from '../api.js';
import { h, setText, modelHref } from '../dom.js';
import { bytes, ratio, byUnit, timeOfDay } from '../format.js';
import { TimeChart, alignSeries, rangeStart, PALETTE, SEVERITY_COLOR } from '../charts.js';
import { leakTrends, trendValues } from '../leak.js';

const RANGES = { '5m': 300, '15m': 900, '1h': 3600 };
const RESOLUTION = { '5m': 1, '15m': 2, '1h': 5 };
/** Charts drawn at most; on a large fleet the devices with alerts, then the fullest, come first. */
const MAX_CHARTS = 48;

let st = null;

function mount(el, ctx) {
  const range = RANGES[ctx.params.get('range')] ? ctx.params.get('range') : '15m';
  const picker = h('div', { class: 'picker' }, 'range ',
    Object.keys(RANGES).map((r) => h('button', { class: r === range ? 'on' : '', onclick: () => ctx.setParams({ range: r }) }, r)));
  const source = h('p', { class: 'muted', id: 'gpu-source' });
  const table = h('tbody');
  const tableWrap = h('table', { class: 'grid', hidden: true },
    h('thead', {}, h('tr', {}, ['GPU', 'model', 'memory', 'utilisation', 'temperature', 'power', 'processes'].map((c) => h('th', {}, c)))), table);
  const grid = h('div', { class: 'panels' });
  const empty = h('p', { class: 'muted', hidden: true }, 'No GPU memory series yet: tokenwatch reads them from NVML, dcgm-exporter, or a runtime\'s /metrics.');
  const capped = h('p', { class: 'muted', hidden: true });
  el.append(h('div', { class: 'page-head' }, h('h1', {}, 'GPUs'), picker), source, tableWrap,
    h('h2', {}, 'Memory over time'), empty, capped, grid);
  st = { range, source, table, tableWrap, grid, empty, capped, charts: new Map(), xmin: Date.now() / 1000 - RANGES[range], xmax: Date.now() / 1000, markers: new Map() };
}

/** Latest used / total of a device (0 when unknown), for ordering. */
function latestRatio(d) {
  const last = (name) => d.series.find((s) => s.signal === name)?.v.at(-1);
  const used = last('gpu_memory_used_bytes');
  const total = last('gpu_memory_total_bytes');
  return used > 0 && total > 0 ? used / total : 0;
}

function deviceKey(d) {
  return `${d.model_id}|${d.instance}|${d.device_id}`;
}

function containerText(c) {
  if (!c) return '';
  const parts = [c.container_id ? `${c.runtime || 'container'} ${c.container_id.slice(0, 12)}` : '', c.pod_uid ? `pod ${c.pod_uid}` : ''].filter(Boolean);
  return parts.length ? ` (${parts.join(', ')})` : '';
}

function renderSource(gpus) {
  const s = gpus.enabled
    ? `GPU source: ${gpus.backend}${gpus.reader ? ` (${gpus.reader})` : ''}, last read ${timeOfDay(gpus.updated_unix_ms)}`
    : `GPU source off: ${gpus.reason ?? 'not configured'}. Memory below comes from scraped runtimes / dcgm-exporter / OTLP.`;
  setText(st.source, s);
  const devices = gpus.devices ?? [];
  st.tableWrap.hidden = devices.length === 0;
  const pct = byUnit('ratio');
  st.table.replaceChildren(...devices.map((d) => h('tr', {},
    h('td', {}, `${d.index} · ${d.name}`, h('div', { class: 'muted mono' }, d.uuid)),
    h('td', {}, d.model_id ? h('a', { href: modelHref(d.model_id) }, d.model_id) : '–'),
    h('td', {}, `${bytes(d.memory_used_bytes)} / ${bytes(d.memory_total_bytes)} (${ratio(d.memory_used_ratio)})`),
    h('td', {}, pct(d.utilization)),
    h('td', {}, byUnit('celsius')(d.temperature_celsius)),
    h('td', {}, byUnit('watts')(d.power_watts)),
    h('td', {}, (d.processes ?? []).map((p) => h('div', {}, `pid ${p.pid}: ${bytes(p.used_memory_bytes)}${containerText(p.container)}`))))));
}

function chartFor(d) {
  const key = deviceKey(d);
  let c = st.charts.get(key);
  if (!c) {
    const title = [d.model_id, d.instance, d.device_id].filter(Boolean).join(' · ') || 'GPU';
    c = new TimeChart(st.grid, {
      id: `gpu:${key}`, title, unit: 'bytes', sync: 'gpus', height: 170,
      xRange: () => [st.xmin, st.xmax], markers: () => st.markers.get(key) ?? [],
    });
    st.charts.set(key, c);
  }
  return c;
}

/** GPU-memory alerts of this device (labels that are present must match) as chart marks. */
function markersFor(d, alerts) {
  const same = (label, v) => label === undefined || label === '' || label === v;
  return alerts
    .filter((a) => a.last_event?.detector === 'gpu_memory_leak' || a.rule.startsWith('gpu_memory'))
    .filter((a) => (a.labels?.model_id ?? '') === d.model_id && same(a.labels?.instance, d.instance) && same(a.labels?.device_id, d.device_id))
    .map((a) => ({ t: a.active_at_unix_ms / 1000, color: SEVERITY_COLOR[a.severity], label: `${a.rule} (${a.state})` }));
}

function deviceData(d, procs, alerts) {
  const list = [];
  const series = [];
  const used = d.series.find((s) => s.signal === 'gpu_memory_used_bytes');
  const total = d.series.find((s) => s.signal === 'gpu_memory_total_bytes');
  if (used) {
    list.push(used);
    series.push({ label: 'used', color: PALETTE[0], width: 2 });
  }
  if (total) {
    list.push(total);
    series.push({ label: 'total', color: '#94a3b8', dash: [2, 3] });
  }
  procs.forEach((p, i) => {
    list.push({ t: p.t, v: p.used_bytes });
    series.push({ label: `pid ${p.pid}${p.container ? ` ${p.container}` : ''}${p.pod ? ` (${p.pod})` : ''}`, color: PALETTE[(i + 2) % PALETTE.length] });
  });
  const data = alignSeries(list, RESOLUTION[st.range]);
  const trend = leakTrends(alerts, { model: d.model_id, instance: d.instance, device: d.device_id })[0];
  if (trend) {
    series.push({ label: `leak trend ${bytes(trend.growth * 60)}/min`, color: SEVERITY_COLOR.critical, dash: [6, 4], width: 2 });
    data.push(trendValues(trend, data[0]));
  }
  return { series, data };
}

async function refresh(ctx) {
  const [gpus, hist, alertBody] = await Promise.all([
    getJSON('/api/v1/gpus', {}, ctx.signal),
    getJSON('/api/v1/gpus/history', { range: st.range }, ctx.signal),
    getJSON('/api/v1/alerts', {}, ctx.signal),
  ]);
  if (ctx.signal.aborted) return;
  renderSource(gpus ?? {});
  const alerts = alertBody?.alerts ?? [];
  const devices = hist?.devices ?? [];
  const procs = hist?.processes ?? [];
  const lastT = Math.max(0, ...devices.flatMap((d) => d.series.map((s) => s.t.at(-1) ?? 0)));
  st.xmax = lastT || Date.now() / 1000;
  st.xmin = rangeStart(st.xmax, RANGES[st.range], devices.flatMap((d) => d.series.map((s) => s.t)));
  const seen = new Set();
  st.markers = new Map();
  const ranked = devices.map((d) => ({ d, marks: markersFor(d, alerts), fill: latestRatio(d) }))
    .sort((a, b) => b.marks.length - a.marks.length || b.fill - a.fill || deviceKey(a.d).localeCompare(deviceKey(b.d)))
    .slice(0, MAX_CHARTS);
  ranked.forEach(({ d, marks }, i) => {
    seen.add(deviceKey(d));
    st.markers.set(deviceKey(d), marks);
    const { series, data } = deviceData(d, procs.filter((p) => p.device_id && p.device_id === d.device_id), alerts);
    const chart = chartFor(d);
    chart.setData(series, data);
    if (st.grid.children[i] !== chart.el) st.grid.insertBefore(chart.el, st.grid.children[i] ?? null);
  });
  st.capped.hidden = devices.length <= MAX_CHARTS;
  setText(st.capped, `Showing ${MAX_CHARTS} of ${devices.length} devices: those with GPU-memory alerts first, then the fullest.`);
  for (const [key, c] of st.charts) {
    if (!seen.has(key)) {
      c.destroy();
      st.charts.delete(key);
    }
  }
  st.empty.hidden = devices.length > 0;
}

function unmount() {
  for (const c of st?.charts.values() ?? []) c.destroy();
  st = null;
}

export default { name: 'gpus', nav: 'gpus', title: 'GPUs', mount, refresh, unmount };
