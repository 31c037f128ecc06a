// Alerts list (#/alerts): active (pending, firing) and recently resolved alerts with severity,
// state, since when and their sentence; a row opens the alert (#/alerts/ID).

import { getJSON } from '../api.js';
import { h, badge, stateBadge, modelHref } from '../dom.js';
import { timeOfDay, ago, duration } from '../format.js';
import { SEV_RANK, alertTitle, alertSentence, causeText } from './alert_text.js';

let st = null;

function mount(el) {
  const active = h('tbody');
  const resolved = h('tbody');
  const head = () => h('thead', {}, h('tr', {},
    ['severity', 'state', 'alert', 'model', 'since', 'for', 'what happened'].map((c) => h('th', {}, c))));
  const activeTable = h('table', { class: 'grid alerts', id: 'active-alerts' }, head(), active);
  const resolvedTable = h('table', { class: 'grid alerts', id: 'resolved-alerts' }, head(), resolved);
  st = {
    active,
    resolved,
    activeTable,
    resolvedTable,
    activeEmpty: h('p', { class: 'muted' }, 'Nothing is pending or firing.'),
    resolvedEmpty: h('p', { class: 'muted' }, 'No alert resolved recently.'),
  };
  el.append(
    h('div', { class: 'page-head' }, h('h1', {}, 'Alerts')),
    h('h2', {}, 'Active'), activeTable, st.activeEmpty,
    h('h2', {}, 'Resolved'), resolvedTable, st.resolvedEmpty);
}

function row(a, now) {
  const start = a.active_at_unix_ms;
  const end = a.resolved_at_unix_ms ?? now;
  const href = `#/alerts/${encodeURIComponent(a.id)}`;
  const cause = causeText(a);
  const tr = h('tr', { class: `clickable sev-row-${a.state === 'resolved' ? 'none' : a.severity}`, dataset: { alertId: a.id, rule: a.rule, state: a.state, model: a.labels?.model_id ?? '', activeAt: a.active_at_unix_ms } },
    h('td', {}, badge(a.severity)),
    h('td', {}, stateBadge(a.state)),
    h('td', {}, h('a', { href }, alertTitle(a)), a.grade ? h('span', { class: 'muted' }, ` ${a.grade}`) : null),
    h('td', {}, a.labels?.model_id ? h('a', { href: modelHref(a.labels.model_id) }, a.labels.model_id) : '–'),
    h('td', { title: ago(start, now) }, timeOfDay(start)),
    h('td', {}, duration((end - start) / 1000)),
    h('td', { class: 'wrap' }, alertSentence(a), cause ? h('div', { class: 'cause' }, 'likely cause: ', cause) : null));
  tr.addEventListener('click', (e) => {
    if (!e.target.closest('a')) location.hash = href;
  });
  return tr;
}

async function refresh(ctx) {
  const body = await getJSON('/api/v1/alerts', {}, ctx.signal);
  if (ctx.signal.aborted) return;
  const now = Date.now();
  const all = body?.alerts ?? [];
  const active = all.filter((a) => a.state !== 'resolved')
    .sort((a, b) => SEV_RANK[a.severity] - SEV_RANK[b.severity] || a.active_at_unix_ms - b.active_at_unix_ms);
  const resolved = all.filter((a) => a.state === 'resolved')
    .sort((a, b) => (b.resolved_at_unix_ms ?? 0) - (a.resolved_at_unix_ms ?? 0));
  st.active.replaceChildren(...active.map((a) => row(a, now)));
  st.resolved.replaceChildren(...resolved.map((a) => row(a, now)));
  st.activeEmpty.hidden = active.length > 0;
  st.resolvedEmpty.hidden = resolved.length > 0;
  st.activeTable.hidden = active.length === 0;
  st.resolvedTable.hidden = resolved.length === 0;
}

export default { name: 'alerts', nav: 'alerts', title: 'Alerts', mount, refresh, unmount: () => { st = null; } };
