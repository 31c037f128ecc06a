// Runtime mapping: one target's parsed exposition → normalised SignalPoints, keeping the state
// rates and windowed percentiles need (previous counters, histogram readings over the window).

use super::identity::{TargetIdentity, device_notes, host_of};
use super::rules::{Aggregate, Role, RuleKind, RuleSet};
use super::tables::{GPU_MEMORY_FREE_BYTES, GPU_MEMORY_RESERVED_BYTES, runtime_of};
use super::xid::XidTracker;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_core::counts::ScrapeCounts;
use tokenwatch_core::exposition::{MetricFamily, Sample};
use tokenwatch_core::histogram::{CumulativeHistogram, counter_delta};
use tokenwatch_core::placement::{Placed, Site};
use tokenwatch_core::signals::{SignalPoint, names};

const QUANTILES: [(&str, f64); 4] = [("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99)];
/// Labels tried for the model when a rule does not name one.
const DEFAULT_MODEL_LABELS: [&str; 3] = ["model_id", "model_name", "model"];
/// What one scrape yielded.
#[derive(Debug)]
pub struct MapOutput {
    pub runtime: String,
    pub detected: bool,
    pub samples: usize,
    pub points: Vec<SignalPoint>,
    /// New GPU XID errors seen in this scrape (`super::xid`), for root cause.
    pub events: Vec<AnomalyEvent>,
    /// (model, version) the target reports (`super::versions`), for version markers.
    pub versions: Vec<(String, String)>,
    /// What each (model, instance) added since the previous scrape (none on the first).
    pub counts: Vec<ScrapeCounts>,
    /// Where each serving (model, instance) and each GPU read in this scrape runs.
    pub placed: Vec<Placed>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct GroupKey {
    /// From the series' own label; resolved against the target's defaults when emitting.
    model: Option<String>,
    device: String,
    instance: Option<String>,
}

#[derive(Debug, Default)]
struct Acc {
    values: Vec<f64>,
    delta: f64,
    has_prev: bool,
    den_delta: f64,
    den_has_prev: bool,
    buckets: Vec<(f64, f64)>,
    sum: f64,
    count: Option<f64>,
    notes: BTreeMap<String, String>,
}

/// Per-target mapping state. Owned by the target's task: no locking.
pub struct Mapper {
    rules: Arc<RuleSet>,
    target: TargetIdentity,
    window: Duration,
    prev_counters: HashMap<String, f64>,
    prev_time: Option<Instant>,
    histograms: HashMap<(usize, GroupKey), VecDeque<(Instant, CumulativeHistogram)>>,
    xid: XidTracker,
}

impl Mapper {
    pub fn new(rules: Arc<RuleSet>, target: TargetIdentity, window: Duration) -> Mapper {
        Mapper {
            rules,
            target,
            window,
            prev_counters: HashMap::new(),
            prev_time: None,
            histograms: HashMap::new(),
            xid: XidTracker::default(),
        }
    }

    /// Map one scrape taken at `now` (monotonic, for rates) / `now_ms` (wall clock, for points).
    pub fn map(&mut self, families: &[MetricFamily<'_>], now: Instant, now_ms: i64) -> MapOutput {
        let rules = self.rules.clone();
        let mut accs: Vec<HashMap<GroupKey, Acc>> =
            (0..rules.rules.len()).map(|_| HashMap::new()).collect();
        let mut new_prev: HashMap<String, f64> = HashMap::with_capacity(self.prev_counters.len());
        let mut models: HashSet<String> = HashSet::new();
        let mut detected: Option<&'static str> = None;
        let mut samples = 0usize;
        let mut versions = super::versions::ScrapeVersions::default();

        for fam in families {
            if let Some(rt) = runtime_of(fam.name) {
                // A serving runtime wins over a GPU exporter on the same endpoint (the simulator).
                if detected.is_none() || detected == Some("dcgm") {
                    detected = Some(rt);
                }
            }
            for s in &fam.samples {
                samples += 1;
                if let Some((model, version)) = super::versions::version_of(fam.name, s) {
                    versions.add(model, version);
                }
                for &(idx, role) in rules.lookup(s.name) {
                    let rule = &rules.rules[idx];
                    if !rule
                        .match_labels
                        .iter()
                        .all(|(k, v)| s.label(k) == Some(v.as_str()))
                    {
                        continue;
                    }
                    let key =
                        group_key(rule.model_label.as_deref(), rule.device_label.as_deref(), s);
                    if let (false, Some(m)) = (rule.is_device_rule(), &key.model) {
                        models.insert(m.clone());
                    }
                    let acc = accs[idx].entry(key).or_default();
                    match role {
                        Role::Value if rule.kind == RuleKind::Gauge => acc.values.push(s.value),
                        Role::Value | Role::Denominator => {
                            let id = series_id(s);
                            let prev = self.prev_counters.get(&id).copied();
                            new_prev.insert(id, s.value);
                            if let Some(p) = prev {
                                let d = counter_delta(p, s.value);
                                if role == Role::Value {
                                    acc.delta += d;
                                    acc.has_prev = true;
                                } else {
                                    acc.den_delta += d;
                                    acc.den_has_prev = true;
                                }
                            }
                        }
                        Role::Bucket => {
                            if let Some(le) = s.label("le").and_then(parse_le) {
                                acc.buckets.push((le, s.value));
                            }
                        }
                        Role::Sum => acc.sum += s.value,
                        Role::Count => *acc.count.get_or_insert(0.0) += s.value,
                    }
                    if rule.is_device_rule() && acc.notes.is_empty() {
                        acc.notes = device_notes(s);
                    }
                }
            }
        }

        let runtime = match (&self.target.runtime, detected) {
            (Some(r), _) => r.clone(),
            (None, Some(d)) => d.to_string(),
            (None, None) => "unknown".to_string(),
        };
        let elapsed = self
            .prev_time
            .map(|t| now.saturating_duration_since(t).as_secs_f64())
            .filter(|e| *e > 0.0);
        let single_model = if models.len() == 1 {
            models.iter().next().cloned()
        } else {
            None
        };
        let default_model = self
            .target
            .labels
            .get("model_id")
            .cloned()
            .or(single_model)
            .unwrap_or_default();

        let mut points = Vec::new();
        let mut emitted: HashSet<(String, String, String, String)> = HashSet::new();
        let mut counts: BTreeMap<(String, String), ScrapeCounts> = BTreeMap::new();
        let mut placed: BTreeMap<(String, String, String), Site> = BTreeMap::new();
        for (idx, groups) in accs.into_iter().enumerate() {
            let rule = &rules.rules[idx];
            let point_runtime = rule.runtime.clone().unwrap_or_else(|| runtime.clone());
            let mut groups: Vec<(GroupKey, Acc)> = groups.into_iter().collect();
            groups.sort_by(|a, b| (&a.0.model, &a.0.device).cmp(&(&b.0.model, &b.0.device)));
            for (key, acc) in groups {
                let model_id = key.model.clone().unwrap_or_else(|| default_model.clone());
                let instance = self
                    .target
                    .labels
                    .get("instance")
                    .cloned()
                    .or(key.instance.clone())
                    .unwrap_or_else(|| self.target.instance.clone());
                let base = SignalPoint {
                    model_id,
                    signal: rule.signal.clone(),
                    value: f64::NAN,
                    source: format!("scrape:{point_runtime}"),
                    runtime: point_runtime.clone(),
                    instance,
                    device_id: key.device.clone(),
                    timestamp_unix_ms: now_ms,
                    notes: acc.notes.clone(),
                };
                // Where this group's replica or GPU runs (from the first scrape on).
                let at = (
                    base.model_id.clone(),
                    base.instance.clone(),
                    base.device_id.clone(),
                );
                if !placed.contains_key(&at) && (!at.0.is_empty() || !at.2.is_empty()) {
                    let site = if at.2.is_empty() {
                        self.target.serving_site()
                    } else {
                        self.target.gpu_site(&base.notes)
                    };
                    placed.insert(at, site);
                }
                let mut out: Vec<SignalPoint> = Vec::new();
                // Per-scrape counts of serving instances (not of GPUs), from the second scrape on.
                let mut counted = match (elapsed, key.device.is_empty()) {
                    (Some(e), true) => {
                        let k = (base.model_id.clone(), base.instance.clone());
                        Some(counts.entry(k).or_insert_with(|| ScrapeCounts {
                            model_id: base.model_id.clone(),
                            instance: base.instance.clone(),
                            runtime: point_runtime.clone(),
                            at_unix_ms: now_ms,
                            interval_ms: (e * 1000.0).round() as i64,
                            finished: None,
                            failed: None,
                            prompt_tokens: None,
                            output_tokens: None,
                            latency: Vec::new(),
                        }))
                    }
                    _ => None,
                };
                if let (Some(c), RuleKind::CounterRate, true) =
                    (counted.as_deref_mut(), rule.kind, acc.has_prev)
                {
                    if rule.signal == names::REQUESTS_PER_SECOND && c.finished.is_none() {
                        c.finished = Some(acc.delta);
                    } else if rule.signal == names::REQUEST_ERRORS_PER_SECOND && c.failed.is_none()
                    {
                        c.failed = Some(acc.delta);
                    } else if rule.signal == names::PROMPT_TOKENS_PER_SECOND
                        && c.prompt_tokens.is_none()
                    {
                        c.prompt_tokens = Some(acc.delta * rule.scale);
                    } else if rule.signal == names::OUTPUT_TOKENS_PER_SECOND
                        && c.output_tokens.is_none()
                    {
                        c.output_tokens = Some(acc.delta * rule.scale);
                    }
                }
                match rule.kind {
                    RuleKind::Gauge => {
                        if let Some(v) = aggregate(&acc.values, rule.aggregate) {
                            out.push(SignalPoint {
                                value: v * rule.scale,
                                ..base
                            });
                        }
                    }
                    RuleKind::CounterRate => {
                        if let (true, Some(e)) = (acc.has_prev, elapsed) {
                            out.push(SignalPoint {
                                value: acc.delta * rule.scale / e,
                                ..base
                            });
                        }
                    }
                    RuleKind::CounterRatio => {
                        if acc.has_prev && acc.den_has_prev && acc.den_delta > 0.0 {
                            out.push(SignalPoint {
                                value: acc.delta * rule.scale / acc.den_delta,
                                ..base
                            });
                        }
                    }
                    RuleKind::Histogram => {
                        if let Some(h) =
                            build_histogram(acc.buckets, acc.sum, acc.count, rule.scale)
                        {
                            let (quantiles, step) =
                                self.window_quantiles(idx, key.clone(), h, now, &base);
                            out.extend(quantiles);
                            if let (Some(c), Some(step)) = (counted, step)
                                && c.histogram(&rule.signal).is_none()
                            {
                                c.latency.push((rule.signal.clone(), step));
                            }
                        }
                    }
                }
                for p in out {
                    let id = (
                        p.signal.clone(),
                        p.model_id.clone(),
                        p.device_id.clone(),
                        p.instance.clone(),
                    );
                    if emitted.insert(id) {
                        points.push(p);
                    }
                }
            }
        }
        derive_gpu_memory(&mut points);
        let events = self.xid.observe(families, &self.target, now_ms);
        // Histogram series that vanished (model unloaded, target changed) release their history.
        self.histograms
            .retain(|_, h| h.back().is_some_and(|(t, _)| *t == now));
        self.prev_counters = new_prev;
        self.prev_time = Some(now);
        MapOutput {
            runtime,
            detected: self.target.runtime.is_none() && detected.is_some(),
            samples,
            points,
            events,
            versions: versions.finish(),
            counts: counts.into_values().filter(|c| !c.is_empty()).collect(),
            placed: placed
                .into_iter()
                .map(|((model_id, instance, device_id), site)| Placed {
                    model_id,
                    instance,
                    device_id,
                    site,
                })
                .collect(),
        }
    }

    /// Percentiles and mean of the observations since the reading about one window ago, and
    /// the observations since the previous scrape (None on the first reading).
    fn window_quantiles(
        &mut self,
        idx: usize,
        key: GroupKey,
        current: CumulativeHistogram,
        now: Instant,
        base: &SignalPoint,
    ) -> (Vec<SignalPoint>, Option<CumulativeHistogram>) {
        let history = self.histograms.entry((idx, key)).or_default();
        let step = history.back().map(|(_, prev)| current.delta_since(prev));
        history.push_back((now, current.clone()));
        let cutoff = now.checked_sub(self.window);
        while history.len() > 2 && cutoff.is_some_and(|c| history[1].0 <= c) {
            history.pop_front();
        }
        if history.len() < 2 {
            return (Vec::new(), step);
        }
        let (then, earlier) = &history[0];
        let delta = current.delta_since(earlier);
        let window_s = now.saturating_duration_since(*then).as_secs_f64();
        let metric = base.signal.clone();
        let mut out = Vec::new();
        for (label, q) in QUANTILES {
            let Some(bq) = delta.quantile(q) else {
                continue;
            };
            let mut notes = base.notes.clone();
            notes.insert("bucket_lower".into(), fmt(bq.bucket_lower));
            notes.insert("bucket_upper".into(), fmt(bq.bucket_upper));
            notes.insert("max_abs_error".into(), fmt(bq.max_abs_error()));
            notes.insert("window_s".into(), fmt(window_s));
            notes.insert("observations".into(), fmt(delta.count));
            out.push(SignalPoint {
                signal: names::latency_signal(&metric, label),
                value: bq.value,
                notes,
                ..base.clone()
            });
        }
        if let Some(mean) = delta.mean() {
            let mut notes = base.notes.clone();
            notes.insert("window_s".into(), fmt(window_s));
            notes.insert("observations".into(), fmt(delta.count));
            out.push(SignalPoint {
                signal: names::latency_signal(&metric, "mean"),
                value: mean,
                notes,
                ..base.clone()
            });
        }
        (out, step)
    }
}

fn fmt(v: f64) -> String {
    if v.is_infinite() {
        "+Inf".into()
    } else {
        format!("{}", (v * 1e9).round() / 1e9)
    }
}

fn group_key(model_label: Option<&str>, device_label: Option<&str>, s: &Sample<'_>) -> GroupKey {
    let model = match model_label {
        Some("") => None,
        Some(l) => s.label(l).map(str::to_string),
        None => DEFAULT_MODEL_LABELS
            .iter()
            .find_map(|l| s.label(l))
            .map(str::to_string),
    };
    let (device, instance) = match device_label {
        Some(d) => {
            let dev = s
                .label(d)
                .or_else(|| s.label("gpu_uuid"))
                .or_else(|| s.label("gpu"))
                .unwrap_or("");
            (dev.to_string(), host_of(s).map(str::to_string))
        }
        None => (String::new(), None),
    };
    GroupKey {
        model: model.filter(|m| !m.is_empty()),
        device,
        instance,
    }
}

/// Identity of one series across scrapes: name and labels as exposed.
fn series_id(s: &Sample<'_>) -> String {
    let mut id = String::with_capacity(s.name.len() + 16 * s.labels.len());
    id.push_str(s.name);
    for l in &s.labels {
        id.push('\u{1f}');
        id.push_str(l.name);
        id.push('=');
        id.push_str(&l.value);
    }
    id
}

fn parse_le(v: &str) -> Option<f64> {
    match v.trim() {
        "+Inf" | "Inf" | "inf" | "+inf" => Some(f64::INFINITY),
        t => t.parse::<f64>().ok().filter(|x| !x.is_nan()),
    }
}

fn aggregate(values: &[f64], how: Aggregate) -> Option<f64> {
    let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if finite.is_empty() {
        return None;
    }
    Some(match how {
        Aggregate::Sum => finite.iter().sum(),
        Aggregate::Mean => finite.iter().sum::<f64>() / finite.len() as f64,
        Aggregate::Max => finite.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    })
}

/// Buckets of all series of a group summed by bound (engines of one model), scaled to seconds.
fn build_histogram(
    mut buckets: Vec<(f64, f64)>,
    sum: f64,
    count: Option<f64>,
    scale: f64,
) -> Option<CumulativeHistogram> {
    if buckets.is_empty() {
        return None;
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut bounds: Vec<f64> = Vec::with_capacity(buckets.len());
    let mut cumulative: Vec<f64> = Vec::with_capacity(buckets.len());
    for (le, c) in buckets {
        if bounds.last() == Some(&le) {
            if let Some(last) = cumulative.last_mut() {
                *last += c;
            }
        } else {
            bounds.push(le);
            cumulative.push(c);
        }
    }
    let bounds = bounds
        .into_iter()
        .map(|b| if b.is_infinite() { b } else { b * scale })
        .collect();
    let total = cumulative.last().copied().unwrap_or(0.0);
    Some(CumulativeHistogram {
        bounds,
        cumulative,
        sum: sum * scale,
        count: count.unwrap_or(total),
    })
}

/// Total GPU memory from used + free + reserved where the exporter has no total, then the
/// used ratio wherever both used and total are known.
fn derive_gpu_memory(points: &mut Vec<SignalPoint>) {
    type Key = (String, String, String);
    let mut by_dev: BTreeMap<Key, [Option<usize>; 4]> = BTreeMap::new();
    for (i, p) in points.iter().enumerate() {
        let slot = match p.signal.as_str() {
            names::GPU_MEMORY_USED_BYTES => 0,
            GPU_MEMORY_FREE_BYTES => 1,
            GPU_MEMORY_RESERVED_BYTES => 2,
            names::GPU_MEMORY_TOTAL_BYTES => 3,
            _ => continue,
        };
        by_dev
            .entry((p.model_id.clone(), p.instance.clone(), p.device_id.clone()))
            .or_default()[slot] = Some(i);
    }
    for [used, free, reserved, total] in by_dev.into_values() {
        let Some(used) = used else { continue };
        let total_value = match (total, free) {
            (Some(t), _) => points[t].value,
            (None, Some(f)) => {
                let v = points[used].value
                    + points[f].value
                    + reserved.map_or(0.0, |r| points[r].value);
                let mut p = points[used].clone();
                p.signal = names::GPU_MEMORY_TOTAL_BYTES.into();
                p.value = v;
                points.push(p);
                v
            }
            (None, None) => continue,
        };
        if total_value > 0.0 {
            let mut p = points[used].clone();
            p.signal = names::GPU_MEMORY_USED_RATIO.into();
            p.value = points[used].value / total_value;
            points.push(p);
        }
    }
}

#[cfg(test)]
#[path = "mapping_tests.rs"]
mod tests;
