// Feedback and evaluation scores as the engine reads them: each score joined to its request's
// model, A/B group and prompt version (by request or trace id), kept per model for the window.

use super::record::{Label, Rec, TraceKey};
use crate::kernel::telemetry::Metrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::AtomicU64;

pub use tokenwatch_core::scores::*;

/// A score as the detectors read it.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreSample {
    pub at_ms: i64,
    pub ab_group: Label,
    pub prompt_version: Label,
    pub tenant: Label,
    pub name: Label,
    pub value: f64,
}

/// What a score needs of its request's record. Kept once per distinct combination (few),
/// as text: the engine's kept records alone share the label values (`Inputs::ingest`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Meta {
    model: String,
    ab_group: String,
    prompt_version: String,
    tenant: String,
}

/// Distinct combinations remembered before the index of requests starts over.
const MAX_COMBOS: usize = 65_536;

/// Requests remembered for joining (their ids hashed), scores kept per model, and scores still
/// waiting for their record.
pub struct ScoreBook {
    /// Hashed request id or trace id → index in `combos`.
    known: HashMap<u64, u32>,
    combos: Vec<Meta>,
    /// Hash of a combination's labels → its index (checked against `combos` when found).
    combo_index: HashMap<u64, u32>,
    /// Ids in `known` by the time their record came, oldest first.
    known_order: VecDeque<(i64, u64)>,
    samples: HashMap<Label, VecDeque<ScoreSample>>,
    /// Guardrail and hallucination verdicts joined since `take_verdicts`: (model, tenant, when,
    /// flagged), for the guardrail-rate SLO.
    verdicts: Vec<(Label, Label, i64, bool)>,
    /// Scores whose request is not known yet, by the key they wait for, with when they
    /// arrived (at most `PENDING_MS`, `CAP_PENDING` in all).
    pending: HashMap<u64, Vec<(i64, ScoreInput)>>,
    pending_count: usize,
    ids: RandomState,
    cap_known: usize,
    cap_per_model: usize,
    /// The trend gauges on `/metrics` and when they were last set.
    metrics: Option<ScoreMetrics>,
    last_publish: Option<i64>,
}

/// How long a score waits for its request's record (scores may be posted before the record
/// is complete, e.g. a guardrail verdict on a stream still running).
const PENDING_MS: i64 = 120_000;
const CAP_PENDING: usize = 10_000;

impl ScoreBook {
    /// Remember at most `cap_known` requests and keep at most `cap_per_model` scores a model.
    pub fn new(cap_known: usize, cap_per_model: usize) -> ScoreBook {
        ScoreBook {
            known: HashMap::new(),
            combos: Vec::new(),
            combo_index: HashMap::new(),
            known_order: VecDeque::new(),
            samples: HashMap::new(),
            verdicts: Vec::new(),
            pending: HashMap::new(),
            pending_count: 0,
            ids: RandomState::new(),
            cap_known: cap_known.max(1),
            cap_per_model: cap_per_model.max(1),
            metrics: None,
            last_publish: None,
        }
    }

    /// Publish the trend gauges (`ScoreMetrics`) from `prune`.
    pub fn publishing(mut self, metrics: ScoreMetrics) -> ScoreBook {
        self.metrics = Some(metrics);
        self
    }

    /// Per (model, prompt version, name) over the last `window_ms` before `now`: (sum, count),
    /// the `MAX_TREND_SERIES` with the most scores.
    pub fn trends(&self, now: i64, window_ms: i64) -> Vec<Trend> {
        let mut per: BTreeMap<(Label, Label, Label), (f64, u64)> = BTreeMap::new();
        for (model, q) in &self.samples {
            for s in q
                .iter()
                .filter(|s| s.at_ms > now - window_ms && s.at_ms <= now)
            {
                let key = (model.clone(), s.prompt_version.clone(), s.name.clone());
                let e = per.entry(key).or_default();
                e.0 += s.value;
                e.1 += 1;
            }
        }
        let mut out: Vec<_> = per.into_iter().collect();
        out.sort_by(|a, b| b.1.1.cmp(&a.1.1).then_with(|| a.0.cmp(&b.0)));
        out.truncate(MAX_TREND_SERIES);
        out
    }

    fn id_key(&self, id: &str) -> u64 {
        self.ids.hash_one((0u8, id))
    }

    fn trace_key(&self, t: TraceKey) -> u64 {
        self.ids.hash_one((1u8, t))
    }

    /// The key a score waits under: its request id's, else its trace id's.
    fn score_keys(&self, s: &ScoreInput) -> (Option<u64>, Option<u64>) {
        let id = (!s.request_id.is_empty()).then(|| self.id_key(&s.request_id));
        let t = TraceKey::parse(&s.trace_id);
        let trace = (t != TraceKey::default()).then(|| self.trace_key(t));
        (id, trace)
    }

    /// The index of `r`'s combination of labels (added when new).
    fn combo_of(&mut self, r: &Rec) -> u32 {
        let parts = (
            r.model.as_str(),
            r.ab_group.as_str(),
            r.prompt_version.as_str(),
            r.tenant.as_str(),
        );
        let h = self.ids.hash_one(parts);
        if let Some(&i) = self.combo_index.get(&h)
            && let Some(m) = self.combos.get(i as usize)
            && (
                m.model.as_str(),
                m.ab_group.as_str(),
                m.prompt_version.as_str(),
                m.tenant.as_str(),
            ) == parts
        {
            return i;
        }
        if self.combos.len() >= MAX_COMBOS {
            // Churning labels: start the index over rather than grow without bound.
            self.combos.clear();
            self.combo_index.clear();
            self.known.clear();
            self.known_order.clear();
        }
        let i = self.combos.len() as u32;
        self.combos.push(Meta {
            model: parts.0.to_string(),
            ab_group: parts.1.to_string(),
            prompt_version: parts.2.to_string(),
            tenant: parts.3.to_string(),
        });
        self.combo_index.insert(h, i);
        i
    }

    /// A record came: its request and trace ids now join scores to it (and the scores that
    /// were waiting for it are kept).
    pub fn note_record(&mut self, r: &Rec) {
        let combo = self.combo_of(r);
        let keys = [
            (!r.request_id.is_empty()).then(|| self.id_key(&r.request_id)),
            (r.trace_id != TraceKey::default()).then(|| self.trace_key(r.trace_id)),
        ];
        for k in keys.into_iter().flatten() {
            if let Entry::Vacant(v) = self.known.entry(k) {
                v.insert(combo);
                self.known_order.push_back((r.at_ms, k));
            }
            if self.pending_count > 0
                && let Some(waiting) = self.pending.remove(&k)
            {
                self.pending_count -= waiting.len();
                for (_, s) in waiting {
                    self.join(&s);
                }
            }
        }
        while self.known_order.len() > self.cap_known {
            if let Some((_, k)) = self.known_order.pop_front() {
                self.known.remove(&k);
            }
        }
    }

    fn lookup(&self, s: &ScoreInput) -> Option<Meta> {
        let (id, trace) = self.score_keys(s);
        let found = id
            .and_then(|k| self.known.get(&k))
            .or_else(|| trace.and_then(|k| self.known.get(&k)))?;
        self.combos.get(*found as usize).cloned()
    }

    /// Keeps `s` under its request's model; false when the request is not known.
    fn join(&mut self, s: &ScoreInput) -> bool {
        let Some(meta) = self.lookup(s) else {
            return false;
        };
        self.keep(meta, s);
        true
    }

    fn keep(&mut self, meta: Meta, s: &ScoreInput) {
        let model = Label::new(&meta.model);
        let tenant = Label::new(&meta.tenant);
        if (s.name == GUARDRAIL || s.name == HALLUCINATION) && self.verdicts.len() < CAP_PENDING {
            self.verdicts
                .push((model.clone(), tenant.clone(), s.at_ms, s.value >= 0.5));
        }
        let q = self.samples.entry(model).or_default();
        if q.len() >= self.cap_per_model {
            q.pop_front();
        }
        let sample = ScoreSample {
            at_ms: s.at_ms,
            ab_group: Label::new(&meta.ab_group),
            prompt_version: Label::new(&meta.prompt_version),
            tenant,
            name: Label::new(&s.name),
            value: s.value,
        };
        // Scores mostly come in time order; a late one is put in its place.
        let at = q.partition_point(|x| x.at_ms <= s.at_ms);
        q.insert(at, sample);
    }

    /// A score: joined to its request when the record is known; else waits for the record
    /// (when the poster named the model, it is kept under that model with no A/B group or
    /// prompt version right away instead).
    pub fn add(&mut self, s: ScoreInput, now: i64) {
        if self.join(&s) {
            return;
        }
        if !s.model.is_empty() {
            let meta = Meta {
                model: s.model.clone(),
                ab_group: String::new(),
                prompt_version: String::new(),
                tenant: String::new(),
            };
            self.keep(meta, &s);
            return;
        }
        let (id, trace) = self.score_keys(&s);
        let Some(k) = id.or(trace) else {
            return;
        };
        if self.pending_count >= CAP_PENDING {
            return;
        }
        self.pending_count += 1;
        self.pending.entry(k).or_default().push((now, s));
    }

    /// Forget requests and scores older than `retention_ms`, and scores that waited too long.
    pub fn prune(&mut self, now: i64, retention_ms: i64) {
        while self
            .known_order
            .front()
            .is_some_and(|(at, _)| now - at > retention_ms)
        {
            if let Some((_, k)) = self.known_order.pop_front() {
                self.known.remove(&k);
            }
        }
        for q in self.samples.values_mut() {
            while q.front().is_some_and(|s| now - s.at_ms > retention_ms) {
                q.pop_front();
            }
            if q.capacity() > 2 * q.len() + 1024 {
                q.shrink_to_fit();
            }
        }
        self.samples.retain(|_, q| !q.is_empty());
        if self.metrics.is_some()
            && self
                .last_publish
                .is_none_or(|t| now - t >= PUBLISH_MS || now < t)
        {
            self.last_publish = Some(now);
            let trends = self.trends(now, TREND_WINDOW_MS.min(retention_ms.max(1)));
            if let Some(m) = &self.metrics {
                m.set(&trends);
            }
        }
        if self.pending_count > 0 {
            for q in self.pending.values_mut() {
                q.retain(|(since, _)| now - since <= PENDING_MS);
            }
            self.pending.retain(|_, q| !q.is_empty());
            self.pending_count = self.pending.values().map(Vec::len).sum();
        }
        if self.known.is_empty() {
            // Nothing refers to a combination any more.
            self.combos.clear();
            self.combo_index.clear();
        }
        if self.known.capacity() > 2 * self.known.len() + 1024 {
            self.known.shrink_to_fit();
        }
    }

    /// Bytes allocated per request and per score: the index of the requests' ids that join
    /// scores, and the scores kept (their labels shared and not counted).
    pub fn bytes(&self) -> usize {
        let samples: usize = self.samples.values().map(VecDeque::capacity).sum();
        super::kept::table_bytes::<(u64, u32)>(self.known.capacity())
            + self.known_order.capacity() * size_of::<(i64, u64)>()
            + samples * size_of::<ScoreSample>()
    }

    /// The verdicts joined since the last call (for the SLOs).
    pub fn take_verdicts(&mut self) -> Vec<(Label, Label, i64, bool)> {
        std::mem::take(&mut self.verdicts)
    }

    /// Models with scores, sorted.
    pub fn models(&self) -> Vec<Label> {
        let mut m: Vec<Label> = self.samples.keys().cloned().collect();
        m.sort();
        m
    }

    /// A model's scores given in `[from, to)`, oldest first (found by bisection: a model's
    /// scores are kept in time order, see `keep`).
    pub fn window<'a>(
        &'a self,
        model: &str,
        from: i64,
        to: i64,
    ) -> impl Iterator<Item = &'a ScoreSample> + 'a {
        self.samples.get(model).into_iter().flat_map(move |q| {
            let a = q.partition_point(|s| s.at_ms < from);
            let b = q.partition_point(|s| s.at_ms < to);
            q.range(a..b.max(a))
        })
    }

    /// Mean and count of the `name` scores of a model in `[from, to)` that pass `keep`.
    pub fn mean(
        &self,
        model: &str,
        name: &str,
        from: i64,
        to: i64,
        keep: impl Fn(&ScoreSample) -> bool,
    ) -> Option<(f64, usize)> {
        let (sum, n) = self
            .window(model, from, to)
            .filter(|s| s.name == name && keep(s))
            .fold((0.0, 0usize), |(sum, n), s| (sum + s.value, n + 1));
        (n > 0).then(|| (sum / n as f64, n))
    }

    /// The quality score to read for a model in `[from, to)`: `preferred` when given any, else
    /// the first (by name) quality score given.
    pub fn quality_name(&self, model: &str, preferred: &str, from: i64, to: i64) -> Option<Label> {
        let mut first: Option<&Label> = None;
        for s in self.window(model, from, to) {
            if s.name == preferred {
                return Some(s.name.clone());
            }
            if is_quality(&s.name) && first.is_none_or(|f| s.name < *f) {
                first = Some(&s.name);
            }
        }
        first.cloned()
    }
}

/// (model, prompt version, score name) and the (sum, count) of its scores.
pub type Trend = ((Label, Label, Label), (f64, u64));

/// The trend gauges cover this window ...
const TREND_WINDOW_MS: i64 = 300_000;
/// ... are set at most this often ...
const PUBLISH_MS: i64 = 5_000;
/// ... for at most this many (model, prompt version, score) series, those with the most scores.
pub const MAX_TREND_SERIES: usize = 500;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TrendLabels {
    pub model_id: String,
    pub prompt_version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScoreLabels {
    pub model_id: String,
    pub prompt_version: String,
    pub name: String,
}

type F64Gauge = Gauge<f64, AtomicU64>;

/// Per (model, prompt version) trends of the last 5 minutes on `/metrics`: the share of
/// thumbs-down, and each score's mean and count (verdicts and flags: the flagged share).
#[derive(Clone)]
pub struct ScoreMetrics {
    thumbs_down: Family<TrendLabels, F64Gauge>,
    mean: Family<ScoreLabels, F64Gauge>,
    count: Family<ScoreLabels, F64Gauge>,
}

impl ScoreMetrics {
    pub fn register(m: &Metrics) -> ScoreMetrics {
        let s = ScoreMetrics {
            thumbs_down: Family::default(),
            mean: Family::default(),
            count: Family::default(),
        };
        m.register(
            "tokenwatch_feedback_thumbs_down_ratio",
            "Share of thumbs-down among the thumbs given in the last 5 minutes, per model and prompt version",
            s.thumbs_down.clone(),
        );
        m.register(
            "tokenwatch_score_mean",
            "Mean of each feedback / evaluation score given in the last 5 minutes (verdicts: the flagged share), per model and prompt version",
            s.mean.clone(),
        );
        m.register(
            "tokenwatch_score_samples",
            "Scores given in the last 5 minutes, per model, prompt version and score",
            s.count.clone(),
        );
        s
    }

    /// Replace every series with `trends` (see `ScoreBook::trends`).
    pub fn set(&self, trends: &[Trend]) {
        self.thumbs_down.clear();
        self.mean.clear();
        self.count.clear();
        for ((model, version, name), (sum, n)) in trends {
            let l = ScoreLabels {
                model_id: model.to_string(),
                prompt_version: version.to_string(),
                name: name.to_string(),
            };
            let mean = sum / (*n).max(1) as f64;
            self.mean.get_or_create(&l).set(mean);
            self.count.get_or_create(&l).set(*n as f64);
            if name == THUMBS {
                let t = TrendLabels {
                    model_id: l.model_id,
                    prompt_version: l.prompt_version,
                };
                self.thumbs_down.get_or_create(&t).set(1.0 - mean);
            }
        }
    }
}

/// The feedback signal of the drift vote: the share of thumbs-down of the current window
/// against the reference window's. Drift when the share rose by at least `MIN_RISE` and a
/// two-proportion z-test puts the rise beyond `Z` standard errors; no opinion with fewer than
/// `min_samples` thumbs on either side.
pub fn thumbs_down_drift(
    reference: (usize, usize),
    current: (usize, usize),
    min_samples: usize,
) -> Option<(bool, f64, f64)> {
    const MIN_RISE: f64 = 0.15;
    const Z: f64 = 2.58;
    let ((rd, rn), (cd, cn)) = (reference, current);
    if rn < min_samples.max(2) || cn < min_samples.max(2) {
        return None;
    }
    let (pr, pc) = (rd as f64 / rn as f64, cd as f64 / cn as f64);
    let pooled = (rd + cd) as f64 / (rn + cn) as f64;
    let se = (pooled * (1.0 - pooled) * (1.0 / rn as f64 + 1.0 / cn as f64)).sqrt();
    let rise = pc - pr;
    let drift = rise >= MIN_RISE && (se == 0.0 || rise / se >= Z);
    Some((drift, pr, pc))
}

/// Thumbs-down and thumbs given to a model in `[from, to)`.
pub fn thumbs(book: &ScoreBook, model: &str, from: i64, to: i64) -> (usize, usize) {
    book.window(model, from, to)
        .filter(|s| s.name == THUMBS)
        .fold((0, 0), |(down, n), s| {
            (down + usize::from(s.value < 0.5), n + 1)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str, model: &str, ab: &str, at: i64) -> Rec {
        Rec {
            model: model.into(),
            ab_group: ab.into(),
            prompt_version: "v1".into(),
            request_id: id.into(),
            at_ms: at,
            ..Default::default()
        }
    }

    fn score(id: &str, name: &str, value: f64, at: i64) -> ScoreInput {
        ScoreInput {
            request_id: id.into(),
            trace_id: String::new(),
            model: String::new(),
            at_ms: at,
            name: name.into(),
            value,
        }
    }

    #[test]
    fn scores_join_their_records_by_request_or_trace_id() {
        let mut b = ScoreBook::new(100, 100);
        let mut r = rec("r1", "m", "B", 1_000);
        r.trace_id = super::super::record::TraceKey::parse("0af7651916cd43dd8448eb211c80319c");
        b.note_record(&r);
        b.add(score("r1", TOXICITY, 0.9, 1_100), 1_100);
        let mut by_trace = score("", GUARDRAIL, 1.0, 1_200);
        by_trace.trace_id = "0af7651916cd43dd8448eb211c80319c".into();
        b.add(by_trace, 1_200);
        let got: Vec<_> = b.window("m", 0, 2_000).collect();
        assert_eq!(got.len(), 2);
        assert!(
            got.iter()
                .all(|s| s.ab_group == "B" && s.prompt_version == "v1")
        );
        // Unknown and no model: waits for the record, then is kept.
        b.add(score("r2", THUMBS, 0.0, 1_300), 1_300);
        assert_eq!(b.window("m", 0, 2_000).count(), 2);
        b.note_record(&rec("r2", "m", "A", 1_250));
        assert_eq!(
            b.mean("m", THUMBS, 0, 2_000, |s| s.ab_group == "A"),
            Some((0.0, 1))
        );
        // Unknown with a model: kept under it at once.
        let mut named = score("r9", "bleu", 0.4, 1_400);
        named.model = "other".into();
        b.add(named, 1_400);
        assert_eq!(b.mean("other", "bleu", 0, 2_000, |_| true), Some((0.4, 1)));
        let verdicts = b.take_verdicts();
        assert_eq!(verdicts.len(), 1);
        assert_eq!(
            (verdicts[0].0.as_str(), verdicts[0].2, verdicts[0].3),
            ("m", 1_200, true)
        );
        assert!(b.take_verdicts().is_empty());
        b.prune(200_000, 60_000);
        assert!(b.models().is_empty() && b.known.is_empty());
    }

    #[test]
    fn waiting_scores_expire_and_caps_hold() {
        let mut b = ScoreBook::new(2, 3);
        b.add(score("late", THUMBS, 1.0, 0), 0);
        b.prune(PENDING_MS + 1, 1_000_000);
        b.note_record(&rec("late", "m", "", 10));
        assert_eq!(b.window("m", 0, i64::MAX).count(), 0, "it waited too long");
        for i in 0..5 {
            b.note_record(&rec(&format!("r{i}"), "m", "", 100 + i));
        }
        assert_eq!(b.known.len(), 2);
        for i in 0..5 {
            b.add(score("r4", "bleu", i as f64, 200 + i), 200 + i);
        }
        let v: Vec<f64> = b.window("m", 0, i64::MAX).map(|s| s.value).collect();
        assert_eq!(v, [2.0, 3.0, 4.0]);
    }

    #[test]
    fn windows_found_by_bisection_equal_a_walk_of_every_score() {
        let mut b = ScoreBook::new(10, 400);
        let mut at = 10_000;
        for i in 0..1_000i64 {
            // Mostly in order; every 7th late (put in its place); repeated times; the cap
            // drops the oldest.
            at += i % 3;
            let t = if i % 7 == 0 { at - 500 } else { at };
            let mut s = score(&format!("r{i}"), "bleu", i as f64, t);
            s.model = "m".into();
            b.add(s, t);
        }
        let q = &b.samples["m"];
        assert_eq!(q.len(), 400);
        assert!(
            q.iter()
                .zip(q.iter().skip(1))
                .all(|(x, y)| x.at_ms <= y.at_ms)
        );
        let (lo, hi) = (q[0].at_ms, q[q.len() - 1].at_ms);
        for (from, to) in [
            (i64::MIN, i64::MAX),
            (lo, hi),
            (lo + 1, hi),
            (lo + 100, lo + 101),
            (lo + 250, lo + 250),
            (hi, lo),
            (hi + 1, i64::MAX),
        ] {
            let walk: Vec<&ScoreSample> = q
                .iter()
                .filter(|s| s.at_ms >= from && s.at_ms < to)
                .collect();
            let got: Vec<&ScoreSample> = b.window("m", from, to).collect();
            assert_eq!(got, walk, "[{from}, {to})");
        }
    }

    #[test]
    fn quality_name_prefers_the_configured_score() {
        let mut b = ScoreBook::new(10, 10);
        b.note_record(&rec("r", "m", "", 0));
        b.add(score("r", TOXICITY, 0.1, 1), 1);
        b.add(score("r", "relevance", 0.5, 2), 2);
        b.add(score("r", "bleu", 0.5, 3), 3);
        assert_eq!(
            b.quality_name("m", DEFAULT_QUALITY, 0, 10).as_deref(),
            Some("bleu")
        );
        b.add(score("r", DEFAULT_QUALITY, 0.7, 4), 4);
        assert_eq!(
            b.quality_name("m", DEFAULT_QUALITY, 0, 10).as_deref(),
            Some(DEFAULT_QUALITY)
        );
        assert_eq!(b.quality_name("none", DEFAULT_QUALITY, 0, 10), None);
    }

    #[test]
    fn trends_are_per_model_prompt_version_and_name_and_bounded() {
        let mut b = ScoreBook::new(10_000, 10_000);
        b.note_record(&rec("r", "m", "", 0));
        for (i, v) in [1.0, 0.0, 0.0, 0.0].into_iter().enumerate() {
            b.add(score("r", THUMBS, v, 10 + i as i64), 10);
        }
        let t = b.trends(100, 1_000);
        assert_eq!(t.len(), 1);
        let ((m, pv, name), (sum, n)) = &t[0];
        assert_eq!(
            (m.as_str(), pv.as_str(), name.as_str(), *sum, *n),
            ("m", "v1", THUMBS, 1.0, 4)
        );
        for i in 0..(MAX_TREND_SERIES + 10) {
            b.add(score("r", &format!("s{i}"), 0.5, 20), 20);
        }
        let t = b.trends(100, 1_000);
        assert_eq!(t.len(), MAX_TREND_SERIES);
        assert_eq!(
            t[0].0.2.as_str(),
            THUMBS,
            "the series with the most scores are kept"
        );
        assert!(b.trends(100_000, 1_000).is_empty(), "outside the window");
    }

    #[test]
    fn prompt_version_decay_reads_the_quality_score_per_version() {
        use crate::alerting::engine::eval::EvalCtx;
        use crate::alerting::engine::inputs::Inputs;
        use crate::alerting::rules::{AlertingConfig, compile};
        const W: i64 = 10_000;
        const NOW: i64 = 1_000_000_000;
        let cfg: AlertingConfig = serde_saphyr::from_str(
            "rules:\n  - {name: pv_quality, detector: prompt_version_decay, signal: quality, window: 10s}\n",
        )
        .unwrap();
        let mut rule = compile(&cfg)
            .unwrap()
            .into_iter()
            .find(|r| r.name == "pv_quality")
            .unwrap();
        let mut inputs = Inputs::new(100 * W, 100_000);
        let board = tokenwatch_core::signals::SignalBoard::new(10, 10);
        let none = std::collections::BTreeSet::new();
        let mut fired_at = None;
        for p in 0..10i64 {
            // Six healthy periods at 0.9, then 0.5 (a 44 % drop); another version stays at 0.9.
            let q = if p < 6 { 0.9 } else { 0.5 };
            for (version, value) in [("v1", q), ("v0", 0.9)] {
                for i in 0..25i64 {
                    let at = NOW + (p - 1) * W + i * 300 + 1;
                    let id = format!("{version}-{p}-{i}");
                    let mut r = rec(&id, "m", "", at);
                    r.prompt_version = version.into();
                    inputs.ingest(r);
                    inputs.add_score(score(&id, DEFAULT_QUALITY, value, at), at);
                }
            }
            let cx = EvalCtx {
                splits: &Default::default(),
                actions: &crate::kernel::actions::NoActions,
                inputs: &inputs,
                windows: &Default::default(),
                board: &board,
                new_records: &[],
                spans: &[],
                semantic_drift_models: &none,
                now: NOW + p * W,
            };
            let ev = rule.evaluate(&cx);
            assert!(
                ev.iter().all(|e| e.labels["prompt_version"] == "v1"),
                "{ev:#?}"
            );
            if !ev.is_empty() && fired_at.is_none() {
                assert_eq!(ev[0].signal, "quality");
                fired_at = Some(p);
            }
        }
        assert_eq!(fired_at, Some(8), "after three decayed periods");
    }

    #[test]
    fn thumbs_down_drift_needs_a_significant_rise() {
        assert_eq!(thumbs_down_drift((1, 40), (2, 4), 5), None, "too few");
        let (drift, pr, pc) = thumbs_down_drift((2, 40), (15, 20), 5).unwrap();
        assert!(drift && pr < 0.1 && pc > 0.7);
        let (drift, ..) = thumbs_down_drift((4, 40), (3, 20), 5).unwrap();
        assert!(!drift);
        let (drift, ..) = thumbs_down_drift((0, 5), (2, 5), 5).unwrap();
        assert!(!drift, "a 40-point rise on 5 samples is noise");
    }
}
