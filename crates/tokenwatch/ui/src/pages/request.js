// One request's token timeline (#/requests/ID): its anomalies (annotations with joint grade), then
// arrival, upstream headers, first token and every content chunk on one line with the gaps between
// them, a gap-per-chunk chart, the record and the request's trace as a waterfall (refreshed each
// poll: spans and logs may arrive later).

import { getJSON } from '../api.js';
import { h, kvTable, modelHref } from '../dom.js';
import { seconds, dateTime, num } from '../format.js';
import { TimeChart, PALETTE } from '../charts.js';
import { Waterfall, validTraceId } from '../waterfall.js';
import { annotationBadges } from './requests.js';

let st = null;

function mount(el, ctx) {
  st = { id: ctx.arg, el, loaded: false, chart: null, canvas: null, record: null, resize: null, waterfall: null };
}

/** Gaps between consecutive chunks: [{chunk (1-based), at (s after arrival), gap (s)}]. */
function gapsOf(offsetsS) {
  return offsetsS.slice(1).map((t, i) => ({ chunk: i + 2, at: t, gap: t - offsetsS[i] }));
}

function drawTimeline(canvas, r, offsetsS) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 800;
  const hgt = 140;
  canvas.width = w * dpr;
  canvas.height = hgt * dpr;
  canvas.style.height = `${hgt}px`;
  const ctx = canvas.getContext('2d');
  ctx.scale(dpr, dpr);
  ctx.clearRect(0, 0, w, hgt);
  const pad = 16;
  const end = Math.max(r.end_s ?? 0, offsetsS.at(-1) ?? 0) || 1;
  const x = (s) => pad + (s / end) * (w - 2 * pad);
  const base = 64;
  ctx.font = '11px system-ui, sans-serif';
  ctx.textBaseline = 'alphabetic';
  // Queue and time to headers as shaded spans.
  if (r.queue_s) {
    ctx.fillStyle = '#fde68a';
    ctx.fillRect(x(0), base - 10, x(r.queue_s) - x(0), 20);
  }
  // Gaps: the line between chunks, red where a gap is far above this request's mean gap.
  const mean = r.gaps?.mean_s || 0;
  let prev = r.first_token_s ?? 0;
  ctx.lineWidth = 3;
  ctx.strokeStyle = '#cbd5e1';
  ctx.beginPath();
  ctx.moveTo(x(0), base);
  ctx.lineTo(x(prev), base);
  ctx.stroke();
  for (const t of offsetsS) {
    const gap = t - prev;
    ctx.strokeStyle = mean > 0 && gap > 3 * mean && gap > 0.02 ? '#dc2626' : '#94a3b8';
    ctx.beginPath();
    ctx.moveTo(x(prev), base);
    ctx.lineTo(x(t), base);
    ctx.stroke();
    prev = t;
  }
  // Every chunk as a tick.
  ctx.lineWidth = 1;
  ctx.strokeStyle = PALETTE[0];
  ctx.beginPath();
  for (const t of offsetsS) {
    ctx.moveTo(x(t) + 0.5, base - 14);
    ctx.lineTo(x(t) + 0.5, base + 14);
  }
  ctx.stroke();
  // Milestones with labels, alternating above and below the line.
  const marks = [
    ['arrival', 0, '#0f172a'],
    ['headers', r.upstream_headers_s, '#7c3aed'],
    ['first token', r.first_token_s, '#059669'],
    ['end', r.end_s, '#0f172a'],
  ].filter(([, t]) => typeof t === 'number');
  // Labels go to the first lane (above, below, further above, further below) where they fit.
  const lanes = [base - 30, base + 38, base - 44, base + 52];
  const taken = lanes.map(() => []);
  for (const [label, t, color] of marks) {
    const px = x(t);
    ctx.strokeStyle = color;
    ctx.fillStyle = color;
    ctx.lineWidth = 2;
    ctx.beginPath();
    ctx.moveTo(px, base - 24);
    ctx.lineTo(px, base + 24);
    ctx.stroke();
    const text = `${label} ${seconds(t)}`;
    const tw = ctx.measureText(text).width;
    const tx = Math.min(Math.max(px - tw / 2, 2), w - tw - 2);
    const free = (k) => taken[k].every(([a, b]) => tx + tw + 6 < a || tx > b + 6);
    const k = [0, 1, 2, 3].find(free) ?? 0;
    taken[k].push([tx, tx + tw]);
    ctx.fillText(text, tx, lanes[k]);
  }
  // Scale.
  ctx.fillStyle = '#64748b';
  for (let k = 0; k <= 4; k++) {
    const t = (end * k) / 4;
    const text = seconds(t);
    const tw = ctx.measureText(text).width;
    ctx.fillText(text, Math.min(Math.max(x(t) - tw / 2, 2), w - tw - 2), hgt - 4);
  }
  canvas.dataset.points = String(offsetsS.length);
}

/** The request's captured text (only with `capture.text` on), personal data already masked. */
function capturedText(t) {
  if (!t) return null;
  const masked = Object.entries(t.masked ?? {}).map(([k, n]) => `${n} ${k}`).join(', ');
  return h('section', { class: 'card', id: 'request-text' }, h('h2', {}, 'Captured text'),
    h('p', { class: 'muted' }, `Region ${t.region}; personal data replaced by keyed hashes${masked ? ` (${masked})` : ' (none found)'}${t.truncated ? '; cut at capture.max_bytes' : ''}.`),
    h('h3', {}, 'Prompt'), h('pre', { class: 'mono captured' }, t.prompt),
    h('h3', {}, 'Completion'), h('pre', { class: 'mono captured' }, t.completion));
}

function render(r) {
  const offsetsS = (r.chunk_offsets_us ?? []).map((us) => us / 1e6);
  const gaps = gapsOf(offsetsS);
  const worst = [...gaps].sort((a, b) => b.gap - a.gap).slice(0, 5);
  const canvas = h('canvas', { class: 'timeline', id: 'token-timeline', dataset: { points: '0', chunks: String(offsetsS.length) } });
  const chartHost = h('div', { class: 'panels' });
  const traceHost = h('div', { id: 'trace' });
  const notes = r.annotations ?? [];
  const anomalies = notes.length ? h('section', { class: 'card', id: 'request-annotations' }, h('h2', {}, 'Anomalies'),
    h('p', { class: 'muted' }, 'Per-request findings: they mark this request, they do not page. The joint grade is high when its model\u2019s outputs also drift in meaning.'),
    h('ul', { class: 'annotations' }, notes.map((a, i) => h('li', {}, annotationBadges(notes)[i], ' ', a.summary)))) : null;
  st.el.replaceChildren(
    h('div', { class: 'page-head' }, h('h1', {}, 'Request ', h('span', { class: 'mono' }, r.request_id)),
      h('a', { href: '#/requests' }, '← all requests')),
    h('p', { class: 'lead' },
      `${r.model_id} · ${r.status}${r.error_class ? ` ${r.error_class}` : ''} · first token after ${seconds(r.first_token_s)}, `,
      `${offsetsS.length} chunks, done after ${seconds(r.end_s)}`,
      r.gaps?.count ? ` · longest gap ${seconds(r.gaps.max_s)} (mean ${seconds(r.gaps.mean_s)})` : ''),
    anomalies,
    capturedText(r.text),
    h('section', { class: 'card' }, h('h2', {}, 'Token timeline'),
      h('p', { class: 'muted' }, 'Every tick is a content chunk as the proxy saw it; red stretches are gaps over 3× this request’s mean gap; yellow is the queue time the server reported.'),
      canvas),
    chartHost,
    traceHost,
    h('div', { class: 'cols' },
      kvTable([
        ['arrival', dateTime(r.arrival_unix_ms)],
        ['model', h('a', { href: modelHref(r.model_id) }, r.model_id)],
        ['runtime / instance', `${r.runtime} / ${r.instance}`],
        ['tenant', r.tenant || '–'],
        ['A/B group, model version, prompt version', [r.ab_group, r.model_version, r.prompt_version].map((v) => v || '–').join(', ')],
        ['endpoint', `${r.endpoint}${r.stream ? ' (stream)' : ''}`],
        ['status', `${r.status}${r.error_class ? ` ${r.error_class}` : ''}`],
        ['finish reason', r.finish_reason || '–'],
        ['tokens in / out', `${num(r.prompt_tokens, 0)} / ${num(r.output_tokens, 0)}${r.tokens_from_usage ? ' (from usage)' : ' (counted)'}`],
        ['reasoning tokens (of out)', r.reasoning_tokens == null ? '–' : num(r.reasoning_tokens, 0)],
        ['queue (reported)', seconds(r.queue_s)],
        ['upstream headers', seconds(r.upstream_headers_s)],
        ['trace id', validTraceId(r.trace_id) ? h('a', { class: 'mono', href: `#/traces/${r.trace_id}` }, r.trace_id) : h('span', { class: 'mono' }, r.trace_id || '–')],
      ]),
      worst.length ? h('div', {}, h('h2', {}, 'Longest gaps'),
        h('table', { class: 'grid' }, h('thead', {}, h('tr', {}, h('th', {}, 'before chunk'), h('th', { class: 'n' }, 'at'), h('th', { class: 'n' }, 'gap'))),
          h('tbody', {}, worst.map((g) => h('tr', {}, h('td', {}, g.chunk), h('td', { class: 'n' }, seconds(g.at)), h('td', { class: 'n' }, seconds(g.gap))))))) : null));
  st.canvas = canvas;
  st.record = { r, offsetsS };
  drawTimeline(canvas, r, offsetsS);
  st.resize = new ResizeObserver(() => drawTimeline(canvas, r, offsetsS));
  st.resize.observe(canvas);
  st.chart = new TimeChart(chartHost, { id: 'gaps', title: 'Inter-token gap before each chunk, by time since arrival', unit: 'seconds', xUnit: 'seconds', bars: true, height: 150 });
  st.chart.setData([{ label: 'gap', color: PALETTE[0] }], [gaps.map((g) => g.at), gaps.map((g) => g.gap)]);
  st.waterfall = new Waterfall(traceHost, { focus: r.request_id });
  // Without a usable trace id there is nothing to ask for: the proxy's own bar is all there is.
  if (!validTraceId(r.trace_id)) st.waterfall.update({ trace_id: r.trace_id, requests: [r], spans: [], logs: [] });
}

async function refresh(ctx) {
  if (!st.loaded) {
    const r = await getJSON(`/api/v1/requests/${encodeURIComponent(st.id)}`, {}, ctx.signal);
    if (ctx.signal.aborted) return;
    st.loaded = true;
    render(r);
  }
  const { r } = st.record;
  if (!validTraceId(r.trace_id)) return;
  const trace = await getJSON(`/api/v1/traces/${r.trace_id.toLowerCase()}`, {}, ctx.signal);
  if (ctx.signal.aborted || !st) return;
  if (!trace.requests?.some((x) => x.request_id === r.request_id)) trace.requests = [r, ...(trace.requests ?? [])];
  st.waterfall.update(trace);
}

function unmount() {
  st?.resize?.disconnect();
  st?.chart?.destroy();
  st?.waterfall?.destroy();
  st = null;
}

export default { name: 'request', nav: 'requests', title: 'Request', mount, refresh, unmount };
