// Words for alerts, shared by the fleet banner and the alert pages: title, sentence, likely
// cause, and the active alerts grouped by model (worst first).

import { ratio } from '../format.js';

export const SEV_RANK = { critical: 0, warning: 1, info: 2 };

export function alertTitle(a) {
  const where = [a.labels?.instance, a.labels?.device_id, a.labels?.tenant].filter(Boolean).join(' · ');
  return `${a.rule.replaceAll('_', ' ')}${where ? ` (${where})` : ''}`;
}

export function alertSentence(a) {
  const an = a.annotations ?? {};
  return an.detector_summary || a.last_event?.summary || an.description || an.summary || '';
}

/** The top-ranked root cause as one line, or an inhibition note; null when there is none. */
export function causeText(a) {
  const c = a.root_cause?.[0];
  if (c) return `${c.path.join(' → ')} (confidence ${ratio(c.confidence)}, rank ${c.rank.toFixed(2)})`;
  if (a.annotations?.inhibited_by) return `see ${a.annotations.inhibited_by}`;
  return null;
}

function since(a) {
  return a.fired_at_unix_ms ?? a.active_at_unix_ms;
}

/**
 * Pending and firing alerts grouped by model_id: [{model, worst, alerts}] worst group first.
 * Within a group the alert others blame (first of a root-cause path) leads, then firing before
 * pending, then severity, then the oldest.
 */
export function activeByModel(alerts) {
  const groups = new Map();
  for (const a of alerts) {
    if (a.state === 'resolved') continue;
    const m = a.labels?.model_id ?? '';
    if (!groups.has(m)) groups.set(m, []);
    groups.get(m).push(a);
  }
  const blamed = new Set(alerts.map((a) => a.root_cause?.[0]?.path?.[0]).filter(Boolean));
  const isCause = (a) => (blamed.has(a.rule) || blamed.has(a.last_event?.detector) ? 0 : 1);
  const order = (a, b) =>
    (a.state === 'firing' ? 0 : 1) - (b.state === 'firing' ? 0 : 1) || isCause(a) - isCause(b) ||
    SEV_RANK[a.severity] - SEV_RANK[b.severity] || since(a) - since(b);
  return [...groups.entries()]
    .map(([model, list]) => {
      list.sort(order);
      return { model, worst: list[0].severity, alerts: list };
    })
    .sort((x, y) => order(x.alerts[0], y.alerts[0]));
}
