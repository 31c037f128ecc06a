// Tail-based sampling of stored spans (`traces.sampling`): spans wait per trace for a decision
// delay, then critical-path spans and their ancestors are kept and the rest sampled by depth.

//! A trace's spans are buffered until `decision_delay` has passed since its last span arrived
//! (or `MAX_AGE_DELAYS` delays since its first). Then every span is decided on the sampler's
//! own thread, off the proxy's runtime:
//!
//! - **critical** (always kept, weight 1): error status; a duration over its component's running
//!   P95 (component = service name + span name, a `LatencySketch` each); fan-in ≥ 2 (a span
//!   with at least two children in the trace); every ancestor of such a span, so the path stays
//!   connected to the root; and the roots themselves (no parent, or a parent not in the buffer).
//! - **sampled**: any other span, kept with probability
//!   `p = base_rate / (1 + depth) × (1 + |ln(duration / component median)|)`, clamped to
//!   `[MIN_RATE, 1]`: deeper and more ordinary spans are kept less often. The draw is a hash of
//!   the span id, so deciding the same trace again keeps the same spans. A component with fewer
//!   than `warmup_spans` durations seen is not known yet: its spans are all kept (p = 1).
//!
//! Every span the sampler keeps carries `tokenwatch.sampling.weight` = 1/p (1 for critical and
//! warm-up spans) so that counts can be re-estimated from the stored spans. When the buffer holds
//! `max_buffered_spans`, spans that arrive are stored at once, undecided, and counted
//! (`decision="kept_overflow"`): nothing is lost silently. At shutdown every buffered trace is
//! decided at once.

use crate::kernel::duration::HumanDuration;
use crate::kernel::telemetry::Metrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};
use tokenwatch_core::sketch::LatencySketch;
use tokenwatch_store::SpanRow;

/// The attribute a kept span carries: how many spans of the original stream it stands for.
pub const WEIGHT_ATTRIBUTE: &str = "tokenwatch.sampling.weight";
/// The lowest keep probability of an ordinary span (a weight of at most 100).
pub const MIN_RATE: f64 = 0.01;
/// Components (service + span name) with their own sketch, at most; spans of components past
/// it are kept (their P95 is never known).
const MAX_COMPONENTS: usize = 2_048;
/// A component's sketch starts over after this many durations, so its P95 follows the
/// current traffic; the last quantiles stay in force until the new sketch is warm.
const SKETCH_GENERATION: u64 = 20_000;
/// Quantiles of a warm component are read again after this many new durations.
const REFRESH_EVERY: u32 = 32;
/// A trace still receiving spans is decided anyway this many decision delays after its first
/// span, so that one that never goes quiet is not held forever.
const MAX_AGE_DELAYS: u32 = 6;

/// `traces.sampling` in the configuration.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SamplingConfig {
    /// Off by default: a sampled span reaches the store only `decision_delay` after its
    /// trace's last span, so a trace is not readable at once, and a small deployment has no
    /// span volume worth thinning. Turn it on where span volume costs storage.
    pub enabled: bool,
    /// How long a trace waits after its last span before its spans are decided.
    pub decision_delay: HumanDuration,
    /// Keep probability of an ordinary span at depth 0 (falls as `base_rate / (1 + depth)`).
    pub base_rate: f64,
    /// Spans waiting for a decision, at most; past it spans are stored undecided and counted.
    pub max_buffered_spans: usize,
    /// Durations a component needs before its P95 and median are trusted; until then its
    /// spans are all kept.
    pub warmup_spans: u64,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        SamplingConfig {
            enabled: false,
            decision_delay: HumanDuration(Duration::from_secs(5)),
            base_rate: 0.2,
            max_buffered_spans: 100_000,
            warmup_spans: 100,
        }
    }
}

impl SamplingConfig {
    /// Check the values; errors name the key.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let key = |k: &str| format!("traces.sampling.{k}");
        if !(self.base_rate > 0.0 && self.base_rate <= 1.0) {
            return Err((
                key("base_rate"),
                format!("must be in (0, 1], got {}", self.base_rate),
            ));
        }
        let delay = self.decision_delay.0;
        if delay.is_zero() || delay > Duration::from_secs(300) {
            return Err((
                key("decision_delay"),
                "must be more than 0 and at most 5m".into(),
            ));
        }
        if self.max_buffered_spans == 0 {
            return Err((key("max_buffered_spans"), "must be at least 1".into()));
        }
        if self.warmup_spans == 0 {
            return Err((key("warmup_spans"), "must be at least 1".into()));
        }
        Ok(())
    }
}

/// What became of one trace's spans: the kept ones (weight attribute set) and the counts.
#[derive(Debug, Default)]
pub struct Decisions {
    pub kept: Vec<SpanRow>,
    /// Kept as roots, critical spans or their ancestors.
    pub critical: u64,
    /// Kept by the draw (or because their component is still warming up).
    pub sampled: u64,
    pub dropped: u64,
}

/// One component's running duration distribution.
struct Component {
    sketch: LatencySketch,
    p50: f64,
    p95: f64,
    /// The quantiles above are in force (a sketch, this one or the one before, was warm).
    warm: bool,
    since_refresh: u32,
}

impl Component {
    fn new() -> Component {
        Component {
            sketch: LatencySketch::new(),
            p50: 0.0,
            p95: 0.0,
            warm: false,
            since_refresh: 0,
        }
    }

    fn add(&mut self, secs: f64, warmup: u64) {
        if self.sketch.count() >= SKETCH_GENERATION {
            self.sketch = LatencySketch::new();
        }
        if !self.sketch.add(secs) {
            return;
        }
        self.since_refresh += 1;
        let n = self.sketch.count();
        if n >= warmup && (!self.warm || n == warmup || self.since_refresh >= REFRESH_EVERY) {
            if let (Some(p50), Some(p95)) = (self.sketch.quantile(0.5), self.sketch.quantile(0.95))
            {
                self.p50 = p50;
                self.p95 = p95;
                self.warm = true;
            }
            self.since_refresh = 0;
        }
    }
}

/// The decision logic without a thread: feed it whole traces (`decide`).
pub struct Sampler {
    base_rate: f64,
    warmup: u64,
    /// Per service name, per span name.
    components: HashMap<String, HashMap<String, Component>>,
    n_components: usize,
}

impl Sampler {
    pub fn new(cfg: &SamplingConfig) -> Sampler {
        Sampler {
            base_rate: cfg.base_rate.clamp(MIN_RATE, 1.0),
            warmup: cfg.warmup_spans.max(1),
            components: HashMap::new(),
            n_components: 0,
        }
    }

    /// Components with a sketch.
    pub fn components(&self) -> usize {
        self.n_components
    }

    /// The component of `s`, once its quantiles are in force.
    fn warm(&self, s: &SpanRow) -> Option<&Component> {
        self.components
            .get(s.service_name.as_str())
            .and_then(|m| m.get(s.name.as_str()))
            .filter(|c| c.warm)
    }

    /// Decide the spans of one trace (all spans buffered for it), then learn their durations.
    pub fn decide(&mut self, spans: Vec<SpanRow>) -> Decisions {
        let n = spans.len();
        let mut index: HashMap<&str, usize> = HashMap::with_capacity(n);
        for (i, s) in spans.iter().enumerate() {
            index.entry(s.span_id.as_str()).or_insert(i);
        }
        let parent: Vec<Option<usize>> = spans
            .iter()
            .enumerate()
            .map(|(i, s)| {
                if s.parent_span_id.is_empty() {
                    return None;
                }
                index
                    .get(s.parent_span_id.as_str())
                    .copied()
                    .filter(|p| *p != i)
            })
            .collect();
        drop(index);
        let mut children = vec![0u32; n];
        for p in parent.iter().flatten() {
            children[*p] += 1;
        }
        let depth = depths(&parent);
        let secs: Vec<f64> = spans
            .iter()
            .map(|s| (s.end_unix_nano.saturating_sub(s.start_unix_nano)).max(0) as f64 / 1e9)
            .collect();

        // Critical spans, roots, and the paths between them.
        let mut critical = vec![false; n];
        for i in 0..n {
            let s = &spans[i];
            let slow = self.warm(s).is_some_and(|c| secs[i] > c.p95);
            critical[i] = parent[i].is_none() || s.status_code == 2 || children[i] >= 2 || slow;
        }
        let mut on_path = vec![false; n];
        for i in 0..n {
            if !critical[i] {
                continue;
            }
            let mut cur = parent[i];
            while let Some(p) = cur {
                if on_path[p] {
                    break;
                }
                on_path[p] = true;
                cur = parent[p];
            }
        }

        let mut out = Decisions {
            kept: Vec::with_capacity(n),
            ..Decisions::default()
        };
        let mut weights = vec![0.0f64; n];
        for i in 0..n {
            if critical[i] || on_path[i] {
                weights[i] = 1.0;
                out.critical += 1;
                continue;
            }
            let s = &spans[i];
            let p = match self.warm(s) {
                Some(c) => self.rate(depth[i], secs[i], c.p50),
                None => 1.0,
            };
            if unit_hash(&s.span_id) < p {
                weights[i] = 1.0 / p;
                out.sampled += 1;
            } else {
                out.dropped += 1;
            }
        }

        for (i, s) in spans.iter().enumerate() {
            self.learn(s, secs[i]);
        }
        for (i, mut s) in spans.into_iter().enumerate() {
            if weights[i] > 0.0 {
                s.attributes_json = with_weight(&s.attributes_json, weights[i]);
                out.kept.push(s);
            }
        }
        out
    }

    /// Keep probability of an ordinary span at `depth` lasting `secs` in a component whose
    /// median is `p50`.
    fn rate(&self, depth: u32, secs: f64, p50: f64) -> f64 {
        let unusual = if p50 > 0.0 && secs > 0.0 {
            (secs / p50).ln().abs()
        } else if p50 > 0.0 || secs > 0.0 {
            // One of the two is zero: as far from the median as it gets.
            4.0
        } else {
            0.0
        };
        let p = self.base_rate / (1.0 + f64::from(depth)) * (1.0 + unusual.min(4.0));
        p.clamp(MIN_RATE, 1.0)
    }

    fn learn(&mut self, s: &SpanRow, secs: f64) {
        let warmup = self.warmup;
        if let Some(c) = self
            .components
            .get_mut(s.service_name.as_str())
            .and_then(|m| m.get_mut(s.name.as_str()))
        {
            c.add(secs, warmup);
        } else if self.n_components < MAX_COMPONENTS {
            let mut c = Component::new();
            c.add(secs, warmup);
            self.components
                .entry(s.service_name.clone())
                .or_default()
                .insert(s.name.clone(), c);
            self.n_components += 1;
        }
    }
}

/// Depth of each span below its root (0 for a root). A cycle of parent links is cut where the
/// walk meets a span it has already passed.
fn depths(parent: &[Option<usize>]) -> Vec<u32> {
    const UNKNOWN: u32 = u32::MAX;
    let n = parent.len();
    let mut depth = vec![UNKNOWN; n];
    let mut chain = Vec::new();
    let mut in_chain = vec![false; n];
    for i in 0..n {
        if depth[i] != UNKNOWN {
            continue;
        }
        chain.clear();
        let mut cur = i;
        let mut base = 0u32;
        loop {
            if depth[cur] != UNKNOWN {
                base = depth[cur].saturating_add(1);
                break;
            }
            chain.push(cur);
            in_chain[cur] = true;
            match parent[cur] {
                Some(p) if !in_chain[p] => cur = p,
                _ => break,
            }
        }
        for (k, c) in chain.iter().rev().enumerate() {
            depth[*c] = base.saturating_add(k as u32);
            in_chain[*c] = false;
        }
    }
    depth
}

/// A uniform draw in [0, 1) from a span id: its bytes, 8 at a time, each folded in by the
/// SplitMix64 mixer (fixed constants, so a rerun draws the same).
pub fn unit_hash(id: &str) -> f64 {
    fn mix(z: u64) -> u64 {
        let z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    let bytes = id.as_bytes();
    let mut h = 0x243f_6a88_85a3_08d3 ^ bytes.len() as u64;
    for chunk in bytes.chunks(8) {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        h = mix(h ^ u64::from_le_bytes(word));
    }
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// `attributes_json` with the weight attribute added (a span that already carries one, from
/// a sampler upstream, keeps its own).
fn with_weight(attributes_json: &str, weight: f64) -> String {
    let field = format!("\"{WEIGHT_ATTRIBUTE}\":{weight}");
    let t = attributes_json.trim();
    let Some(rest) = t.strip_prefix('{') else {
        return format!("{{{field}}}");
    };
    if t.contains(WEIGHT_ATTRIBUTE) {
        return attributes_json.to_string();
    }
    if rest.trim_start().starts_with('}') {
        format!("{{{field}}}")
    } else {
        format!("{{{field},{rest}")
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    decision: &'static str,
}

/// `tokenwatch_spans_sampled_total{decision}`, each child fetched once.
#[derive(Clone)]
struct Counts {
    critical: Counter,
    sampled: Counter,
    dropped: Counter,
    overflow: Counter,
}

impl Counts {
    fn register(metrics: &Metrics) -> Counts {
        let family = Family::<DecisionLabels, Counter>::default();
        let child =
            |decision: &'static str| family.get_or_create(&DecisionLabels { decision }).clone();
        let counts = Counts {
            critical: child("kept_critical"),
            sampled: child("kept_sampled"),
            dropped: child("dropped"),
            overflow: child("kept_overflow"),
        };
        metrics.register(
            "tokenwatch_spans_sampled",
            "Spans through the span sampler, by decision (kept_critical, kept_sampled, dropped, kept_overflow: stored undecided because the buffer was full)",
            family,
        );
        counts
    }
}

/// Where decided (and overflowing) spans go: the store writer's queue. Returns how many of
/// the rows it took.
pub type Forward = Box<dyn Fn(Vec<SpanRow>) -> usize + Send + Sync>;

struct Shared {
    /// Spans sent to the thread and not decided yet.
    buffered: AtomicUsize,
    max_buffered: usize,
    counts: Counts,
    depth: Gauge,
    forward: Forward,
}

/// The sources' side of the sampler thread: `push` never waits. The thread decides what is
/// buffered and ends once every handle is dropped.
#[derive(Clone)]
pub struct SpanSampler {
    tx: mpsc::Sender<Vec<SpanRow>>,
    shared: Arc<Shared>,
}

impl SpanSampler {
    /// Start the sampler thread at `priority`; kept spans go to `forward`.
    pub fn start(
        cfg: &SamplingConfig,
        metrics: &Metrics,
        priority: crate::runtimes::AnalysisPriority,
        forward: Forward,
    ) -> std::io::Result<SpanSampler> {
        let depth = Gauge::default();
        metrics.register(
            "tokenwatch_span_sampler_buffered_spans",
            "Spans waiting in the span sampler for their trace's decision",
            depth.clone(),
        );
        let shared = Arc::new(Shared {
            buffered: AtomicUsize::new(0),
            max_buffered: cfg.max_buffered_spans.max(1),
            counts: Counts::register(metrics),
            depth,
            forward,
        });
        let (tx, rx) = mpsc::channel();
        let worker = Worker {
            sampler: Sampler::new(cfg),
            delay: cfg.decision_delay.0,
            traces: HashMap::new(),
            shared: shared.clone(),
        };
        std::thread::Builder::new()
            .name("tokenwatch-span-sampler".into())
            .spawn(move || {
                crate::runtimes::lower_current_thread_priority(priority);
                worker.run(rx)
            })?;
        Ok(SpanSampler { tx, shared })
    }

    /// Buffer `rows` for their traces' decisions; when the buffer has no room for them (or
    /// the thread is gone) they are forwarded undecided and counted as `kept_overflow`.
    /// Returns how many were taken: all when buffered, else what `forward` took.
    pub fn push(&self, rows: Vec<SpanRow>) -> usize {
        let n = rows.len();
        if n == 0 {
            return 0;
        }
        let s = &self.shared;
        let mut seen = s.buffered.load(Ordering::Acquire);
        let admitted = loop {
            if seen + n > s.max_buffered {
                break false;
            }
            match s.buffered.compare_exchange_weak(
                seen,
                seen + n,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break true,
                Err(now) => seen = now,
            }
        };
        if admitted {
            s.depth.set((seen + n) as i64);
            match self.tx.send(rows) {
                Ok(()) => n,
                Err(mpsc::SendError(rows)) => {
                    s.buffered.fetch_sub(n, Ordering::AcqRel);
                    s.counts.overflow.inc_by(n as u64);
                    (s.forward)(rows)
                }
            }
        } else {
            s.counts.overflow.inc_by(n as u64);
            (s.forward)(rows)
        }
    }
}

struct Pending {
    spans: Vec<SpanRow>,
    first: Instant,
    last: Instant,
}

struct Worker {
    sampler: Sampler,
    delay: Duration,
    traces: HashMap<String, Pending>,
    shared: Arc<Shared>,
}

impl Worker {
    fn run(mut self, rx: mpsc::Receiver<Vec<SpanRow>>) {
        let tick = (self.delay / 4).clamp(Duration::from_millis(10), Duration::from_millis(250));
        let mut last_sweep = Instant::now();
        loop {
            match rx.recv_timeout(tick) {
                Ok(rows) => self.add(rows),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    self.sweep(None);
                    return;
                }
            }
            if last_sweep.elapsed() >= tick {
                last_sweep = Instant::now();
                self.sweep(Some(last_sweep));
            }
        }
    }

    fn add(&mut self, rows: Vec<SpanRow>) {
        let now = Instant::now();
        for row in rows {
            match self.traces.get_mut(row.trace_id.as_str()) {
                Some(p) => {
                    p.spans.push(row);
                    p.last = now;
                }
                None => {
                    self.traces.insert(
                        row.trace_id.clone(),
                        Pending {
                            spans: vec![row],
                            first: now,
                            last: now,
                        },
                    );
                }
            }
        }
    }

    /// Decide the traces quiet for `delay` at `now`, or buffered for `MAX_AGE_DELAYS` delays
    /// (all of them with None), and forward what is kept.
    fn sweep(&mut self, now: Option<Instant>) {
        let max_age = self.delay * MAX_AGE_DELAYS;
        let due: Vec<String> = self
            .traces
            .iter()
            .filter(|(_, p)| {
                now.is_none_or(|now| {
                    now.duration_since(p.last) >= self.delay
                        || now.duration_since(p.first) >= max_age
                })
            })
            .map(|(id, _)| id.clone())
            .collect();
        if due.is_empty() {
            return;
        }
        let mut kept = Vec::new();
        let mut decided = 0;
        for id in due {
            let Some(p) = self.traces.remove(&id) else {
                continue;
            };
            decided += p.spans.len();
            let d = self.sampler.decide(p.spans);
            self.shared.counts.critical.inc_by(d.critical);
            self.shared.counts.sampled.inc_by(d.sampled);
            self.shared.counts.dropped.inc_by(d.dropped);
            kept.extend(d.kept);
        }
        let left = self
            .shared
            .buffered
            .fetch_sub(decided, Ordering::AcqRel)
            .saturating_sub(decided);
        self.shared.depth.set(left as i64);
        if !kept.is_empty() {
            // Rows the store's queue has no room for are counted there.
            (self.shared.forward)(kept);
        }
    }
}

#[cfg(test)]
#[path = "span_sampler_tests.rs"]
mod tests;
