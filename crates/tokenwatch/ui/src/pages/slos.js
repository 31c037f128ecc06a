// SLOs (#/slos): every SLO series from /api/v1/slos — objective, target, SLI over the budget
// window, the error budget left as a bar, the burn rate per window and its burn alerts.

import { getJSON } from '../api.js';
import { h, setText, stateBadge, modelHref } from '../dom.js';
import { ratio, num, DASH } from '../format.js';

/** A share as a percentage with up to two decimals (99.5 %, 96.5 %, 100 %). */
const pct = (v) => (isNum(v) ? `${Number((v * 100).toFixed(2))} %` : DASH);

let st = null;

const isNum = (v) => typeof v === 'number' && Number.isFinite(v);

function mount(el) {
  const body = h('tbody');
  const table = h('table', { class: 'grid slos', id: 'slo-table', hidden: true },
    h('thead', {}, h('tr', {},
      ['SLO', 'model', 'tenant', 'objective', 'target', 'SLI', 'error budget left', 'burn rate (fast · slow)', 'alert'].map((c) => h('th', {}, c)))),
    body);
  const note = h('p', { class: 'muted', id: 'slo-note' });
  st = { body, table, note, empty: h('p', { class: 'muted', hidden: true }, 'No SLO is configured (slos: []).') };
  el.append(h('div', { class: 'page-head' }, h('h1', {}, 'SLOs')), note, h('section', { class: 'panel', id: 'slo-panel' }, table, st.empty));
}

function objectiveText(s) {
  const t = isNum(s.threshold_ms) ? `${num(s.threshold_ms, 0)} ms` : '';
  switch (s.objective) {
    case 'ttft_p95': return `TTFT ≤ ${t}`;
    case 'itl_p99': return `ITL ≤ ${t}`;
    case 'success': return 'request succeeds';
    case 'guardrail_rate': return 'not guardrail-flagged';
    default: return s.objective;
  }
}

/** The budget left as a bar: full = untouched, empty = spent; overspent shows empty in red. */
function budgetBar(s) {
  const left = s.budget_remaining;
  if (!isNum(left)) return h('span', { class: 'muted', title: s.note ?? '' }, s.status === 'no_data' ? 'no data' : DASH);
  const pct = Math.max(0, Math.min(1, left)) * 100;
  const level = left <= 0 ? 'spent' : left < 0.25 ? 'low' : left < 0.5 ? 'mid' : 'ok';
  return h('div', { class: 'budget', title: `${ratio(left)} of the ${ratio(s.error_budget)} error budget left (${s.bad} bad of ${s.total} over ${s.window})` },
    h('div', { class: `budget-bar budget-${level}`, style: { width: `${pct.toFixed(1)}%` } }),
    h('span', { class: 'budget-text' }, ratio(left)));
}

function burnText(s) {
  const pair = (name) => (s.burn ?? []).filter((w) => w.pair === name)
    .map((w) => `${w.window} ${isNum(w.burn_rate) ? `${num(w.burn_rate, 1)}×` : DASH}`).join(' / ');
  return `${pair('fast')} · ${pair('slow')}`;
}

function row(s) {
  const model = s.labels?.model_id;
  const alert = s.alerts?.[0];
  return h('tr', { dataset: { slo: s.slo, model: model ?? '', tenant: s.labels?.tenant ?? '', status: s.status, alertState: s.alert_state, budget: isNum(s.budget_remaining) ? String(s.budget_remaining) : '' } },
    h('td', {}, s.slo),
    h('td', {}, model ? h('a', { href: modelHref(model) }, model) : (s.by ?? []).includes('model') ? DASH : 'all'),
    h('td', {}, s.labels?.tenant ?? ((s.by ?? []).includes('tenant') ? DASH : 'all')),
    h('td', {}, objectiveText(s)),
    h('td', { class: 'n' }, pct(s.target)),
    h('td', { class: 'n' }, pct(s.sli)),
    h('td', {}, budgetBar(s)),
    h('td', { class: 'mono' }, burnText(s)),
    h('td', {}, alert ? h('a', { href: `#/alerts/${encodeURIComponent(alert.id)}` }, stateBadge(alert.state), ` ${alert.rule}`) : stateBadge(s.alert_state)));
}

async function refresh(ctx) {
  const body = await getJSON('/api/v1/slos', {}, ctx.signal);
  if (ctx.signal.aborted || !st) return;
  const rows = body?.slos ?? [];
  setText(st.note, body?.computed
    ? `Request-based SLIs over each SLO's window; burn rate 1 spends the budget in exactly the window (pages at 14.4× over the fast pair, tickets at 6× over the slow pair by default).`
    : (body?.note ?? 'SLOs are not computed.'));
  st.body.replaceChildren(...rows.map(row));
  st.table.hidden = rows.length === 0;
  st.empty.hidden = rows.length > 0 || !body?.computed;
}

export default { name: 'slos', nav: 'slos', title: 'SLOs', mount, refresh, unmount: () => { st = null; } };
