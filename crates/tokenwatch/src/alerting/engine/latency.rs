// The latency rules (spike, absolute, context-aware) per model and per (model, instance): an
// instance alerts, named, when its tail is out of line with its own baseline or limit AND with
// its peers; the model alerts on the traffic of its other instances. Owns their series state.

use super::eval::{EvalCtx, labels};
use super::inputs;
use super::record::LatencySample;
use super::windows::{LatencyWindows, Slot};
use crate::alerting::rules::RuleSpec;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_core::signals::names;
use tokenwatch_detect as det;

/// A cached reference period is recomputed after this fraction of the rule's window (it spans
/// several windows, so a slightly stale one changes nothing but the cost).
pub(super) const BASELINE_REFRESH_DIVISOR: i64 = 12;

/// One series' state: anomaly episodes (left out of its baseline), the baseline frozen at the
/// onset of the ongoing episode, and a cached baseline.
#[derive(Default)]
pub(super) struct Series {
    pub episodes: det::Episodes,
    pub frozen: Option<Vec<f64>>,
    pub frozen_rate: Option<Option<f64>>,
    cached: Option<(i64, Vec<f64>)>,
    /// Error burst: the usual error ratio and when it was counted.
    pub cached_rate: Option<(i64, Option<f64>)>,
}

/// Per-rule state of the latency and error-burst rules, keyed by (model, instance); the model
/// itself is the instance "".
#[derive(Default)]
pub struct SeriesState {
    pub(super) series: HashMap<(String, String), Series>,
}

impl SeriesState {
    pub(super) fn get(&mut self, model: &str, instance: &str) -> &mut Series {
        self.series
            .entry((model.to_string(), instance.to_string()))
            .or_default()
    }

    /// Whether a record of `model` (its instance, its time) lies in an anomaly episode of its
    /// instance or of its model.
    pub(super) fn coverage(&self, model: &str) -> impl Fn(&str, i64) -> bool + '_ {
        let eps: Vec<(&str, &det::Episodes)> = self
            .series
            .iter()
            .filter(|((m, _), _)| m == model)
            .map(|((_, i), s)| (i.as_str(), &s.episodes))
            .collect();
        move |instance: &str, at_ms: i64| {
            eps.iter()
                .any(|(i, e)| (i.is_empty() || *i == instance) && e.covers(at_ms))
        }
    }

    /// Forget closed episodes older than `before`, and series with nothing left.
    pub(super) fn prune(&mut self, before: i64) {
        self.series.retain(|_, s| {
            let idle = s.episodes.prune(before) && s.frozen.is_none() && s.frozen_rate.is_none();
            let seen = s
                .cached
                .as_ref()
                .map(|(t, _)| *t)
                .max(s.cached_rate.map(|(t, _)| t));
            !idle || seen.is_some_and(|t| t >= before)
        });
    }
}

/// The event signal of a latency rule: `ttft_p99_seconds`, `itl_p99_seconds`, …
pub(crate) fn latency_signal_name(metric: &str) -> String {
    match metric {
        "itl" => "itl_p99_seconds".into(),
        m => names::latency_signal(m, "p99"),
    }
}

/// Sorted values of `rule.signal` of the successful records of each instance known in
/// `(from, to]`.
fn by_instance<'a>(
    recs: &[LatencySample<'a>],
    signal: &str,
    from: i64,
    to: i64,
) -> BTreeMap<&'a str, Vec<f64>> {
    let mut out: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for r in recs
        .iter()
        .filter(|r| r.ok() && r.at_ms() > from && r.at_ms() <= to)
    {
        if let Some(v) = r.value(signal) {
            out.entry(r.instance()).or_default().push(v);
        }
    }
    for v in out.values_mut() {
        v.sort_by(f64::total_cmp);
    }
    out
}

/// Longest stretch of an instance's window, in windows. The minimum-sample rule scaled to an
/// instance's rate: a low-rate instance (a quarter of its model's traffic, less while the pool
/// routes around it because it is slow) is judged on the shortest stretch of 1..=this many
/// windows holding `min_samples` of its requests, rather than not at all.
pub(crate) const MAX_STRETCH_WINDOWS: i64 = 3;

/// Each instance's values over the shortest stretch (whole windows, ending now) holding
/// `min_samples`, sorted, with the stretch's length in ms.
fn scaled_by_instance<'a>(
    recs: &[LatencySample<'a>],
    signal: &str,
    now: i64,
    w: i64,
    min_samples: u64,
) -> (BTreeMap<&'a str, Vec<f64>>, BTreeMap<&'a str, i64>) {
    let mut timed: BTreeMap<&str, Vec<(i64, f64)>> = BTreeMap::new();
    for r in recs.iter().filter(|r| r.ok() && r.at_ms() <= now) {
        if let Some(v) = r.value(signal) {
            timed.entry(r.instance()).or_default().push((r.at_ms(), v));
        }
    }
    let (mut values, mut spans) = (BTreeMap::new(), BTreeMap::new());
    for (i, pts) in timed {
        let span = (1..=MAX_STRETCH_WINDOWS)
            .map(|k| k * w)
            .find(|span| pts.iter().filter(|(t, _)| *t > now - span).count() as u64 >= min_samples)
            .unwrap_or(MAX_STRETCH_WINDOWS * w);
        let mut v: Vec<f64> = pts
            .iter()
            .filter(|(t, _)| *t > now - span)
            .map(|(_, v)| *v)
            .collect();
        if v.is_empty() {
            continue;
        }
        v.sort_by(f64::total_cmp);
        values.insert(i, v);
        spans.insert(i, span);
    }
    (values, spans)
}

/// Sorted values per instance.
type ByInstance = BTreeMap<String, Vec<f64>>;

fn owned(m: BTreeMap<&str, Vec<f64>>) -> ByInstance {
    m.into_iter().map(|(i, v)| (i.to_string(), v)).collect()
}

/// The windows a rule reads of one model's `signal` at `now`: each instance's current window,
/// its stretched one (with its length) and, from `short_from`, its short one; and, read
/// incrementally, the model's current and short windows whole.
struct Views {
    cur: ByInstance,
    scaled: ByInstance,
    spans: BTreeMap<String, i64>,
    short: ByInstance,
    cur_all: Option<Vec<f64>>,
    short_all: Option<Vec<f64>>,
}

/// What a rule asks of a model's windows.
struct Ask<'a> {
    model: &'a str,
    signal: &'a str,
    now: i64,
    w: i64,
    min_samples: u64,
    /// Start of the short window (None: none read).
    short_from: Option<i64>,
    /// How far before `now` the rule reads (its reference periods included).
    reach: i64,
}

#[cfg(test)]
thread_local! {
    /// Tests: read every window from the kept records, as before the incremental windows.
    pub(super) static FROM_RECORDS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn from_records_only() -> bool {
    #[cfg(test)]
    return FROM_RECORDS.with(|f| f.get());
    #[cfg(not(test))]
    false
}

/// `Views` from the kept records (sorting every window).
fn views_from_records(inputs: &inputs::Inputs, a: &Ask) -> Views {
    let (now, w) = (a.now, a.w);
    let recs: Vec<LatencySample> = inputs
        .latency_window(a.model, a.signal, now - MAX_STRETCH_WINDOWS * w, now)
        .collect();
    let (scaled, spans) = scaled_by_instance(&recs, a.signal, now, w, a.min_samples);
    Views {
        cur: owned(by_instance(&recs, a.signal, now - w, now)),
        scaled: owned(scaled),
        spans: spans.into_iter().map(|(i, s)| (i.to_string(), s)).collect(),
        short: a
            .short_from
            .map(|f| owned(by_instance(&recs, a.signal, f, now)))
            .unwrap_or_default(),
        cur_all: None,
        short_all: None,
    }
}

/// `Views` from the incremental windows; None where they cannot answer.
fn views_incremental(lw: &mut LatencyWindows, inputs: &inputs::Inputs, a: &Ask) -> Option<Views> {
    let (now, w) = (a.now, a.w);
    let series = (a.model, a.signal, a.signal);
    if from_records_only() || !lw.sync(inputs, series, a.reach, now) {
        return None;
    }
    // Samples per instance in (now - k·w, now] for k = 1..=MAX_STRETCH_WINDOWS, then short.
    let mut ranges: Vec<(i64, i64)> = (1..=MAX_STRETCH_WINDOWS)
        .map(|k| (now - k * w, now))
        .collect();
    ranges.push((a.short_from.unwrap_or(now), now));
    let counts = lw.counts(series, now, &ranges)?;
    let mut v = Views {
        cur: BTreeMap::new(),
        scaled: BTreeMap::new(),
        spans: BTreeMap::new(),
        short: BTreeMap::new(),
        cur_all: None,
        short_all: None,
    };
    for (i, n) in counts {
        let i = i.as_str();
        if n[0] > 0 {
            let cur = lw.window(series, now, Some(i), Slot::Current(w), (now - w, now))?;
            v.cur.insert(i.to_string(), cur.to_vec());
        }
        let k = (1..=MAX_STRETCH_WINDOWS)
            .find(|k| n[*k as usize - 1] as u64 >= a.min_samples)
            .unwrap_or(MAX_STRETCH_WINDOWS);
        if n[k as usize - 1] > 0 {
            let span = k * w;
            let scaled = lw.window(series, now, Some(i), Slot::Scaled(w), (now - span, now))?;
            v.scaled.insert(i.to_string(), scaled.to_vec());
            v.spans.insert(i.to_string(), span);
        }
        if let Some(f) = a.short_from
            && n[MAX_STRETCH_WINDOWS as usize] > 0
        {
            let short = lw.window(series, now, Some(i), Slot::Short(now - f), (f, now))?;
            v.short.insert(i.to_string(), short.to_vec());
        }
    }
    v.cur_all = Some(
        lw.window(series, now, None, Slot::Current(w), (now - w, now))?
            .to_vec(),
    );
    if let Some(f) = a.short_from {
        v.short_all = Some(
            lw.window(series, now, None, Slot::Short(now - f), (f, now))?
                .to_vec(),
        );
    }
    Some(v)
}

fn views(lw: &mut LatencyWindows, inputs: &inputs::Inputs, a: &Ask) -> Views {
    views_incremental(lw, inputs, a).unwrap_or_else(|| views_from_records(inputs, a))
}

/// Instances of a window that can be told apart (named, and at least two of them).
fn named(cur: &ByInstance) -> Vec<String> {
    let names: Vec<String> = cur
        .keys()
        .filter(|i| !i.is_empty())
        .map(|i| i.to_string())
        .collect();
    if names.len() >= 2 { names } else { Vec::new() }
}

/// The instance's peer comparison when it is more than `ratio` times its peers' median.
fn outlier_among_peers(
    cur: &ByInstance,
    instance: &str,
    min_samples: u64,
    min_tail: u64,
    ratio: f64,
) -> Option<det::PeerComparison> {
    let own = cur.get(instance)?;
    let peers: Vec<&[f64]> = cur
        .iter()
        .filter(|(i, _)| **i != instance)
        .map(|(_, v)| v.as_slice())
        .collect();
    det::compare_with_peers(own, &peers, min_samples, min_tail).filter(|c| c.ratio > ratio)
}

/// The model's current window without the flagged instances, sorted: `all`, the whole window
/// when known, if none of its instances is flagged.
fn model_window(cur: &ByInstance, all: Option<Vec<f64>>, flagged: &BTreeSet<String>) -> Vec<f64> {
    if let Some(all) = all
        && !cur.keys().any(|i| flagged.contains(i))
    {
        return all;
    }
    let mut v: Vec<f64> = cur
        .iter()
        .filter(|(i, _)| !flagged.contains(i.as_str()))
        .flat_map(|(_, v)| v.iter().copied())
        .collect();
    v.sort_by(f64::total_cmp);
    v
}

/// The slowest instance of the window at quantile `q`, as evidence for a model-level event.
fn with_slowest(f: det::Finding, cur: &ByInstance, q: f64) -> det::Finding {
    let slowest = cur
        .iter()
        .filter(|(i, _)| !i.is_empty())
        .filter_map(|(i, v)| det::sorted_quantile(v, q).map(|x| (i.as_str(), x)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    match slowest {
        Some((i, x)) if cur.len() >= 2 => {
            f.with("slowest_instance", i).with("slowest_instance_s", x)
        }
        _ => f,
    }
}

fn instance_event(
    f: det::Finding,
    cmp: &det::PeerComparison,
    rule: &RuleSpec,
    model: &str,
    instance: &str,
    now: i64,
) -> AnomalyEvent {
    let summary = format!(
        "instance {instance}: {} (its peers' median at this quantile is {:.0} ms, {:.1}× lower)",
        f.summary,
        cmp.peer_median * 1000.0,
        cmp.ratio
    );
    named_event(cmp.annotate(f), summary, rule, model, instance, now)
}

/// An instance's event: the finding under `summary`, labelled with the model and instance.
fn named_event(
    f: det::Finding,
    summary: String,
    rule: &RuleSpec,
    model: &str,
    instance: &str,
    now: i64,
) -> AnomalyEvent {
    let mut f = f.with("window_s", rule.window_ms as f64 / 1000.0);
    f.summary = summary;
    f.into_event(
        &rule.detector,
        &latency_signal_name(&rule.signal),
        labels(&[("model_id", model), ("instance", instance)]),
        now,
    )
}

/// The fast path of the spike (`det::latency_exceedance`) on one instance's short window,
/// when its share of slow requests is also over `peer_ratio` × its peers' share above the same
/// line (None without peer traffic to compare with).
fn fast_among_peers(
    short: &ByInstance,
    instance: &str,
    base: &[f64],
    p: &det::LatencySpikeParams,
) -> Option<det::Finding> {
    let f = det::latency_exceedance(short.get(instance)?, base, p)?;
    let line = f.evidence["slow_line_s"].as_f64()?;
    let share = f.evidence["slow_share"].as_f64()?;
    let (slow, n) = short
        .iter()
        .filter(|(i, _)| **i != instance)
        .flat_map(|(_, v)| v.iter())
        .fold((0u64, 0u64), |(s, n), v| (s + u64::from(*v > line), n + 1));
    if n == 0 {
        return None;
    }
    let peer_share = slow as f64 / n as f64;
    (share > p.peer_ratio * peer_share).then(|| {
        f.with("peer_slow_share", peer_share)
            .with("peer_samples", n)
    })
}

fn fast_instance_event(
    f: det::Finding,
    rule: &RuleSpec,
    model: &str,
    instance: &str,
    now: i64,
) -> AnomalyEvent {
    let peer = f.evidence["peer_slow_share"].as_f64().unwrap_or(0.0);
    let summary = format!(
        "instance {instance}: {} (its peers: {:.1}% above that line)",
        f.summary,
        peer * 100.0
    );
    named_event(f, summary, rule, model, instance, now)
}

fn model_event(f: det::Finding, rule: &RuleSpec, model: &str, now: i64) -> AnomalyEvent {
    f.with("window_s", rule.window_ms as f64 / 1000.0)
        .into_event(
            &rule.detector,
            &latency_signal_name(&rule.signal),
            labels(&[("model_id", model)]),
            now,
        )
}

/// A series' reference period `(from, to]`, its own and its instance's episodes left out,
/// sorted; cached for a fraction of the window (the model's records are read only then, or
/// its incremental window while the model has no episode to leave out).
#[allow(clippy::too_many_arguments)] // the series key, its records and the period
fn baseline(
    st: &mut SeriesState,
    lw: &mut LatencyWindows,
    model: &str,
    instance: Option<&str>,
    inputs: &inputs::Inputs,
    signal: &str,
    (from, to): (i64, i64),
    refresh_ms: i64,
    now: i64,
) -> Vec<f64> {
    let key = instance.unwrap_or("");
    if let Some(f) = &st.get(model, key).frozen {
        return f.clone();
    }
    if let Some((t, v)) = &st.get(model, key).cached
        && now - t < refresh_ms
    {
        return v.clone();
    }
    let no_episodes = st
        .series
        .iter()
        .filter(|((m, _), _)| m == model)
        .all(|(_, s)| s.episodes == det::Episodes::default());
    let incremental = no_episodes && !from_records_only();
    if let Some(v) = incremental
        .then(|| {
            let series = (model, signal, signal);
            lw.window(series, now, instance, Slot::Baseline(to - from), (from, to))
        })
        .flatten()
    {
        let v = v.to_vec();
        st.get(model, key).cached = Some((now, v.clone()));
        return v;
    }
    let covered = st.coverage(model);
    let mut v: Vec<f64> = inputs
        .latency_window(model, signal, from, to)
        .filter(|r| r.ok())
        .filter(|r| instance.is_none_or(|i| r.instance() == i))
        .filter(|r| !covered(r.instance(), r.at_ms()))
        .filter_map(|r| r.value(signal))
        .collect();
    drop(covered);
    v.sort_by(f64::total_cmp);
    st.get(model, key).cached = Some((now, v.clone()));
    v
}

/// Record the spike condition of a series: an episode opening freezes the baseline it was
/// measured against; one closing (or expiring) thaws it.
fn track(
    st: &mut SeriesState,
    model: &str,
    key: &str,
    holds: bool,
    base: &[f64],
    w: i64,
    now: i64,
) {
    let s = st.get(model, key);
    match s.episodes.observe(holds, now, w, w) {
        det::EpisodeStep::Opened => s.frozen = Some(base.to_vec()),
        det::EpisodeStep::Closed => {
            s.frozen = None;
            s.cached = None;
        }
        _ => {}
    }
}

/// `latency_spike`: each instance (with peers) against its own reference period and its
/// peers; the model on its unflagged instances against its reference period.
pub fn spike(
    rule: &RuleSpec,
    p: &det::LatencySpikeParams,
    st: &mut SeriesState,
    cx: &EvalCtx,
) -> Vec<AnomalyEvent> {
    let (now, w) = (cx.now, rule.window_ms);
    let span = w * i64::from(p.baseline_windows.max(1));
    let max_hold = (p.max_hold_s * 1000.0) as i64;
    let refresh = (w / BASELINE_REFRESH_DIVISOR).max(100);
    let fast_ms = (p.fast_window_s * 1000.0) as i64;
    let mut out = Vec::new();
    let mut lw = cx.latency_windows();
    for m in cx.inputs.models() {
        let ask = Ask {
            model: &m,
            signal: &rule.signal,
            now,
            w,
            min_samples: p.min_samples,
            short_from: Some((now - fast_ms).max(now - MAX_STRETCH_WINDOWS * w)),
            reach: MAX_STRETCH_WINDOWS * w + span,
        };
        let Views {
            cur,
            scaled,
            spans,
            short,
            cur_all,
            short_all,
        } = views(&mut lw, cx.inputs, &ask);
        let period = (now - w - span, now - w);
        let mut flagged = BTreeSet::new();
        for i in named(&scaled) {
            if st.get(&m, &i).episodes.expire(now, max_hold) {
                let s = st.get(&m, &i);
                s.frozen = None;
                s.cached = None;
            }
            // The reference period ends where the instance's (stretched) window starts.
            let stretch = spans.get(i.as_str()).copied().unwrap_or(w);
            let base = baseline(
                st,
                &mut lw,
                &m,
                Some(&i),
                cx.inputs,
                &rule.signal,
                (now - stretch - span, now - stretch),
                refresh,
                now,
            );
            let f = det::latency_spike(&scaled[i.as_str()], &base, p);
            let quick = fast_among_peers(&short, &i, &base, p);
            track(st, &m, &i, f.is_some() || quick.is_some(), &base, w, now);
            // An instance out of line with its peers is left out of the model's window: named
            // when it spiked, and not the model's problem either way. One whose spike episode
            // is still open stays out even when a window's peer comparison wavers, so the
            // incident does not flip between the instance's alert and the model's.
            let cmp =
                outlier_among_peers(&scaled, &i, p.min_samples, p.min_tail_samples, p.peer_ratio);
            match (f, cmp, quick) {
                (Some(f), Some(cmp), _) => out.push(instance_event(f, &cmp, rule, &m, &i, now)),
                (_, _, Some(q)) => out.push(fast_instance_event(q, rule, &m, &i, now)),
                (_, None, None) if st.get(&m, &i).frozen.is_none() => continue,
                _ => {}
            }
            flagged.insert(i);
        }
        if st.get(&m, "").episodes.expire(now, max_hold) {
            let s = st.get(&m, "");
            s.frozen = None;
            s.cached = None;
        }
        let current = model_window(&cur, cur_all, &flagged);
        let base = baseline(
            st,
            &mut lw,
            &m,
            None,
            cx.inputs,
            &rule.signal,
            period,
            refresh,
            now,
        );
        let f = det::latency_spike(&current, &base, p).or_else(|| {
            det::latency_exceedance(&model_window(&short, short_all, &flagged), &base, p)
        });
        track(st, &m, "", f.is_some(), &base, w, now);
        if let Some(f) = f {
            let q = f.evidence["quantile"].as_f64().unwrap_or(det::P99);
            out.push(model_event(with_slowest(f, &cur, q), rule, &m, now));
        }
    }
    st.prune(now - w - span);
    out
}

/// `absolute_latency`: each instance over the limit and out of line with its peers; the model
/// on its other instances.
pub fn absolute(
    rule: &RuleSpec,
    p: &det::AbsoluteLatencyParams,
    cx: &EvalCtx,
) -> Vec<AnomalyEvent> {
    let (now, w) = (cx.now, rule.window_ms);
    let mut out = Vec::new();
    let mut lw = cx.latency_windows();
    for m in cx.inputs.models() {
        let ask = Ask {
            model: &m,
            signal: &rule.signal,
            now,
            w,
            min_samples: p.min_samples,
            short_from: None,
            reach: MAX_STRETCH_WINDOWS * w,
        };
        let Views {
            cur,
            scaled,
            cur_all,
            ..
        } = views(&mut lw, cx.inputs, &ask);
        let mut flagged = BTreeSet::new();
        for i in named(&scaled) {
            let Some(cmp) =
                outlier_among_peers(&scaled, &i, p.min_samples, p.min_tail_samples, p.peer_ratio)
            else {
                continue;
            };
            if let Some(f) = det::absolute_latency(&scaled[i.as_str()], p) {
                out.push(instance_event(f, &cmp, rule, &m, &i, now));
            }
            flagged.insert(i);
        }
        if let Some(f) = det::absolute_latency(&model_window(&cur, cur_all, &flagged), p) {
            let q = f.evidence["quantile"].as_f64().unwrap_or(det::P99);
            out.push(model_event(with_slowest(f, &cur, q), rule, &m, now));
        }
    }
    out
}

/// The context-aware finding of one window: its tail against the limit for its median prompt
/// length at this KV-cache usage.
fn context_finding(
    lat: &[f64],
    prompts: &[f64],
    kv: Option<f64>,
    p: &det::ContextThresholdParams,
) -> Option<det::Finding> {
    if lat.len() < p.min_samples.max(1) as usize {
        return None;
    }
    let q = det::effective_quantile(det::P99, lat.len(), p.min_tail_samples)?;
    let tail = det::sorted_quantile(lat, q)?;
    let prompt = inputs::quantile(prompts.to_vec(), 0.5).unwrap_or(0.0);
    det::context_aware_threshold(tail, prompt, kv, p).map(|f| f.with("quantile", q))
}

/// The context rule's current window of each instance and whole, incrementally (None where
/// the incremental windows cannot answer).
fn context_windows(
    lw: &mut LatencyWindows,
    inputs: &inputs::Inputs,
    (model, signal): (&str, &str),
    w: i64,
    now: i64,
) -> Option<(ByInstance, Option<Vec<f64>>)> {
    let series = (model, signal, signal);
    let prompts = (model, signal, "prompt_tokens");
    if from_records_only() || !lw.sync(inputs, series, w, now) || !lw.sync(inputs, prompts, w, now)
    {
        return None;
    }
    let mut cur = BTreeMap::new();
    for (i, n) in lw.counts(series, now, &[(now - w, now)])? {
        if n[0] > 0 {
            let v = lw.window(series, now, Some(&i), Slot::Current(w), (now - w, now))?;
            cur.insert(i.to_string(), v.to_vec());
        }
    }
    let all = lw.window(series, now, None, Slot::Current(w), (now - w, now))?;
    Some((cur, Some(all.to_vec())))
}

/// Prompt lengths of the successful requests of `model` in `(from, to]` (those a rule on
/// `signal` reads), of the instances `keep` keeps (`whole`: of all of them), from the
/// incremental windows when `context_windows` could read them, else from the records.
fn prompts_of(
    lw: &mut LatencyWindows,
    inputs: &inputs::Inputs,
    (model, signal): (&str, &str),
    (from, to): (i64, i64),
    keep: &dyn Fn(&str) -> bool,
    whole: bool,
) -> Vec<f64> {
    let series = (model, signal, "prompt_tokens");
    let slot = Slot::Current(to - from);
    let mut incremental = || -> Option<Vec<f64>> {
        if from_records_only() {
            return None;
        }
        if whole {
            return Some(lw.window(series, to, None, slot, (from, to))?.to_vec());
        }
        let mut v = Vec::new();
        for (i, n) in lw.counts(series, to, &[(from, to)])? {
            if n[0] > 0 && keep(&i) {
                v.extend_from_slice(lw.window(series, to, Some(&i), slot, (from, to))?);
            }
        }
        Some(v)
    };
    incremental().unwrap_or_else(|| {
        inputs
            .latency_window(model, signal, from, to)
            .filter(|r| r.ok() && keep(r.instance()))
            .filter_map(|r| r.value("prompt_tokens"))
            .collect()
    })
}

/// `context_aware_threshold`: as `absolute`, with each window's limit from its median prompt
/// length and its instance's (or, for the model, the highest) KV-cache usage.
pub fn context(
    rule: &RuleSpec,
    p: &det::ContextThresholdParams,
    cx: &EvalCtx,
) -> Vec<AnomalyEvent> {
    let (now, w) = (cx.now, rule.window_ms);
    let mut out = Vec::new();
    let mut lw = cx.latency_windows();
    for m in cx.inputs.models() {
        let sig = rule.signal.as_str();
        let (cur, cur_all) = match context_windows(&mut lw, cx.inputs, (&m, sig), w, now) {
            Some(v) => v,
            None => {
                let recs: Vec<LatencySample> =
                    cx.inputs.latency_window(&m, sig, now - w, now).collect();
                (owned(by_instance(&recs, sig, now - w, now)), None)
            }
        };
        let whole = cur_all.is_some();
        let mut prompts = |keep: &dyn Fn(&str) -> bool, all: bool| -> Vec<f64> {
            prompts_of(
                &mut lw,
                cx.inputs,
                (&m, sig),
                (now - w, now),
                keep,
                whole && all,
            )
        };
        // None where no KV-cache usage is scraped (the rule then says so, see
        // `det::context_aware_threshold`).
        let model_kv = inputs::latest(cx.board, &m, names::KV_CACHE_USAGE, None);
        let mut flagged = BTreeSet::new();
        for i in named(&cur) {
            let Some(cmp) =
                outlier_among_peers(&cur, &i, p.min_samples, p.min_tail_samples, p.peer_ratio)
            else {
                continue;
            };
            let kv = inputs::latest(cx.board, &m, names::KV_CACHE_USAGE, Some(&i)).or(model_kv);
            let own = prompts(&|x| x == i, false);
            if let Some(f) = context_finding(&cur[i.as_str()], &own, kv, p) {
                out.push(instance_event(f, &cmp, rule, &m, &i, now));
            }
            flagged.insert(i);
        }
        let prompts = prompts(&|x| !flagged.contains(x), flagged.is_empty());
        let lat = model_window(&cur, cur_all, &flagged);
        if let Some(f) = context_finding(&lat, &prompts, model_kv, p) {
            out.push(model_event(f, rule, &m, now));
        }
    }
    out
}

#[cfg(test)]
#[path = "latency_tests.rs"]
mod tests;
