// A/B comparison (#/compare?model=&by=ab_group&window=5m&base=): one model's groups along a
// dimension side by side — TTFT, ITL, E2E P50/P99, traffic share, each group's P99 change vs the
// baseline group (over +5 % is the spec's A/B threshold) — and its A/B and prompt-decay alerts.

import { getJSON } from '../api.js';
import { h, setText, badge, stateBadge } from '../dom.js';
import { seconds, ratio, change, num, timeOfDay, evidenceValue } from '../format.js';
import { PALETTE, SEVERITY_COLOR } from '../charts.js';
import { BarChart } from '../bars.js';
import { alertTitle, alertSentence } from './alert_text.js';
import { METRICS, SKETCH_DIMS, RECORDS_LIMIT, sketchGroups, recordGroups, windowRecords, relChange, experimentAlerts, blamedGroup } from './compare_data.js';

const DIMS = [['ab_group', 'A/B group'], ['prompt_version', 'prompt version'], ['model_version', 'model version'], ['tenant', 'tenant'], ['instance', 'instance']];
const WINDOWS = { '1m': 60_000, '5m': 300_000, '1h': 3_600_000 };
/** The spec's A/B regression threshold: B's P99 more than 5 % above A's. */
const THRESHOLD = 0.05;
/** Fewer requests than the detectors need per window: the group's P99 is close to its maximum. */
const MIN_SAMPLES = 20;
/** Records mode downloads every record of the window: not on every 2 s poll. */
const RECORDS_EVERY_MS = 10_000;
const EVIDENCE_KEYS = ['arm_a', 'arm_b', 'p99_a_s', 'p99_b_s', 'p99_change', 'share_b', 'target_share_b', 'baseline', 'current', 'drop'];

/** Group colours: the palette without its red, which marks a regression here. */
const COLORS = PALETTE.filter((c) => c !== SEVERITY_COLOR.critical);

let st = null;

const UNSET = '(not set)';
const groupName = (v) => (v === '' ? UNSET : v);

function mount(el, ctx) {
  const p = ctx.params;
  const by = DIMS.some(([d]) => d === p.get('by')) ? p.get('by') : 'ab_group';
  const win = WINDOWS[p.get('window')] ? p.get('window') : '5m';
  const picker = h('div', { class: 'picker' }, 'window ',
    Object.keys(WINDOWS).map((w) => h('button', { class: w === win ? 'on' : '', onclick: () => ctx.setParams({ window: w }) }, w)));
  const model = h('select', { name: 'model', onchange: () => ctx.setParams({ model: model.value, base: '' }) });
  const dim = h('select', { name: 'by', onchange: () => ctx.setParams({ by: dim.value, base: '' }) },
    DIMS.map(([d, label]) => h('option', { value: d }, label)));
  dim.value = by;
  const base = h('select', { name: 'base', onchange: () => ctx.setParams({ base: base.value }) });
  const field = (label, input) => h('label', {}, h('span', {}, label), input);
  const records = !SKETCH_DIMS.has(by);
  const cols = [['group', ''], ['requests', 'n'], ['share', 'n'], ...(records ? [['success', 'n']] : []),
    ...METRICS.flatMap(([, m]) => [[`${m} P50`, 'n'], [`${m} P99`, 'n'], [`${m} P99 vs base`, 'n']])];
  const tbody = h('tbody');
  const charts = h('div', { class: 'cols3' });
  const lead = h('p', { class: 'lead', id: 'compare-lead' });
  const alertsEl = h('div', { id: 'compare-alerts' });
  const source = h('p', { class: 'muted small', id: 'compare-source' });
  el.append(
    h('div', { class: 'page-head' }, h('h1', {}, 'A/B comparison'), picker),
    h('form', { class: 'filters', id: 'compare-form', onsubmit: (e) => e.preventDefault() },
      field('model', model), field('compare by', dim), field('baseline group', base)),
    lead,
    alertsEl,
    h('div', { class: 'scroll' }, h('table', { class: 'grid compare', id: 'compare-table' },
      h('thead', {}, h('tr', {}, cols.map(([c, cls]) => h('th', { class: cls }, c)))), tbody)),
    source,
    h('h2', {}, 'P99 per group'),
    charts);
  st = {
    by, win, records, wantModel: p.get('model') ?? '', wantBase: p.get('base'), model: null, models: [],
    modelSel: model, baseSel: base, runtimeModels: new Set(), tbody, rows: new Map(), groups: [], recordsAt: 0, recordsCapped: false, fleetAt: 0,
    lead, alertsEl, source,
    charts: Object.fromEntries(METRICS.map(([m, label]) => [m, new BarChart(charts, { id: `p99-${m}`, title: `${label} P99`, unit: 'seconds' })])),
  };
}

function fillSelect(sel, values, want) {
  const key = values.join('\n');
  if (sel.dataset.key !== key) {
    sel.dataset.key = key;
    sel.replaceChildren(...values.map((v) => h('option', { value: v }, v)));
  }
  if (sel.value !== want) sel.value = want;
}

function rowFor(value, color) {
  let row = st.rows.get(value);
  if (row) return row;
  const cells = {};
  const td = (k) => (cells[k] = h('td', { class: 'n' }));
  const tags = h('span');
  const tr = h('tr', { dataset: { group: value } },
    h('td', {}, h('i', { class: 'swatch', style: { background: color } }), h('strong', {}, groupName(value)), tags),
    td('count'), td('share'), st.records ? td('ok') : null,
    METRICS.flatMap(([m]) => [td(`${m}50`), td(`${m}99`), td(`${m}d`)]));
  row = { tr, cells, tags, tagKey: null };
  st.rows.set(value, row);
  return row;
}

function renderTable(groups, baseline, total, blamed) {
  const seen = new Set();
  groups.forEach((g, i) => {
    const row = rowFor(g.value, COLORS[i % COLORS.length]);
    seen.add(g.value);
    if (st.tbody.children[i] !== row.tr) st.tbody.insertBefore(row.tr, st.tbody.children[i] ?? null);
    const c = row.cells;
    setText(c.count, num(g.count, 0));
    setText(c.share, ratio(total ? g.count / total : null));
    if (c.ok) setText(c.ok, ratio(g.okRatio));
    const isBase = g === baseline;
    let worse = false;
    for (const [m] of METRICS) {
      setText(c[`${m}50`], seconds(g[m]?.p50));
      setText(c[`${m}99`], seconds(g[m]?.p99));
      const d = isBase ? null : relChange(g[m]?.p99, baseline?.[m]?.p99);
      setText(c[`${m}d`], isBase ? 'baseline' : change(d));
      const cls = `n ${d > THRESHOLD ? 'worse' : d < -THRESHOLD ? 'better' : ''}`.trim();
      if (c[`${m}d`].className !== cls) c[`${m}d`].className = cls;
      worse ||= d > THRESHOLD;
    }
    const few = g.count < MIN_SAMPLES;
    const tagKey = `${isBase}|${few}|${blamed.has(g.value)}`;
    if (row.tagKey !== tagKey) {
      row.tagKey = tagKey;
      row.tags.replaceChildren(...[isBase ? h('span', { class: 'chip' }, 'baseline') : null,
        few ? h('span', { class: 'chip', title: `fewer than ${MIN_SAMPLES} requests: its P99 is about its maximum` }, 'few samples') : null,
        blamed.has(g.value) ? badge('warning', 'alert') : null].filter(Boolean));
    }
    const cls = blamed.has(g.value) ? 'hurt sev-row-warning' : worse ? 'hurt' : '';
    if (row.tr.className !== cls) row.tr.className = cls;
    Object.assign(row.tr.dataset, { count: String(g.count), share: String(total ? g.count / total : 0) });
  });
  for (const [value, row] of st.rows) {
    if (!seen.has(value)) {
      row.tr.remove();
      st.rows.delete(value);
    }
  }
}

function renderLead(groups, baseline) {
  const dim = DIMS.find(([d]) => d === st.by)[1];
  if (groups.length < 2) {
    const only = groups.length ? `only ${dim} ${groupName(groups[0].value)}` : `no request`;
    // Seen by the runtime's scrapes alone: its histograms carry no A/B, version or tenant label.
    const hint = st.runtimeModels.has(st.model) && st.by !== 'instance'
      ? `Only the runtime's own metrics see ${st.model} (no proxy or OTLP record): they carry no ${dim}, so compare by instance.`
      : 'The proxy labels requests from the headers it is configured with (x-ab-group, x-prompt-version and x-model-version by default).';
    setText(st.lead, `${st.model}: ${only} in the last ${st.win} — nothing to compare. ${hint}`);
    return;
  }
  const findings = [];
  for (const g of groups) {
    if (g === baseline) continue;
    for (const [m, label] of METRICS) {
      const d = relChange(g[m]?.p99, baseline[m]?.p99);
      if (d > THRESHOLD) findings.push(`${groupName(g.value)}'s ${label} P99 is ${change(d)} (${seconds(baseline[m].p99)} → ${seconds(g[m].p99)})${g.count < MIN_SAMPLES ? ' on few samples' : ''}`);
    }
  }
  setText(st.lead, findings.length
    ? `${st.model} over the last ${st.win}, against ${dim} ${groupName(baseline.value)}: ${findings.join('; ')}.`
    : `${st.model} over the last ${st.win}: no ${dim}'s P99 is more than 5 % above ${groupName(baseline.value)}'s.`);
}

function renderAlerts(alerts) {
  if (!alerts.length) {
    st.alertsEl.replaceChildren(h('div', { class: 'banner healthy' }, `No A/B-regression or prompt-version-decay alert for ${st.model}. `,
      h('span', { class: 'muted' }, 'ab_regression fires when arm B\'s P99 is more than 5 % above arm A\'s (or the split drifts over ±3 points off its target); prompt_version_decay when a prompt version\'s success ratio falls more than 8 % below its own baseline for 3 periods.')));
    return;
  }
  const active = alerts.filter((a) => a.state !== 'resolved');
  st.alertsEl.replaceChildren(h('div', { class: `banner ${active.length ? `hurt sev-${active[0].severity}` : ''}` }, alerts.map((a) => {
    const ev = a.last_event?.evidence ?? {};
    const chips = EVIDENCE_KEYS.filter((k) => ev[k] !== undefined).map((k) => h('span', { class: 'chip' }, `${k}: ${k.endsWith('change') ? change(ev[k]) : evidenceValue(k, ev[k])}`));
    const when = a.state === 'resolved' ? `resolved ${timeOfDay(a.resolved_at_unix_ms)}` : `since ${timeOfDay(a.fired_at_unix_ms ?? a.active_at_unix_ms)}`;
    return h('div', { class: 'incident', dataset: { alertId: a.id, rule: a.rule, state: a.state } },
      h('div', {}, badge(a.severity), ' ', stateBadge(a.state), ' ', h('a', { href: `#/alerts/${encodeURIComponent(a.id)}` }, alertTitle(a)),
        a.labels?.prompt_version ? ` · prompt version ${a.labels.prompt_version}` : '', ` · ${when}`),
      h('div', { class: 'sentence' }, alertSentence(a)), chips.length ? h('div', {}, chips) : null);
  })));
}

function renderCharts(groups, baseline) {
  for (const [m] of METRICS) {
    const base = baseline?.[m]?.p99;
    st.charts[m].setData(groups.map((g, i) => ({
      label: groupName(g.value), value: g[m]?.p99 ?? null, color: COLORS[i % COLORS.length],
      hot: g !== baseline && relChange(g[m]?.p99, base) > THRESHOLD,
    })), groups.length > 1 && base ? { value: base * (1 + THRESHOLD), label: `${groupName(baseline.value)} + 5 %` } : null);
  }
}

async function loadGroups(ctx) {
  if (!st.records) return sketchGroups(st.model, st.by, st.win, ctx.signal);
  if (Date.now() - st.recordsAt < RECORDS_EVERY_MS) return st.groups;
  const fleet = await getJSON('/api/v1/fleet', { window: '1m' }, ctx.signal);
  const records = await windowRecords(st.model, fleet?.generated_at_unix_ms ?? Date.now(), WINDOWS[st.win], ctx.signal);
  st.recordsAt = Date.now();
  st.recordsCapped = records.length >= RECORDS_LIMIT;
  return recordGroups(records, st.by);
}

async function refresh(ctx) {
  if (!st.models.length || Date.now() - st.fleetAt > 30_000) {
    const fleet = await getJSON('/api/v1/fleet', { window: st.win }, ctx.signal);
    if (ctx.signal.aborted) return;
    st.fleetAt = Date.now();
    st.models = (fleet?.models ?? []).map((m) => m.model_id).sort();
    st.runtimeModels = new Set((fleet?.models ?? []).filter((m) => m.figure_source === 'runtime').map((m) => m.model_id));
  }
  st.model = st.wantModel || st.models[0] || null;
  const models = st.model && !st.models.includes(st.model) ? [...st.models, st.model] : st.models;
  fillSelect(st.modelSel, models, st.model ?? '');
  if (!st.model) {
    setText(st.lead, 'No model has been seen yet: send traffic through the proxy, or configure scrape targets / OTLP.');
    return;
  }
  const [groups, alertBody] = await Promise.all([loadGroups(ctx), getJSON('/api/v1/alerts', { model: st.model }, ctx.signal)]);
  if (ctx.signal.aborted) return;
  st.groups = groups;
  // The hash names the unset group by its display name (an empty parameter is dropped).
  const baseline = groups.find((g) => groupName(g.value) === st.wantBase) ?? groups[0] ?? null;
  fillSelect(st.baseSel, groups.map((g) => groupName(g.value)), baseline ? groupName(baseline.value) : '');
  const total = groups.reduce((s, g) => s + g.count, 0);
  const alerts = experimentAlerts(alertBody?.alerts);
  const blamed = new Set(alerts.map((a) => blamedGroup(a, st.by)).filter((v) => v !== null));
  renderTable(groups, baseline, total, blamed);
  renderLead(groups, baseline);
  renderAlerts(alerts);
  renderCharts(groups, baseline);
  setText(st.source, groups.runtime
    ? `From the runtime's own histograms over the last ${st.win}: no proxy or OTLP record of ${st.model}, so tokenwatch's scrapes of its /metrics answer (by instance only). Each percentile is interpolated inside the histogram bucket it falls in, which bounds its error (the latency API's bucket_bounds); a P99 in the +Inf bucket shows the largest finite bound. Requests = the runtime's end-to-end observations.`
    : st.records
    ? `Computed in your browser from the ${st.recordsCapped ? `newest ${RECORDS_LIMIT}` : 'stored'} request records of the window (prompt versions have no latency sketch), refreshed every ${RECORDS_EVERY_MS / 1000} s; nearest-rank percentiles, ITL = every gap between content chunks. Success = requests without an error, what prompt_version_decay watches.`
    : `From tokenwatch's latency sketches over the last ${st.win} (relative error 1 %), refreshed live. Share = the group's requests / all requests of ${st.model}. P99 changes over +5 % against the baseline are red (the A/B regression threshold); groups with fewer than ${MIN_SAMPLES} requests have a P99 close to their maximum.`);
}

function unmount() {
  for (const c of Object.values(st?.charts ?? {})) c.destroy();
  st = null;
}

export default { name: 'compare', nav: 'compare', title: 'A/B comparison', mount, refresh, unmount };
