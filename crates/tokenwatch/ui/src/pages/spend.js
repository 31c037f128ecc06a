// Spend (#/spend?range=24h): what the stored requests cost at the price table (`pricing`), from
// /api/v1/spend — the total, then one table by model and one by tenant (the tenant header or the
// API key's hash), each with its requests and the unpriced ones the table leaves out — and the
// spend budgets (`budgets:`, /api/v1/budgets): spent of the amount, and when it runs out.

import { getJSON } from '../api.js';
import { h, setText, modelHref } from '../dom.js';
import { DASH, duration, num } from '../format.js';

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
  const budgetBody = h('tbody');
  const budgets = h('table', { class: 'grid budgets', id: 'budget-table', hidden: true },
    h('thead', {}, h('tr', {}, ['budget', 'for', 'period', 'spent', 'left', 'burn rate', 'runs out in'].map((c) => h('th', {}, c)))),
    budgetBody);
  const noBudget = h('p', { class: 'muted', hidden: true }, 'No budget is configured (budgets: []).');
  st = { range, total, byModel, byTenant, budgets, budgetBody, noBudget, last: 0 };
  el.append(h('div', { class: 'page-head' }, h('h1', {}, 'Spend'), picker),
    h('p', { class: 'muted' }, 'What the stored requests cost at the configured price table (pricing). Unpriced: requests of models the table leaves out, counted at no cost. Reaches back as far as raw records are kept.'),
    total,
    h('section', { class: 'panel' }, h('h2', {}, 'By model'), byModel.el),
    h('section', { class: 'panel' }, h('h2', {}, 'By tenant'), byTenant.el),
    h('section', { class: 'panel' }, h('h2', {}, 'Budgets (this period)'), budgets, noBudget));
}

/** Spent of the amount as a bar: empty = untouched, full = spent (red). */
function spentBar(b) {
  const share = b.amount_usd > 0 ? b.spent_usd / b.amount_usd : 1;
  const level = share >= 1 ? 'spent' : share > 0.75 ? 'low' : share > 0.5 ? 'mid' : 'ok';
  return h('div', { class: 'budget', title: `${usd(b.spent_usd)} of ${usd(b.amount_usd)} spent since ${b.period_start}` },
    h('div', { class: `budget-bar budget-${level}`, style: { width: `${(Math.min(1, share) * 100).toFixed(1)}%` } }),
    h('span', { class: 'budget-text' }, `${usd(b.spent_usd)} / ${usd(b.amount_usd)}`));
}

function budgetRow(b) {
  const scope = [b.model && `model ${b.model}`, b.tenant && `tenant ${b.tenant}`].filter(Boolean).join(', ') || 'all';
  const runsOut = b.spent ? 'spent' : isNum(b.time_to_exhaustion_s) ? duration(b.time_to_exhaustion_s) : 'not burning';
  return h('tr', { dataset: { budget: b.name, spent: String(b.spent_usd) } },
    h('td', {}, b.name),
    h('td', {}, scope),
    h('td', {}, b.period),
    h('td', {}, spentBar(b)),
    h('td', { class: 'n' }, usd(b.remaining_usd)),
    h('td', { class: 'n', title: `${usd(b.burn_usd_per_hour)}/h over the last ${duration(b.burn_window_s)}` }, isNum(b.burn_rate) ? `${num(b.burn_rate, 1)}×` : DASH),
    h('td', {}, runsOut));
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
  const [models, tenants, budgets] = await Promise.all([
    getJSON('/api/v1/spend', { by: 'model', since }, ctx.signal),
    getJSON('/api/v1/spend', { by: 'tenant', since }, ctx.signal),
    getJSON('/api/v1/budgets', {}, ctx.signal),
  ]);
  if (ctx.signal.aborted || !st) return;
  st.last = Date.now();
  const unpriced = models?.unpriced_requests ?? 0;
  setText(st.total, `${usd(models?.cost_usd)} over ${models?.requests ?? 0} requests in the last ${st.range}`
    + (unpriced ? ` (${unpriced} unpriced)` : ''));
  st.total.dataset.cost = String(models?.cost_usd ?? '');
  st.byModel.body.replaceChildren(...rows(models?.groups ?? [], 'model'));
  st.byTenant.body.replaceChildren(...rows(tenants?.groups ?? [], 'tenant'));
  const list = budgets?.budgets ?? [];
  st.budgetBody.replaceChildren(...list.map(budgetRow));
  st.budgets.hidden = list.length === 0;
  st.noBudget.hidden = list.length > 0;
}

export default { name: 'spend', nav: 'spend', title: 'Spend', mount, refresh, unmount: () => { st = null; } };
