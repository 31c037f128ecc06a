// Requests explorer (#/requests?model=&tenant=&status=&min_e2e_s=&annotated=): filters kept in the
// hash, the newest matching records in a table with their per-request anomalies (annotations such
// as an output length outlier, badged by joint grade); a row opens its token timeline (#/requests/ID).

import { getJSON } from '../api.js';
import { h, setText, modelHref, badge } from '../dom.js';
import { seconds, timeOfDay, num } from '../format.js';

const FILTERS = ['model', 'tenant', 'status', 'min_e2e_s', 'annotated'];
/** Joint grade → badge colour: both anomalies → high, one → medium. */
const GRADE_SEVERITY = { high: 'critical', medium: 'warning', normal: 'info' };
const LIMIT = 100;

let st = null;

function field(label, input) {
  return h('label', {}, h('span', {}, label), input);
}

function mount(el, ctx) {
  const p = ctx.params;
  const model = h('select', { name: 'model' }, h('option', { value: '' }, 'all models'));
  const tenant = h('input', { name: 'tenant', value: p.get('tenant') ?? '', placeholder: 'any tenant', list: 'tenants', size: 22 });
  const status = h('select', { name: 'status' },
    [['', 'any status'], ['ok', 'ok'], ['error', 'any error'],
      ...['upstream_5xx', 'upstream_4xx', 'upstream_timeout', 'upstream_connect', 'upstream_reset', 'malformed_sse', 'client_cancelled', 'no_route', 'bad_request'].map((c) => [c, c])]
      .map(([v, t]) => h('option', { value: v }, t)));
  status.value = p.get('status') ?? '';
  const minE2e = h('input', { name: 'min_e2e_s', type: 'number', min: '0', step: '0.1', value: p.get('min_e2e_s') ?? '', placeholder: 'seconds', size: 8 });
  const annotated = h('input', { name: 'annotated', type: 'checkbox', checked: p.get('annotated') === 'true' });
  const form = h('form', { class: 'filters', id: 'request-filters' },
    field('model', model), field('tenant', tenant), field('status', status), field('end-to-end ≥ (s)', minE2e),
    field('anomalies only', annotated),
    h('button', { type: 'submit' }, 'apply'),
    h('button', { type: 'button', onclick: () => ctx.setParams(Object.fromEntries(FILTERS.map((f) => [f, '']))) }, 'clear'));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    ctx.setParams({ model: model.value, tenant: tenant.value.trim(), status: status.value, min_e2e_s: minE2e.value, annotated: annotated.checked ? 'true' : '' });
  });
  const tbody = h('tbody');
  // Rows do not move under the pointer: live refresh holds while it is over the table, so a
  // click always lands on the row that was aimed at.
  tbody.addEventListener('pointerenter', () => { if (st) st.hold = true; });
  tbody.addEventListener('pointerleave', () => { if (st) st.hold = false; });
  const count = h('span', { class: 'muted' });
  el.append(
    h('div', { class: 'page-head' }, h('h1', {}, 'Requests'), count),
    form, h('datalist', { id: 'tenants' }),
    h('table', { class: 'grid requests', id: 'requests-table' },
      h('thead', {}, h('tr', {}, ['arrival', 'request', 'model', 'tenant', 'status', 'anomaly', 'TTFT', 'end-to-end', 'tokens in / out', 'chunks', 'max gap']
        .map((c, i) => h('th', { class: i >= 6 ? 'n' : '' }, c)))),
      tbody));
  st = { model, tbody, count, hold: false, shown: '', wantModel: p.get('model') ?? '', models: new Set(), tenants: new Set() };
}

function statusText(r) {
  if (r.error_class) return `${r.status} ${r.error_class}`;
  return String(r.status);
}

/** The strongest grade among a record's annotations (high > medium > normal), or ''. */
function worstGrade(notes) {
  for (const g of ['high', 'medium', 'normal']) if (notes.some((a) => a.joint_grade === g)) return g;
  return '';
}

/** One badge per annotation: what it is and how far off (e.g. "length 4.1σ"), the sentence as title. */
export function annotationBadges(notes) {
  return notes.map((a) => {
    const sigmas = a.evidence?.deviation_sigmas;
    const what = a.detector === 'output_length_outlier' ? 'length' : a.detector;
    const text = typeof sigmas === 'number' ? `${what} ${sigmas.toFixed(1)}σ ${a.joint_grade}` : `${what} ${a.joint_grade}`;
    const b = badge(GRADE_SEVERITY[a.joint_grade] ?? 'info', text);
    b.title = a.summary;
    b.classList.add('annotation');
    return b;
  });
}

function rowFor(r) {
  const href = `#/requests/${encodeURIComponent(r.request_id)}`;
  const notes = r.annotations ?? [];
  const tr = h('tr', { class: `clickable ${r.error_class ? 'err' : ''}`, dataset: { requestId: r.request_id, model: r.model_id, tenant: r.tenant, status: r.status, e2e: r.end_s, chunks: r.chunk_offsets_us?.length ?? 0, annotations: notes.length, grade: worstGrade(notes) } },
    h('td', {}, timeOfDay(r.arrival_unix_ms)),
    h('td', { class: 'mono' }, h('a', { href }, r.request_id.length > 18 ? `${r.request_id.slice(0, 16)}…` : r.request_id)),
    h('td', {}, h('a', { href: modelHref(r.model_id) }, r.model_id)),
    h('td', { class: 'mono' }, r.tenant || '–'),
    h('td', {}, statusText(r)),
    h('td', { class: 'anomaly' }, notes.length ? annotationBadges(notes) : '–'),
    h('td', { class: 'n' }, seconds(r.first_token_s)),
    h('td', { class: 'n' }, seconds(r.end_s)),
    h('td', { class: 'n' }, `${num(r.prompt_tokens, 0)} / ${num(r.output_tokens, 0)}`),
    h('td', { class: 'n' }, r.chunk_offsets_us?.length ?? 0),
    h('td', { class: 'n' }, seconds(r.gaps?.max_s)));
  tr.addEventListener('click', (e) => {
    if (!e.target.closest('a')) location.hash = href;
  });
  return tr;
}

function updateOptions(records, fleetModels) {
  let changed = false;
  for (const m of [...fleetModels, ...records.map((r) => r.model_id)]) {
    if (m && !st.models.has(m)) {
      st.models.add(m);
      changed = true;
    }
  }
  if (changed || st.model.options.length === 1) {
    const want = st.model.value || st.wantModel;
    st.model.replaceChildren(h('option', { value: '' }, 'all models'),
      ...[...st.models].sort().map((m) => h('option', { value: m }, m)));
    if (want && !st.models.has(want)) st.model.append(h('option', { value: want }, want));
    st.model.value = want;
  }
  const list = document.getElementById('tenants');
  for (const r of records) {
    if (r.tenant && !st.tenants.has(r.tenant) && st.tenants.size < 200) {
      st.tenants.add(r.tenant);
      list?.append(h('option', { value: r.tenant }));
    }
  }
}

async function refresh(ctx) {
  const q = { limit: LIMIT };
  for (const f of FILTERS) q[f] = ctx.params.get(f) ?? '';
  const [body, fleet] = await Promise.all([
    getJSON('/api/v1/requests', q, ctx.signal),
    st.models.size ? null : getJSON('/api/v1/fleet', {}, ctx.signal),
  ]);
  if (ctx.signal.aborted) return;
  const records = body?.requests ?? [];
  updateOptions(records, (fleet?.models ?? []).map((m) => m.model_id));
  const key = JSON.stringify(q);
  if (st.hold && st.shown === key && st.tbody.childElementCount > 0) {
    setText(st.count, 'live updates held while the pointer is on the table');
    return;
  }
  st.shown = key;
  st.tbody.replaceChildren(...records.map(rowFor));
  setText(st.count, `${records.length === LIMIT ? `newest ${LIMIT}` : records.length} matching, live`);
}

export default { name: 'requests', nav: 'requests', title: 'Requests', mount, refresh, unmount: () => { st = null; } };
