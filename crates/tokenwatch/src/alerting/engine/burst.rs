// The error-burst rule (fast burn) per model and per (model, instance): serving-side failures of
// a short window against the SLO budget and the usual error rate (own baseline, and peers').

use super::eval::{EvalCtx, labels};
use super::inputs::{Inputs, Rec};
use super::latency::SeriesState;
use crate::alerting::rules::RuleSpec;
use std::collections::{BTreeMap, BTreeSet};
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_detect as det;

/// (failed, total) of records.
fn count<'a>(recs: impl Iterator<Item = &'a &'a Rec>) -> (u64, u64) {
    recs.fold((0, 0), |(b, n), r| (b + u64::from(r.server_failure), n + 1))
}

/// The short window of one series: the rule's window, grown (up to `max_ms`) until it holds
/// `min_requests`. `times` are the series' record times, newest first.
fn short_window(times: &[i64], now: i64, window: i64, max_ms: i64, min_requests: u64) -> i64 {
    let min = min_requests.max(1) as usize;
    let within = times.iter().take_while(|t| now - **t < window).count();
    if within >= min || times.len() < min {
        return window;
    }
    (now - times[min - 1] + 1).clamp(window, max_ms.max(window))
}

/// The series' usual error ratio over `(from, to]`, anomaly episodes left out; None with
/// fewer than `min_requests`.
fn usual(
    st: &SeriesState,
    model: &str,
    inputs: &Inputs,
    instance: Option<&str>,
    (from, to): (i64, i64),
    min_requests: u64,
) -> Option<f64> {
    let covered = st.coverage(model);
    let (bad, total) = inputs
        .window(model, from, to)
        .filter(|r| instance.is_none_or(|i| r.instance == i))
        .filter(|r| !covered(&r.instance, r.at_ms))
        .fold((0, 0), |(b, n), r| (b + u64::from(r.server_failure), n + 1));
    (total >= min_requests.max(1)).then(|| bad as f64 / total as f64)
}

/// `error_burst`: an instance bursts when its errors are improbable against its own usual rate
/// and its peers' rate in the same window; the model on its other instances.
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
    let mut out = Vec::new();
    for m in cx.inputs.models() {
        // The short windows' records, newest first (the reference period is counted apart).
        let mut recent: Vec<&Rec> = cx.inputs.window(&m, now - max_w, now).collect();
        recent.sort_by_key(|r| std::cmp::Reverse(r.at_ms));
        let mut times: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
        for r in &recent {
            times.entry(r.instance.as_str()).or_default().push(r.at_ms);
        }
        let instances: Vec<String> = times
            .keys()
            .filter(|i| !i.is_empty())
            .map(|i| i.to_string())
            .collect();
        let mut flagged = BTreeSet::new();
        if instances.len() >= 2 {
            for i in &instances {
                let win = short_window(&times[i.as_str()], now, w, max_w, p.min_requests);
                let in_win = |r: &&&Rec| now - r.at_ms < win;
                let (bad, total) = count(recent.iter().filter(in_win).filter(|r| r.instance == *i));
                let peers = count(recent.iter().filter(in_win).filter(|r| r.instance != *i));
                let own = observe(
                    st,
                    &m,
                    i,
                    cx.inputs,
                    (now - win - span, now - win),
                    p,
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
                flagged.insert(i.clone());
            }
        }
        let model_times: Vec<i64> = recent
            .iter()
            .filter(|r| !flagged.contains(r.instance.as_str()))
            .map(|r| r.at_ms)
            .collect();
        let win = short_window(&model_times, now, w, max_w, p.min_requests);
        let (bad, total) = count(
            recent
                .iter()
                .filter(|r| now - r.at_ms < win && !flagged.contains(r.instance.as_str())),
        );
        let own = observe(
            st,
            &m,
            "",
            cx.inputs,
            (now - win - span, now - win),
            p,
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
/// over its reference period.
#[allow(clippy::too_many_arguments)] // the series key, its records and the period
fn observe(
    st: &mut SeriesState,
    model: &str,
    instance: &str,
    inputs: &Inputs,
    period: (i64, i64),
    p: &det::ErrorBurstParams,
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
    let who = (!instance.is_empty()).then_some(instance);
    let r = usual(st, model, inputs, who, period, p.min_requests);
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
