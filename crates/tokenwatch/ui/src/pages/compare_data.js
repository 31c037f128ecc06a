// Data for the A/B comparison: groups of one model along a dimension, from the latency API's
// sketches (`by=`), or for prompt versions (no sketch label) from the stored request records.

import { getJSON } from '../api.js';

export const METRICS = [['ttft', 'TTFT'], ['itl', 'ITL'], ['e2e', 'E2E']];
/** Dimensions the latency API groups by; prompt_version is computed from request records. */
export const SKETCH_DIMS = new Set(['ab_group', 'model_version', 'tenant', 'instance']);
export const RECORDS_LIMIT = 10_000;
/** Detectors whose alerts the comparison shows. */
export const EXPERIMENT_DETECTORS = new Set(['ab_regression', 'prompt_version_decay']);

const isNum = (v) => typeof v === 'number' && Number.isFinite(v);

/** Groups sorted by value (unset last): [{value, count, ttft, itl, e2e}], summaries {count, p50, p99}. */
function sorted(groups) {
  const collator = new Intl.Collator(undefined, { numeric: true });
  return groups.sort((a, b) => (a.value === '') - (b.value === '') || collator.compare(a.value, b.value));
}

/**
 * The three latency metrics grouped by `by` from `/api/v1/latency`, merged per group value. For
 * a model no record holds the API answers from the runtime's own histograms (`source: runtime`,
 * by instance only): the list's `runtime` is then true, and each summary has its `bucket_bounds`.
 */
export async function sketchGroups(model, by, win, signal) {
  const bodies = await Promise.all(METRICS.map(([m]) => getJSON('/api/v1/latency', { model, metric: m, window: win, by }, signal)));
  const runtime = bodies.some((b) => b?.source === 'runtime');
  const groups = new Map();
  bodies.forEach((body, i) => {
    for (const g of body?.groups ?? []) {
      const value = g.labels?.[by] ?? '';
      if (!groups.has(value)) groups.set(value, { value, count: 0 });
      groups.get(value)[METRICS[i][0]] = g.summary;
    }
  });
  for (const g of groups.values()) {
    // Every finished request has an end-to-end latency: that count is the group's requests.
    g.count = g.e2e?.count ?? Math.max(g.ttft?.count ?? 0, g.itl?.count ?? 0);
  }
  const out = sorted([...groups.values()]);
  out.runtime = runtime;
  return out;
}

/** Nearest-rank percentiles of a list of seconds. */
function summary(values) {
  const a = Float64Array.from(values).sort();
  const q = (p) => (a.length ? a[Math.max(0, Math.ceil(p * a.length) - 1)] : null);
  return { count: a.length, p50: q(0.5), p90: q(0.9), p99: q(0.99) };
}

/**
 * Groups by a record field from request records: TTFT = first token, ITL = every gap between
 * consecutive content chunks, E2E = end; plus the success ratio the prompt-decay detector watches.
 */
export function recordGroups(records, field) {
  const per = new Map();
  for (const r of records) {
    const value = r[field] ?? '';
    let g = per.get(value);
    if (!g) per.set(value, (g = { ttft: [], itl: [], e2e: [], n: 0, ok: 0 }));
    g.n += 1;
    if (!r.error_class && r.status < 400) g.ok += 1;
    if (isNum(r.first_token_s)) g.ttft.push(r.first_token_s);
    if (isNum(r.end_s)) g.e2e.push(r.end_s);
    const o = r.chunk_offsets_us ?? [];
    for (let i = 1; i < o.length; i++) g.itl.push((o[i] - o[i - 1]) / 1e6);
  }
  return sorted([...per].map(([value, g]) => ({
    value, count: g.n, okRatio: g.ok / g.n, ttft: summary(g.ttft), itl: summary(g.itl), e2e: summary(g.e2e),
  })));
}

/** The model's records that arrived in the last `windowMs` before `nowMs` (server time), newest first. */
export async function windowRecords(model, nowMs, windowMs, signal) {
  const since = new Date(nowMs - windowMs).toISOString();
  const body = await getJSON('/api/v1/requests', { model, since, limit: RECORDS_LIMIT }, signal);
  return body?.requests ?? [];
}

/** Relative change of `v` against `base` (null when either is missing or the base is 0). */
export function relChange(v, base) {
  return isNum(v) && isNum(base) && base > 0 ? v / base - 1 : null;
}

/** A/B-regression and prompt-version-decay alerts: active first, then the newest. */
export function experimentAlerts(alerts) {
  return (alerts ?? [])
    .filter((a) => EXPERIMENT_DETECTORS.has(a.last_event?.detector) || EXPERIMENT_DETECTORS.has(a.rule))
    .sort((a, b) => (a.state === 'resolved') - (b.state === 'resolved') || b.active_at_unix_ms - a.active_at_unix_ms);
}

/** The group value an active alert blames, for the dimension shown (B arm, prompt version). */
export function blamedGroup(a, by) {
  if (a.state === 'resolved') return null;
  if (by === 'prompt_version') return a.labels?.prompt_version ?? null;
  if (by === 'ab_group' && (a.last_event?.detector ?? a.rule) === 'ab_regression') return a.last_event?.evidence?.arm_b ?? null;
  return null;
}
