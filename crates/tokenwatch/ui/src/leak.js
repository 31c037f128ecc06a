// The GPU-memory-leak detector's trend, drawn over memory charts: from a fired leak alert's
// evidence: the fitted line (fit_bytes_at_window_start rising growth_bytes_per_s from
// window_start_unix_ms), or, from older alerts without it, the slope through the last sample.

/** Leak alerts that fired for this series (labels model_id, instance, device_id), newest first. */
export function leakTrends(alerts, { model, instance, device }) {
  const out = [];
  for (const a of alerts ?? []) {
    const ev = a.last_event?.evidence;
    if (a.fired_at_unix_ms == null || !ev || a.last_event?.detector !== 'gpu_memory_leak') continue;
    const l = a.labels ?? {};
    if ((l.model_id ?? '') !== model || (l.instance ?? '') !== (instance ?? '') || (l.device_id ?? '') !== (device ?? '')) continue;
    const { growth_bytes_per_s: growth, used_bytes: used, window_start_unix_ms: start, window_end_unix_ms: end } = ev;
    if (![growth, used, start, end].every((x) => typeof x === 'number' && Number.isFinite(x))) continue;
    const fitStart = ev.fit_bytes_at_window_start;
    const exact = typeof fitStart === 'number' && Number.isFinite(fitStart);
    out.push({
      alertId: a.id,
      growth,
      anchorT: exact ? start / 1000 : end / 1000,
      anchorV: exact ? fitStart : used,
      startT: start / 1000,
      total: typeof ev.total_bytes === 'number' && ev.total_bytes > 0 ? ev.total_bytes : null,
      tteS: ev.time_to_exhaustion_s ?? null,
      resolvedT: a.resolved_at_unix_ms == null ? null : a.resolved_at_unix_ms / 1000,
    });
  }
  return out.sort((x, y) => y.anchorT - x.anchorT);
}

/**
 * The trend line at each time of `t` (null outside the fitted span, extended forward to the end
 * of the chart while the alert is active): v = anchor + growth × (t − anchor time), capped at the total.
 */
export function trendValues(trend, t) {
  const until = trend.resolvedT ?? Infinity;
  return t.map((x) => {
    if (x < trend.startT || x > until) return null;
    const v = trend.anchorV + trend.growth * (x - trend.anchorT);
    return trend.total ? Math.min(v, trend.total) : v;
  });
}
