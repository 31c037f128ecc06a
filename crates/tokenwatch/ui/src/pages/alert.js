// One alert (#/alerts/ID): what, where, since when; the root-cause chain drawn as boxes and
// arrows; evidence; latency breakdown; eviction ranking; snapshot link; charts around it.

import { getJSON, tokenDownload } from '../api.js';
import { h, badge, stateBadge, kvTable, modelHref } from '../dom.js';
import { dateTime, ago, seconds, ratio, evidenceValue, num } from '../format.js';
import { TimeChart, alignSeries, rangeStart, SEVERITY_COLOR, PALETTE } from '../charts.js';
import { leakTrends, trendValues } from '../leak.js';
import { alertTitle, alertSentence } from './alert_text.js';

const SHOWN_ANNOTATIONS = new Set(['summary', 'description', 'detector_summary', 'latency_breakdown', 'latency_breakdown_json', 'eviction_ranking', 'eviction_candidate', 'root_cause', 'runbook_url']);

/** The rule's runbook as a link (http(s) only; the configuration checks it too), or '–'. */
function runbook(url) {
  return /^https?:\/\//.test(url ?? '') ? h('a', { href: url, rel: 'noopener noreferrer', target: '_blank', id: 'runbook-link' }, url) : '–';
}
const RANGE_S = 900;

let st = null;

function mount(el, ctx) {
  const body = h('div', { class: 'alert-detail' });
  const charts = h('div', { class: 'panels' });
  el.append(body, h('h2', {}, 'Around this alert (15 min)'), charts);
  st = { id: ctx.arg, body, chartsEl: charts, charts: null, lastJson: '', xmin: Date.now() / 1000 - RANGE_S, xmax: Date.now() / 1000, markers: [] };
}

function parseJson(text) {
  try {
    return text ? JSON.parse(text) : null;
  } catch {
    return null;
  }
}

function chain(a) {
  if (!a.root_cause?.length) {
    return h('p', { class: 'muted' }, 'No upstream cause ranked for this alert: it is the first symptom on the causal graph, or nothing else was anomalous in time.');
  }
  return h('ol', { class: 'chains' }, a.root_cause.map((c, i) => h('li', { class: i === 0 ? 'chain top' : 'chain' },
    h('div', { class: 'boxes' }, c.path.map((node, k) => [
      k > 0 ? h('span', { class: 'arrow', 'aria-hidden': 'true' }, '→') : null,
      h('span', { class: `box ${k === 0 ? 'cause' : k === c.path.length - 1 ? 'effect' : ''}` }, node.replaceAll('_', ' ')),
    ])),
    h('div', { class: 'chain-meta' },
      `confidence ${ratio(c.confidence)} · time alignment ${ratio(c.alignment)} · rank ${c.rank.toFixed(2)} · `,
      `seen ${seconds(c.observed_delay_ms / 1000)} before the symptom (typical ${seconds(c.expected_delay_ms / 1000)})`),
    h('div', { class: 'sentence' }, c.summary))));
}

function breakdown(a) {
  const b = parseJson(a.annotations?.latency_breakdown_json);
  if (!b) return null;
  const parts = [['queue', b.queue_s, PALETTE[3]], ['prefill', b.prefill_s, PALETTE[4]], ['decode', b.decode_s, PALETTE[0]], ['network / proxy', b.network_s, PALETTE[9]]];
  const total = parts.reduce((s, [, v]) => s + (v ?? 0), 0) || 1;
  return h('section', { class: 'card' }, h('h2', {}, `Latency breakdown (mean of the ${b.requests} slowest requests)`),
    h('div', { class: 'stack', id: 'breakdown' }, parts.map(([n, v, c]) => h('span', { style: { width: `${(100 * (v ?? 0)) / total}%`, background: c }, title: `${n} ${seconds(v)}` }))),
    h('div', { class: 'legend-row' }, parts.map(([n, v, c]) => h('span', {}, h('i', { style: { background: c } }), `${n} ${seconds(v)}`))));
}

function eviction(a) {
  const rank = parseJson(a.annotations?.eviction_ranking);
  if (!Array.isArray(rank) || !rank.length) return null;
  return h('section', { class: 'card' }, h('h2', {}, 'Eviction ranking (drain or restart first)'),
    h('table', { class: 'grid' }, h('thead', {}, h('tr', {}, h('th', {}, '#'), h('th', {}, 'instance'), h('th', { class: 'n' }, 'score'))),
      h('tbody', {}, rank.map(([inst, score], i) => h('tr', {}, h('td', {}, i + 1), h('td', {}, inst), h('td', { class: 'n' }, num(score, 3)))))));
}

/** Evidence values by key; a request id links to that request's timeline. */
function evidenceCell(k, v) {
  if (k === 'request_id' && typeof v === 'string' && v) return h('a', { href: `#/requests/${encodeURIComponent(v)}`, class: 'mono' }, v);
  return evidenceValue(k, v);
}

function render(a) {
  const ev = a.last_event;
  const labels = Object.entries(a.labels ?? {});
  const extra = Object.entries(a.annotations ?? {}).filter(([k]) => !SHOWN_ANNOTATIONS.has(k));
  const model = a.labels?.model_id;
  const sentence = alertSentence(a);
  const description = a.annotations?.description;
  st.body.replaceChildren(...[
    h('div', { class: 'page-head' }, h('h1', {}, badge(a.severity), ' ', alertTitle(a)), stateBadge(a.state)),
    a.annotations?.summary && a.annotations.summary !== sentence ? h('p', { class: 'lead' }, h('strong', {}, a.annotations.summary)) : null,
    h('p', { class: 'lead' }, sentence),
    description && !description.startsWith(sentence) ? h('p', {}, description) : null,
    h('div', { class: 'cols' },
      kvTable([
        ['rule', a.rule + (a.grade ? ` (${a.grade})` : '')],
        ['model', model ? h('a', { href: modelHref(model) }, model) : '–'],
        ['labels', labels.map(([k, v]) => h('span', { class: 'chip' }, `${k}=${v}`))],
        ['pending since', `${dateTime(a.active_at_unix_ms)} (${ago(a.active_at_unix_ms)})`],
        ['firing since', a.fired_at_unix_ms ? dateTime(a.fired_at_unix_ms) : '–'],
        ['resolved', a.resolved_at_unix_ms ? dateTime(a.resolved_at_unix_ms) : '–'],
        ['incident', a.incident_id ?? '–'],
        ['runbook', runbook(a.annotations?.runbook_url)],
        ['snapshot', a.snapshot
          ? h('a', { href: `/api/v1/alerts/${encodeURIComponent(a.id)}/snapshot`, download: `tokenwatch-${a.id}.json.gz`, id: 'snapshot-link', onclick: tokenDownload }, 'download snapshot (gzip’d JSON)')
          : 'not written yet'],
      ]),
      ev ? h('div', {}, h('h2', {}, `Evidence · ${ev.detector} on ${ev.signal} · score ${num(ev.score, 2)}`),
        kvTable(Object.entries(ev.evidence ?? {}).map(([k, v]) => [k, evidenceCell(k, v)]), 'kv evidence')) : null),
    h('section', { class: 'card' }, h('h2', {}, 'Root-cause chain'), chain(a)),
    breakdown(a),
    eviction(a),
    extra.length ? h('section', { class: 'card' }, h('h2', {}, 'Annotations'), kvTable(extra)) : null,
  ].filter(Boolean));
}

function ensureCharts() {
  if (st.charts) return;
  const xRange = () => [st.xmin, st.xmax];
  const markers = () => st.markers;
  st.charts = {
    ttft: new TimeChart(st.chartsEl, { id: 'ttft', title: 'Time to first token', unit: 'seconds', sync: 'alert', xRange, markers, height: 150 }),
    res: new TimeChart(st.chartsEl, { id: 'resource', title: 'GPU memory used', unit: 'bytes', sync: 'alert', xRange, markers, height: 150 }),
  };
}

function updateCharts(a, ts) {
  ensureCharts();
  const t = ts.t ?? [];
  st.xmax = t.at(-1) ?? Date.now() / 1000;
  st.xmin = rangeStart(st.xmax, RANGE_S, [t, ...(ts.signals ?? []).map((s) => s.t)]);
  st.markers = [{ t: a.active_at_unix_ms / 1000, color: SEVERITY_COLOR[a.severity], label: `${a.rule} began` }];
  st.charts.ttft.setData([{ label: 'P50', color: PALETTE[0] }, { label: 'P99', color: PALETTE[1] }],
    [t, ts.series?.ttft_p50_s ?? [], ts.series?.ttft_p99_s ?? []]);
  const mem = (ts.signals ?? []).filter((s) => s.signal === 'gpu_memory_used_bytes');
  const series = mem.map((s, i) => ({ label: [s.instance, s.device_id].filter(Boolean).join(' '), color: PALETTE[i % PALETTE.length] }));
  const data = alignSeries(mem, 2);
  mem.forEach((s) => {
    const trend = leakTrends([a], { model: a.labels?.model_id ?? '', instance: s.instance, device: s.device_id })[0];
    if (!trend) return;
    series.push({ label: 'leak trend (detector)', color: SEVERITY_COLOR.critical, dash: [6, 4], width: 2 });
    data.push(trendValues(trend, data[0]));
  });
  st.charts.res.setData(series, data);
}

async function refresh(ctx) {
  const a = await getJSON(`/api/v1/alerts/${encodeURIComponent(st.id)}`, {}, ctx.signal);
  if (ctx.signal.aborted) return;
  const json = JSON.stringify(a);
  if (json !== st.lastJson) {
    render(a);
    st.lastJson = json;
  }
  const model = a.labels?.model_id;
  if (!model) return;
  const ts = await getJSON('/api/v1/timeseries', { model, range: '15m' }, ctx.signal);
  if (ctx.signal.aborted) return;
  updateCharts(a, ts);
}

function unmount() {
  for (const c of Object.values(st?.charts ?? {})) c.destroy();
  st = null;
}

export default { name: 'alert', nav: 'alerts', title: 'Alert', mount, refresh, unmount };
