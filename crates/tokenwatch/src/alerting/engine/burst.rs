// The error-burst rule (fast burn) per model and per (model, instance): serving-side failures of
// a short window against the SLO budget and the usual error rate (own baseline, and peers').

use super::eval::{EvalCtx, labels};
use super::latency::SeriesState;
use super::record::Label;
use super::windows::Outcomes;
use crate::alerting::rules::RuleSpec;
use std::collections::BTreeSet;
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_detect as det;

/// (failed, total) of the records of `lines` (instances) in `(from, to]`.
fn count_lines<'a>(
    o: &Outcomes,
    lines: impl Iterator<Item = &'a Label>,
    range: (i64, i64),
) -> (u64, u64) {
    lines
        .map(|l| o.count(l, range))
        .fold((0, 0), |(b, n), (lb, ln)| (b + lb, n + ln))
}

/// The short window of a series (the records of `lines`): the rule's window, grown (up to
/// `max_ms`) until it holds `min_requests` of the series' records in `(now - max_ms, now]`.
fn short_window(
    o: &Outcomes,
    lines: &[&Label],
    now: i64,
    window: i64,
    max_ms: i64,
    min_requests: u64,
) -> i64 {
    let min = min_requests.max(1);
    // Records in `(from, now]`.
    let n = |from: i64| -> u64 { count_lines(o, lines.iter().copied(), (from, now)).1 };
    let reach = now - max_ms;
    if n(now - window.min(max_ms)) >= min || n(reach) < min {
        return window;
    }
    // The time of the `min`-th newest record: the latest `t` with `min` records in `[t, now]`.
    let (mut lo, mut hi) = (reach + 1, now);
    while lo < hi {
        let mid = lo + (hi - lo + 1) / 2;
        if n(mid - 1) >= min {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    (now - lo + 1).clamp(window, max_ms.max(window))
}

/// The series' usual error ratio over `(from, to]` (the records of `instance`, or of all with
/// None), anomaly episodes left out, read at the period's own thinning level; None with fewer
/// than `min_requests`.
fn usual(
    st: &SeriesState,
    model: &str,
    o: &Outcomes,
    instance: Option<&str>,
    period: (i64, i64),
    min_requests: u64,
) -> Option<f64> {
    let covered = st.coverage(model);
    let o = o.reading_from(period.0);
    let (mut bad, mut total) = (0u64, 0u64);
    for i in o
        .instances()
        .filter(|i| instance.is_none_or(|x| x == i.as_str()))
    {
        let uncovered = |failed: bool| {
            o.times(i, failed, period)
                .filter(|t| !covered(i, *t))
                .count() as u64
        };
        bad += uncovered(true);
        total += uncovered(false);
    }
    (total >= min_requests.max(1)).then(|| bad as f64 / total as f64)
}

/// `error_burst`: an instance bursts when its errors are improbable against its own usual rate
/// and its peers' rate in the same window; the model on its other instances. The records are
/// counted on the incremental per-instance mirrors (`LatencyWindows::sync_outcomes`), by binary
/// search on their times.
pub fn error_burst(
    rule: &RuleSpec,
    p: &det::ErrorBurstParams,
    st: &mut SeriesState,
    cx: &EvalCtx,
) -> Vec<AnomalyEvent> {
    let now = cx.now;
    let w = rule.window_ms;
    let max_w = ((p.max_window_s * 1000.0) as i64).max(w);
    let span = (p.baseline_s * 1000.0) as i64;
    let max_hold = (p.max_hold_s * 1000.0) as i64;
    // The reference period is long: its rate is recounted once per max window fraction.
    let refresh = (max_w / super::latency::BASELINE_REFRESH_DIVISOR).max(100);
    // The longest short window and the reference period before it.
    let reach = max_w.saturating_add(span.max(0));
    let mut out = Vec::new();
    let mut lw = cx.latency_windows();
    for m in cx.inputs.models() {
        // A model listed keeps records: its mirrors are synced at `now` with this reach.
        let o = match lw.sync_outcomes(cx.inputs, &m, reach, now) {
            true => lw.outcomes(&m, now, now.saturating_sub(reach)),
            false => None,
        };
        let Some(all) = o else { continue };
        // The short windows are read at the level of the longest (`Outcomes::reading_from`).
        let o = all.reading_from(now - max_w);
        let recent = (now - max_w, now);
        // The instances with records in the short windows' reach ("" among them).
        let lines: Vec<&Label> = o.instances().filter(|i| o.count(i, recent).1 > 0).collect();
        let instances: Vec<&Label> = lines.iter().copied().filter(|i| !i.is_empty()).collect();
        let mut flagged = BTreeSet::new();
        if instances.len() >= 2 {
            for i in instances {
                let win = short_window(&o, &[i], now, w, max_w, p.min_requests);
                let range = (now - win, now);
                let (bad, total) = o.count(i, range);
                let peers = count_lines(&o, lines.iter().copied().filter(|j| *j != i), range);
                let period = (now - win - span, now - win);
                let own = observe(
                    st,
                    (&m, i),
                    |st| usual(st, &m, &all, Some(i.as_str()), period, p.min_requests),
                    (max_hold, refresh),
                    now,
                );
                let f = det::error_burst(bad, total, win as f64 / 1000.0, own, p);
                track(st, &m, i, f.is_some(), own, (win, max_w), now);
                let peer_rate =
                    (peers.1 >= p.min_requests.max(1)).then(|| peers.0 as f64 / peers.1 as f64);
                let reference = match (own, peer_rate) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    (a, b) => a.or(b),
                };
                let Some(f) =
                    f.and_then(|_| det::error_burst(bad, total, win as f64 / 1000.0, reference, p))
                else {
                    continue;
                };
                let mut f = f.with(
                    "peer_error_ratio",
                    peer_rate.map_or(serde_json::Value::Null, Into::into),
                );
                f.summary = format!("instance {i}: {}", f.summary);
                out.push(f.into_event(
                    &rule.detector,
                    "success_ratio",
                    labels(&[("model_id", &m), ("instance", i)]),
                    now,
                ));
                flagged.insert(i);
            }
        }
        let rest: Vec<&Label> = lines
            .iter()
            .copied()
            .filter(|i| !flagged.contains(i))
            .collect();
        let win = short_window(&o, &rest, now, w, max_w, p.min_requests);
        let (bad, total) = count_lines(&o, rest.iter().copied(), (now - win, now));
        let period = (now - win - span, now - win);
        let own = observe(
            st,
            (&m, ""),
            |st| usual(st, &m, &all, None, period, p.min_requests),
            (max_hold, refresh),
            now,
        );
        let f = det::error_burst(bad, total, win as f64 / 1000.0, own, p);
        track(st, &m, "", f.is_some(), own, (win, max_w), now);
        if let Some(f) = f {
            out.push(f.into_event(
                &rule.detector,
                "success_ratio",
                labels(&[("model_id", &m)]),
                now,
            ));
        }
    }
    st.prune(now - max_w - span);
    out
}

/// The usual error ratio of a series: frozen at the onset of its ongoing burst, else measured
/// (`usual`) over its reference period.
fn observe(
    st: &mut SeriesState,
    (model, instance): (&str, &str),
    usual: impl FnOnce(&SeriesState) -> Option<f64>,
    (max_hold, refresh_ms): (i64, i64),
    now: i64,
) -> Option<f64> {
    let s = st.get(model, instance);
    if s.episodes.expire(now, max_hold) {
        s.frozen_rate = None;
    }
    if let Some(r) = s.frozen_rate {
        return r;
    }
    if let Some((t, r)) = s.cached_rate
        && now - t < refresh_ms
    {
        return r;
    }
    let r = usual(st);
    st.get(model, instance).cached_rate = Some((now, r));
    r
}

/// Record the burst condition of a series: an episode opening freezes its usual rate.
/// An episode covers the short window that showed it and closes after `release` without a burst.
fn track(
    st: &mut SeriesState,
    model: &str,
    instance: &str,
    holds: bool,
    rate: Option<f64>,
    (pad, release): (i64, i64),
    now: i64,
) {
    let s = st.get(model, instance);
    match s.episodes.observe(holds, now, pad, release) {
        det::EpisodeStep::Opened => s.frozen_rate = Some(rate),
        det::EpisodeStep::Closed => {
            s.frozen_rate = None;
            s.cached_rate = None;
        }
        _ => {}
    }
}

#[cfg(test)]
#[path = "burst_tests.rs"]
mod tests;
