// Model page (#/model/NAME?range=15m): latency percentiles, the runtime's queue / prefill / decode
// times, KV cache, GPU memory, queue, throughput, errors and per-context TTFT on one shared,
// cursor-synced time axis with alert marks; a note says when the figures are the runtime's own
// (no proxy or OTLP record of the model), another which phases only the runtime measures.

import { getJSON } from '../api.js';
import { h, badge, stateBadge } from '../dom.js';
import { timeOfDay } from '../format.js';
import { TimeChart, alignSeries, rangeStart, SEVERITY_COLOR, PALETTE } from '../charts.js';
import { leakTrends, trendValues } from '../leak.js';
import { alertTitle, alertSentence, causeText } from './alert_text.js';

const RANGES = { '5m': 300, '15m': 900, '1h': 3600 };
const RESOLUTION = { '5m': 1, '15m': 2, '1h': 5 };
const BUCKETS = ['le512', 'le1024', 'le2048', 'le4096', 'gt4096', 'unknown'];
const BUCKET_LABEL = { le512: '≤512 tokens', le1024: '513–1024', le2048: '1025–2048', le4096: '2049–4096', gt4096: '>4096', unknown: 'unknown length' };

const PERCENTILES = (prefix) => [
  [`${prefix}_p50_s`, 'P50', PALETTE[0]],
  [`${prefix}_p90_s`, 'P90', PALETTE[3]],
  [`${prefix}_p99_s`, 'P99', PALETTE[1]],
];

// Panels top to bottom: symptoms first, then the resources that explain them.
const PANELS = [
  { id: 'ttft', title: 'Time to first token', unit: 'seconds', keys: PERCENTILES('ttft') },
  { id: 'itl', title: 'Inter-token latency', unit: 'seconds', keys: PERCENTILES('itl') },
  { id: 'e2e', title: 'End-to-end latency', unit: 'seconds', keys: PERCENTILES('e2e') },
  // The phases inside the runtime, from its own histograms (vLLM's queue, prefill and decode time).
  { id: 'queue_time', title: 'Queue time (waiting in the runtime)', unit: 'seconds', keys: PERCENTILES('queue'), phase: true },
  { id: 'prefill', title: 'Prefill time ʳ', unit: 'seconds', keys: PERCENTILES('prefill'), phase: true },
  { id: 'decode', title: 'Decode time ʳ', unit: 'seconds', keys: PERCENTILES('decode'), phase: true },
  { id: 'kv', title: 'KV cache use', unit: 'ratio', signals: [['kv_cache_usage', '']] },
  { id: 'gpu', title: 'GPU memory used', unit: 'bytes', signals: [['gpu_memory_used_bytes', '']], leak: true },
  { id: 'queue', title: 'Queue (requests waiting / running)', unit: 'requests', signals: [['requests_waiting', 'waiting'], ['requests_running', 'running']] },
  { id: 'rps', title: 'Request rate', unit: 'requests/s', keys: [['requests_per_s', 'requests/s', PALETTE[0]]] },
  { id: 'tps', title: 'Token rate', unit: 'tokens/s', keys: [['output_tokens_per_s', 'output', PALETTE[2]], ['prompt_tokens_per_s', 'prompt', PALETTE[5]]] },
  { id: 'err', title: 'Error ratio', unit: 'ratio', keys: [['error_ratio', 'errors', PALETTE[1]]] },
  { id: 'ctx', title: 'TTFT P99 by context length', unit: 'seconds', buckets: true },
];

let st = null;

function shortDevice(d) {
  return d ? (d.length > 14 ? `${d.slice(0, 12)}…` : d) : '';
}

function mount(el, ctx) {
  const model = ctx.arg;
  const range = RANGES[ctx.params.get('range')] ? ctx.params.get('range') : '15m';
  const picker = h('div', { class: 'picker' }, h('a', { href: `#/compare?model=${encodeURIComponent(model)}` }, 'compare A/B groups'), ' · range ',
    Object.keys(RANGES).map((r) => h('button', { class: r === range ? 'on' : '', onclick: () => ctx.setParams({ range: r }) }, r)));
  const alertsEl = h('div', { class: 'model-alerts' });
  const grid = h('div', { class: 'panels' });
  el.append(
    h('div', { class: 'page-head' }, h('h1', {}, model), picker),
    alertsEl,
    h('p', { class: 'muted' }, 'All charts share one time axis (your time zone; it starts where the data starts when that is later than the range); hover one to read all. Dashed lines mark when alerts began, solid purple ones version changes and deploys.'),
    h('p', { class: 'muted small', id: 'runtime-source', hidden: true },
      'ʳ Latency, request, token and error figures come from the runtime\'s own histograms and counters (no proxy or OTLP record of this model): each percentile lies within its histogram bucket.'),
    h('p', { class: 'muted small', id: 'phase-source', hidden: true },
      'ʳ Prefill (scheduled → first token) and decode (first → last token) time come only from the runtime\'s own histograms (vLLM), whoever else sees the model; queue time from the upstream\'s x-queue-time header where the proxy gets one, else from the runtime\'s histogram. Each runtime percentile lies within its histogram bucket.'),
    grid);
  st = { model, range, alertsEl, sourceNote: el.querySelector('#runtime-source'), phaseNote: el.querySelector('#phase-source'), markers: [], xmin: Date.now() / 1000 - RANGES[range], xmax: Date.now() / 1000, charts: {} };
  const xRange = () => [st.xmin, st.xmax];
  const markers = () => st.markers;
  for (const p of PANELS) {
    st.charts[p.id] = new TimeChart(grid, { id: p.id, title: p.title, unit: p.unit, sync: 'model', xRange, markers, height: 150, model });
  }
}

function renderAlerts(alerts) {
  const active = alerts.filter((a) => a.state !== 'resolved');
  if (!active.length) {
    st.alertsEl.replaceChildren(h('div', { class: 'banner healthy' }, 'No active alert for this model.'));
    return;
  }
  st.alertsEl.replaceChildren(h('div', { class: `banner hurt sev-${active[0].severity}` }, active.map((a) => {
    const cause = causeText(a);
    return h('div', { class: 'incident' },
      h('div', {}, badge(a.severity), ' ', stateBadge(a.state), ' ',
        h('a', { href: `#/alerts/${encodeURIComponent(a.id)}` }, alertTitle(a)),
        ` since ${timeOfDay(a.fired_at_unix_ms ?? a.active_at_unix_ms)}`),
      h('div', { class: 'sentence' }, alertSentence(a)),
      cause ? h('div', { class: 'cause' }, 'likely cause: ', cause) : null);
  })));
}

function signalPanel(panel, signals, res, alerts) {
  const picked = [];
  for (const [name, prefix] of panel.signals) {
    for (const s of signals.filter((x) => x.signal === name)) {
      const label = [prefix, s.instance, shortDevice(s.device_id)].filter(Boolean).join(' ');
      picked.push({ s, label });
    }
  }
  picked.sort((a, b) => a.label.localeCompare(b.label));
  const series = picked.map((p, i) => ({ label: p.label, color: PALETTE[i % PALETTE.length] }));
  const data = alignSeries(picked.map((p) => p.s), res);
  if (panel.leak) {
    for (const p of picked) {
      const trend = leakTrends(alerts, { model: st.model, instance: p.s.instance, device: p.s.device_id })[0];
      if (!trend) continue;
      series.push({ label: `leak trend ${p.label}`, color: SEVERITY_COLOR.critical, dash: [6, 4], width: 2 });
      data.push(trendValues(trend, data[0]));
    }
  }
  return { series, data };
}

async function refresh(ctx) {
  const [ts, alertBody] = await Promise.all([
    getJSON('/api/v1/timeseries', { model: st.model, range: st.range }, ctx.signal),
    getJSON('/api/v1/alerts', { model: st.model }, ctx.signal),
  ]);
  if (ctx.signal.aborted) return;
  if (st.sourceNote) st.sourceNote.hidden = ts?.figure_source !== 'runtime';
  if (st.phaseNote) {
    st.phaseNote.hidden = !PANELS.filter((p) => p.phase)
      .some((p) => p.keys.some(([k]) => (ts?.series?.[k] ?? []).some((v) => v != null)));
  }
  const alerts = alertBody?.alerts ?? [];
  renderAlerts(alerts);
  st.markers = alerts.map((a) => ({
    t: a.active_at_unix_ms / 1000,
    color: SEVERITY_COLOR[a.severity] ?? '#475569',
    label: a.rule,
  }));
  const t = ts?.t ?? [];
  const signals = ts?.signals ?? [];
  const lastSignal = Math.max(0, ...signals.map((s) => s.t.at(-1) ?? 0));
  st.xmax = Math.max(t.at(-1) ?? 0, lastSignal) || Date.now() / 1000;
  st.xmin = rangeStart(st.xmax, RANGES[st.range], [t, ...signals.map((s) => s.t)]);
  const res = RESOLUTION[st.range];
  for (const p of PANELS) {
    const chart = st.charts[p.id];
    if (p.keys) {
      chart.setData(p.keys.map(([, label, color]) => ({ label, color })), [t, ...p.keys.map(([k]) => ts.series?.[k] ?? t.map(() => null))]);
    } else if (p.buckets) {
      const have = Object.keys(ts.by_context_bucket ?? {});
      const present = [...BUCKETS.filter((b) => have.includes(b)), ...have.filter((b) => !BUCKETS.includes(b))];
      chart.setData(present.map((b, i) => ({ label: BUCKET_LABEL[b] ?? b, color: PALETTE[i % PALETTE.length] })),
        [t, ...present.map((b) => ts.by_context_bucket[b].ttft_p99_s)]);
    } else {
      const { series, data } = signalPanel(p, signals, res, alerts);
      chart.setData(series, data);
    }
  }
}

function unmount() {
  for (const c of Object.values(st?.charts ?? {})) c.destroy();
  st = null;
}

export default { name: 'model', nav: 'fleet', title: 'Model', mount, refresh, unmount };
