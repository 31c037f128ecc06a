// Trace waterfall: the proxy's view of each request of a trace (arrival → headers → first token →
// end) over the trace's OTLP spans nested by parent on one time axis, a details panel, the logs.

import { h, kvTable, modelHref } from './dom.js';
import { seconds, clockMs, num, DASH } from './format.js';
import { PALETTE, SEVERITY_COLOR } from './charts.js';

const KIND = ['unspecified', 'internal', 'server', 'client', 'producer', 'consumer'];
const STATUS = ['unset', 'ok', 'error'];
const LOG_SHOWN = 200;
/** Service colours: the palette without its red (error spans), its blue (the proxy's) last. */
const COLORS = [...PALETTE.slice(1), PALETTE[0]].filter((c) => c !== SEVERITY_COLOR.critical);
/** Proxy bar segments: [key, label, colour]. */
const PHASES = [
  ['wait', 'waiting for upstream headers', '#94a3b8'],
  ['prefill', 'headers → first token', '#a78bfa'],
  ['stream', 'streaming tokens', '#2563eb'],
];

export const validTraceId = (id) => typeof id === 'string' && /^[0-9a-fA-F]{32}$/.test(id) && !/^0+$/.test(id);

/** 1, 2 or 5 × 10^k milliseconds: about `n` ticks over `span` ms. */
function tickStep(span, n = 8) {
  const raw = Math.max(span / n, 1e-6);
  const pow = 10 ** Math.floor(Math.log10(raw));
  return [1, 2, 5, 10].map((m) => m * pow).find((s) => s >= raw);
}

function severityName(l) {
  if (l.severity_text) return l.severity_text;
  const n = l.severity_number ?? 0;
  return n >= 21 ? 'FATAL' : n >= 17 ? 'ERROR' : n >= 13 ? 'WARN' : n >= 9 ? 'INFO' : n >= 5 ? 'DEBUG' : n >= 1 ? 'TRACE' : DASH;
}

/** Length of the union of intervals [a, b], each clipped to [lo, hi]. */
function covered(intervals, lo, hi) {
  const iv = intervals.map(([a, b]) => [Math.max(a, lo), Math.min(b, hi)]).filter(([a, b]) => b > a).sort((x, y) => x[0] - y[0]);
  let total = 0;
  let end = -Infinity;
  for (const [a, b] of iv) {
    if (b <= end) continue;
    total += b - Math.max(a, end);
    end = b;
  }
  return total;
}

/** Rows in drawing order, times in ms since the Unix epoch, self times, the axis [t0, t1]. */
function layout(trace) {
  const spans = (trace.spans ?? []).map((s) => {
    const start = s.start_unix_nano / 1e6;
    return { ...s, start, end: Math.max(start, s.end_unix_nano / 1e6), children: [], record: null };
  });
  const byId = new Map(spans.map((s) => [s.span_id, s]));
  // A GenAI span's own request record (request id = span id) belongs to its span, not above it.
  const records = [];
  for (const r of trace.requests ?? []) {
    const own = byId.get(r.request_id);
    if (own) own.record = r;
    else records.push(r);
  }
  records.sort((a, b) => a.arrival_unix_ms - b.arrival_unix_ms);
  // The proxy's own span of a request (service tokenwatch, attribute tokenwatch.request_id) is
  // that request's proxy bar: not drawn twice, and the spans under it (the upstream's) nest under
  // the bar.
  const proxySpanOf = new Map();
  for (const s of spans) {
    const rid = s.service_name === 'tokenwatch' ? s.attributes?.['tokenwatch.request_id'] : null;
    if (rid && records.some((r) => r.request_id === rid)) proxySpanOf.set(rid, s);
  }
  const asBar = new Set([...proxySpanOf.values()].map((s) => s.span_id));
  const drawn = spans.filter((s) => !asBar.has(s.span_id));
  const roots = [];
  for (const s of spans) {
    const parent = s.parent_span_id && s.parent_span_id !== s.span_id ? byId.get(s.parent_span_id) : null;
    if (parent) parent.children.push(s);
    else if (!asBar.has(s.span_id)) roots.push(s);
  }
  const services = [...new Set(drawn.map((s) => s.service_name || '(no service)'))].sort();
  const selfByService = new Map();
  const rows = [];
  const seen = new Set(asBar);
  const walk = (s, depth) => {
    if (seen.has(s.span_id)) return;
    seen.add(s.span_id);
    s.children.sort((a, b) => a.start - b.start);
    s.self = (s.end - s.start) - covered(s.children.map((c) => [c.start, c.end]), s.start, s.end);
    const svc = s.service_name || '(no service)';
    selfByService.set(svc, (selfByService.get(svc) ?? 0) + s.self);
    rows.push({ kind: 'span', key: `span:${s.span_id}`, depth, s, start: s.start, end: s.end, color: COLORS[services.indexOf(svc) % COLORS.length] });
    for (const c of s.children) walk(c, depth + 1);
  };
  for (const r of records) {
    rows.push({ kind: 'proxy', key: `req:${r.request_id}`, depth: 0, r, start: r.arrival_unix_ms, end: r.arrival_unix_ms + r.end_s * 1000 });
    const own = proxySpanOf.get(r.request_id);
    if (own) for (const c of own.children.sort((a, b) => a.start - b.start)) walk(c, 1);
  }
  for (const s of roots.sort((a, b) => a.start - b.start)) walk(s, 0);
  // A parent cycle leaves spans unreached: draw them as roots rather than drop them.
  for (const s of drawn) if (!seen.has(s.span_id)) walk(s, 0);
  const t0 = Math.min(...rows.map((x) => x.start));
  const t1 = Math.max(...rows.map((x) => x.end));
  return { rows, byId, services, selfByService, t0, t1: t1 > t0 ? t1 : t0 + 1 };
}

export class Waterfall {
  /** `focus`: the request id this page is about (its proxy bar is marked), or null. */
  constructor(host, { focus = null } = {}) {
    this.focus = focus;
    this.signature = null;
    this.pinned = null;
    this.lay = null;
    this.meta = h('p', { class: 'muted' });
    this.wf = h('div', { class: 'wf', id: 'trace-waterfall', dataset: { points: '0', spans: '0', proxy: '0', logs: '0' } });
    this.legend = h('div', { class: 'legend-row' },
      PHASES.map(([, label, color]) => h('span', {}, h('i', { style: { background: color } }), `proxy: ${label}`)),
      h('span', {}, h('i', { style: { background: 'var(--crit)' } }), 'error (span status or failed request)'));
    this.note = h('p', { class: 'wf-note', hidden: true });
    this.details = h('div', { class: 'wf-details', id: 'trace-details' }, h('p', { class: 'muted' }, 'Hover a bar for its attributes; click it to keep them here.'));
    this.logsHead = h('h3', {}, 'Logs of this trace');
    this.logs = h('tbody');
    this.logsTable = h('table', { class: 'grid wf-logs', id: 'trace-logs' },
      h('thead', {}, h('tr', {}, ['time', 'at', 'severity', 'service', 'span', 'message'].map((c, i) => h('th', { class: i === 1 ? 'n' : '' }, c)))), this.logs);
    this.logsEmpty = h('p', { class: 'muted' }, 'No OTLP log record carries this trace id.');
    this.el = h('section', { class: 'card' }, h('h2', {}, 'Trace waterfall'), this.meta, this.wf, this.legend, this.note,
      this.details, this.logsHead, this.logsTable, this.logsEmpty);
    host.append(this.el);
    this.wf.addEventListener('mouseover', (e) => {
      const row = e.target.closest('.wf-row');
      if (row && !this.pinned) this.show(row.dataset.key);
    });
    this.wf.addEventListener('click', (e) => {
      const row = e.target.closest('.wf-row');
      if (!row || e.target.closest('a')) return;
      this.pin(this.pinned === row.dataset.key ? null : row.dataset.key);
    });
  }

  /** Redraw from a `/api/v1/traces/{id}` answer; nothing changes in the DOM when the trace did not. */
  update(trace) {
    const signature = JSON.stringify([
      (trace.requests ?? []).map((r) => [r.request_id, r.end_s]),
      (trace.spans ?? []).map((s) => [s.span_id, s.end_unix_nano, s.status_code]),
      (trace.logs ?? []).length,
    ]);
    if (signature === this.signature) return;
    this.signature = signature;
    this.trace = trace;
    this.lay = layout(trace);
    this.draw();
    this.drawLogs();
    if (this.pinned && !this.lay.rows.some((r) => r.key === this.pinned)) this.pinned = null;
    if (this.pinned) this.pin(this.pinned);
  }

  draw() {
    const { rows, services, selfByService, t0, t1 } = this.lay;
    const span = t1 - t0;
    const pct = (t) => `${(100 * (t - t0)) / span}%`;
    const bar = (start, end) => ({ left: pct(start), width: `${(100 * (end - start)) / span}%` });
    const step = tickStep(span);
    const ticks = [];
    for (let t = 0; t <= span + step * 1e-9; t += step) ticks.push(t);
    const axisTrack = h('div', { class: 'wf-track' }, ticks.map((t, i) => h('span', {
      class: `wf-tick${i === 0 ? ' first' : ''}${t > span - step / 2 && i > 0 ? ' last' : ''}`, style: { left: pct(t0 + t) } }, seconds(t / 1000))));
    const grid = h('div', { class: 'wf-grid' }, ticks.map((t) => h('i', { style: { left: pct(t0 + t) } })));
    const nSpans = rows.filter((r) => r.kind === 'span').length;
    this.wf.replaceChildren(grid,
      h('div', { class: 'wf-axis' }, h('div', { class: 'wf-name muted' }, `time since ${clockMs(t0)}`), axisTrack, h('div', { class: 'wf-dur muted' }, 'duration')),
      ...rows.map((row) => (row.kind === 'proxy' ? this.proxyRow(row, bar) : this.spanRow(row, bar))));
    Object.assign(this.wf.dataset, { traceId: this.trace.trace_id ?? '', points: String(rows.length), spans: String(nSpans), proxy: String(rows.length - nSpans), logs: String(this.trace.logs?.length ?? 0) });
    const selfText = [...selfByService.entries()].sort((a, b) => b[1] - a[1]).map(([svc, ms]) => `${svc} ${seconds(ms / 1000)}`).join(', ');
    this.meta.replaceChildren(
      h('span', { class: 'mono' }, this.trace.trace_id ?? ''), ` · starts ${clockMs(t0)}, lasts ${seconds(span / 1000)} · `,
      `${rows.length - nSpans} proxied request(s), ${nSpans} span(s)`,
      services.length ? ` from ${services.join(', ')} · self time by service: ${selfText}` : '');
    this.note.hidden = nSpans > 0;
    this.note.replaceChildren('No OpenTelemetry spans have arrived for this trace. The proxy passes the W3C ',
      h('code', {}, 'traceparent'), ' header on to the upstream (and creates one when the client sends none), so spans show up here nested by parent once your client, gateway or inference server exports OpenTelemetry traces in that context to tokenwatch\'s OTLP port (gRPC 4317, or HTTP 4318 ',
      h('code', {}, '/v1/traces'), ', by default). Trace id: ', h('span', { class: 'mono' }, this.trace.trace_id ?? ''), '.');
  }

  proxyRow(row, bar) {
    const { r } = row;
    const end = r.end_s;
    const marks = [['wait', 0, r.upstream_headers_s ?? (r.first_token_s ?? end)], ['prefill', r.upstream_headers_s, r.first_token_s], ['stream', r.first_token_s, end]];
    if (r.first_token_s == null) marks[2] = ['stream', r.upstream_headers_s, end];
    const failed = Boolean(r.error_class) || r.status >= 400;
    const segments = marks.filter(([, a, b]) => typeof a === 'number' && typeof b === 'number' && b > a)
      .map(([k, a, b]) => h('span', { style: { width: `${(100 * (b - a)) / (end || 1)}%`, background: PHASES.find((p) => p[0] === k)[2] } }));
    const mine = r.request_id === this.focus;
    const name = [h('span', { class: 'chip' }, 'proxy'), ' ',
      mine ? h('strong', {}, r.model_id) : h('a', { href: `#/requests/${encodeURIComponent(r.request_id)}` }, r.model_id),
      h('span', { class: 'muted' }, mine && this.lay.rows.length > 1 ? ' (this request)' : ` ${r.endpoint}`)];
    return h('div', { class: `wf-row proxy${failed ? ' err' : ''}`, dataset: { key: row.key }, title: `${r.endpoint} ${r.model_id} ${r.status}${r.error_class ? ` ${r.error_class}` : ''}: first token ${seconds(r.first_token_s)}, end ${seconds(end)}` },
      h('div', { class: 'wf-name' }, name),
      h('div', { class: 'wf-track' }, h('div', { class: `wf-bar segmented${failed ? ' err' : ''}`, style: bar(row.start, row.end) }, segments)),
      h('div', { class: 'wf-dur' }, seconds(end)));
  }

  spanRow(row, bar) {
    const { s } = row;
    const failed = s.status_code === 2;
    return h('div', { class: `wf-row${failed ? ' err' : ''}`, dataset: { key: row.key, spanId: s.span_id, status: STATUS[s.status_code] ?? String(s.status_code) },
      title: `${s.service_name || '(no service)'} · ${s.name}: ${seconds((s.end - s.start) / 1000)}${failed ? ` — error${s.status_message ? `: ${s.status_message}` : ''}` : ''}` },
    h('div', { class: 'wf-name', style: { paddingLeft: `${8 + 16 * Math.min(row.depth, 20)}px` } },
      h('i', { class: 'wf-svc', style: { background: row.color } }),
      s.record && s.record.request_id === this.focus ? h('strong', {}, s.name || '(unnamed span)') : s.name || '(unnamed span)',
      h('span', { class: 'muted' }, ` ${s.service_name}`),
      s.record ? h('span', { class: 'chip', title: 'tokenwatch made a request record from this GenAI span' }, 'gen_ai') : null),
    h('div', { class: 'wf-track' }, h('div', { class: `wf-bar${failed ? ' err' : ''}`, style: { ...bar(s.start, s.end), background: failed ? null : row.color } })),
    h('div', { class: 'wf-dur' }, seconds((s.end - s.start) / 1000), s.children.length ? h('span', { class: 'muted' }, ` · self ${seconds(s.self / 1000)}`) : null));
  }

  pin(key) {
    this.pinned = key;
    for (const r of this.wf.querySelectorAll('.wf-row')) r.classList.toggle('sel', r.dataset.key === key);
    if (key) this.show(key);
  }

  show(key) {
    const row = this.lay?.rows.find((r) => r.key === key);
    if (!row) return;
    const t0 = this.lay.t0;
    const at = (ms) => `${clockMs(ms)} (+${seconds((ms - t0) / 1000)})`;
    let title;
    let pairs;
    if (row.kind === 'proxy') {
      const { r } = row;
      title = `Proxied request ${r.request_id}`;
      pairs = [
        ['request', h('a', { href: `#/requests/${encodeURIComponent(r.request_id)}`, class: 'mono' }, r.request_id)],
        ['model', h('a', { href: modelHref(r.model_id) }, r.model_id)],
        ['runtime / instance', `${r.runtime} / ${r.instance}`],
        ['tenant · A/B group · prompt version', [r.tenant, r.ab_group, r.prompt_version].map((v) => v || DASH).join(' · ')],
        ['status', `${r.status}${r.error_class ? ` ${r.error_class}` : ''}${r.finish_reason ? ` (${r.finish_reason})` : ''}`],
        ['arrival', at(r.arrival_unix_ms)],
        ['upstream headers', seconds(r.upstream_headers_s)],
        ['first token', seconds(r.first_token_s)],
        ['end', seconds(r.end_s)],
        ['queue (reported)', seconds(r.queue_s)],
        ['tokens in / out', `${num(r.prompt_tokens, 0)} / ${num(r.output_tokens, 0)}`],
        ['chunks', String(r.chunk_offsets_us?.length ?? 0)],
      ];
    } else {
      const { s } = row;
      const parent = s.parent_span_id ? this.lay.byId.get(s.parent_span_id) : null;
      title = `Span ${s.name}`;
      pairs = [
        ['service', s.service_name || DASH],
        ['kind', KIND[s.kind] ?? String(s.kind)],
        ['span id', h('span', { class: 'mono' }, s.span_id)],
        ['parent', s.parent_span_id ? h('span', {}, h('span', { class: 'mono' }, s.parent_span_id), parent ? ` (${parent.name})` : ' (not received)') : 'none (root span)'],
        ['start', at(s.start)],
        ['duration', seconds((s.end - s.start) / 1000)],
        ['self time', seconds(s.self / 1000)],
        ['status', `${STATUS[s.status_code] ?? s.status_code}${s.status_message ? `: ${s.status_message}` : ''}`],
        ['events', String(s.events_count ?? 0)],
        s.record ? ['GenAI request record', h('a', { href: `#/requests/${encodeURIComponent(s.record.request_id)}` },
          `${s.record.model_id} · ${num(s.record.prompt_tokens, 0)} / ${num(s.record.output_tokens, 0)} tokens in / out`)] : null,
        ...Object.entries(s.attributes ?? {}).sort(([a], [b]) => a.localeCompare(b))
          .map(([k, v]) => [h('span', { class: 'mono' }, k), typeof v === 'string' ? v : JSON.stringify(v)]),
      ].filter(Boolean);
    }
    this.details.replaceChildren(h('h3', {}, title, this.pinned ? h('span', { class: 'muted' }, ' (pinned; click again to release)') : null), kvTable(pairs));
  }

  drawLogs() {
    const logs = [...(this.trace.logs ?? [])].sort((a, b) => a.time_unix_nano - b.time_unix_nano);
    const { byId, t0 } = this.lay;
    this.logsTable.hidden = logs.length === 0;
    this.logsEmpty.hidden = logs.length > 0;
    this.logsHead.textContent = logs.length > LOG_SHOWN ? `Logs of this trace (first ${LOG_SHOWN} of ${logs.length})` : 'Logs of this trace';
    this.logs.replaceChildren(...logs.slice(0, LOG_SHOWN).map((l) => {
      const ms = l.time_unix_nano / 1e6;
      const span = byId.get(l.span_id);
      const tr = h('tr', { class: `${(l.severity_number ?? 0) >= 17 ? 'err' : ''}${span ? ' clickable' : ''}`, title: l.attributes_json && l.attributes_json !== '{}' ? l.attributes_json : null },
        h('td', {}, clockMs(ms)), h('td', { class: 'n' }, `${ms >= t0 ? '+' : '−'}${seconds(Math.abs(ms - t0) / 1000)}`),
        h('td', {}, severityName(l)), h('td', {}, l.service_name || DASH),
        h('td', {}, span ? span.name : l.span_id ? h('span', { class: 'mono' }, l.span_id) : DASH),
        h('td', { class: 'wrap mono' }, l.body));
      if (span) tr.addEventListener('click', () => this.pin(`span:${span.span_id}`));
      return tr;
    }));
  }

  destroy() {
    this.el.remove();
  }
}
