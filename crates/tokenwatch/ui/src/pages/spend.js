// Spend (#/spend?range=24h): what the stored requests cost at the price table (`pricing`), from
// /api/v1/spend — the total, then one table by model and one by tenant (the tenant header or the
// API key's hash), each with its requests and the unpriced ones the table leaves out.

import { getJSON } from '../api.js';
import { h, setText, modelHref } from '../dom.js';
import { DASH } from '../format.js';

/** Ranges offered, in milliseconds back from now. */
const RANGES = { '1h': 3_600_000, '24h': 86_400_000, '7d': 7 * 86_400_000, '30d': 30 * 86_400_000 };

/** Spend is polled less often than the live pages: it sums stored records. */
const EVERY_MS = 10_000;

let st = null;

const isNum = (v) => typeof v === 'number' && Number.isFinite(v);

/** US dollars to the cent; under a cent with more digits, so small spend is not shown as 0. */
export function usd(v) {
  if (!isNum(v)) return DASH;
  if (v !== 0 && Math.abs(v) < 0.01) return `$${v.toPrecision(2)}`;
  return `$${v.toLocaleString('en-US', { minimumFractionDigits: 2, maximumFractionDigits: 2 })}`;
}

function table(id, key) {
  const body = h('tbody');
  const el = h('table', { class: 'grid spend', id },
    h('thead', {}, h('tr', {}, [key, 'spend', 'requests', 'unpriced'].map((c) => h('th', {}, c)))),
    body);
  return { el, body };
}

function mount(el, ctx) {
  const range = RANGES[ctx.params.get('range')] ? ctx.params.get('range') : '24h';
  const picker = h('div', { class: 'picker' }, 'range ',
    Object.keys(RANGES).map((r) => h('button', { class: r === range ? 'on' : '', onclick: () => ctx.setParams({ range: r }) }, r)));
  const total = h('p', { id: 'spend-total' });
  const byModel = table('spend-by-model', 'model');
  const byTenant = table('spend-by-tenant', 'tenant');
  st = { range, total, byModel, byTenant, last: 0 };
  el.append(h('div', { class: 'page-head' }, h('h1', {}, 'Spend'), picker),
    h('p', { class: 'muted' }, 'What the stored requests cost at the configured price table (pricing). Unpriced: requests of models the table leaves out, counted at no cost. Reaches back as far as raw records are kept.'),
    total,
    h('section', { class: 'panel' }, h('h2', {}, 'By model'), byModel.el),
    h('section', { class: 'panel' }, h('h2', {}, 'By tenant'), byTenant.el));
}

function rows(groups, key) {
  return groups.map((g) => h('tr', { dataset: { [key]: g[key], cost: String(g.cost_usd) } },
    h('td', {}, key === 'model' ? h('a', { href: modelHref(g.model) }, g.model) : g.tenant || DASH),
    h('td', { class: 'n' }, usd(g.cost_usd)),
    h('td', { class: 'n' }, String(g.requests)),
    h('td', { class: 'n' }, g.unpriced_requests ? String(g.unpriced_requests) : DASH)));
}

async function refresh(ctx) {
  if (!st || Date.now() - st.last < EVERY_MS) return;
  const since = new Date(Date.now() - RANGES[st.range]).toISOString();
  const [models, tenants] = await Promise.all([
    getJSON('/api/v1/spend', { by: 'model', since }, ctx.signal),
    getJSON('/api/v1/spend', { by: 'tenant', since }, ctx.signal),
  ]);
  if (ctx.signal.aborted || !st) return;
  st.last = Date.now();
  const unpriced = models?.unpriced_requests ?? 0;
  setText(st.total, `${usd(models?.cost_usd)} over ${models?.requests ?? 0} requests in the last ${st.range}`
    + (unpriced ? ` (${unpriced} unpriced)` : ''));
  st.total.dataset.cost = String(models?.cost_usd ?? '');
  st.byModel.body.replaceChildren(...rows(models?.groups ?? [], 'model'));
  st.byTenant.body.replaceChildren(...rows(tenants?.groups ?? [], 'tenant'));
}

export default { name: 'spend', nav: 'spend', title: 'Spend', mount, refresh, unmount: () => { st = null; } };
