// The autoscaling signal and the eviction trigger (spec section 6), computed per model on the
// alert engine's thread once per `scaling.period` and published for `/api/v1/scaling` and /metrics.
//
// Each period reads, per model: the fullest GPU's memory ratio (and KV-cache use), the period's
// P95 TTFT against the model's TTFT SLO threshold (800 ms by default), and its output tokens/s;
// tokenwatch-detect's `ScalingState` scores them (z-score against each signal's own baseline,
// logistic, weights 0.3 / 0.4 / 0.3) and steps the desired replicas. For an HPA, the external
// metric `tokenwatch_scaling_desired_replicas{model}` with an `AverageValue` target of 1; for
// KEDA's `metrics-api` scaler, `GET /api/v1/scaling/{model}` with `valueLocation:
// desired_replicas` and `targetValue: "1"`. The eviction trigger (GPU memory ≥ 92 % and P99 TTFT
// up ≥ 300 ms on the previous period) ranks the model's instances with the configured weights.

use crate::alerting::engine::enrich::instance_loads;
use crate::alerting::engine::inputs::{Inputs, quantile, values};
use crate::kernel::duration::HumanDuration;
use crate::kernel::telemetry::Metrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokenwatch_core::signals::{SharedSignals, SignalBoard, names};
use tokenwatch_detect as det;

/// The `scaling:` section.
///
/// ```yaml
/// scaling:
///   period: 15s
///   recommendation: {cooldown_s: 60, min_replicas: 1, max_replicas: 16, calm_periods: 3}
///   eviction: {memory_ratio: 0.92, latency_jump_s: 0.3, weights: {memory: 0.4, p99: 0.3, queued: 0.3}, window_s: 60}
/// ```
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScalingConfig {
    pub enabled: bool,
    /// One scoring period: the inputs are this period's requests.
    pub period: HumanDuration,
    pub recommendation: det::ScalingParams,
    pub eviction: det::EvictionParams,
}

impl Default for ScalingConfig {
    fn default() -> Self {
        ScalingConfig {
            enabled: true,
            period: HumanDuration(Duration::from_secs(15)),
            recommendation: det::ScalingParams::default(),
            eviction: det::EvictionParams::default(),
        }
    }
}

impl ScalingConfig {
    pub fn validate(&self) -> Result<(), (String, String)> {
        use det::Validate;
        if self.period.0 < Duration::from_millis(100) {
            return Err(("scaling.period".into(), "must be at least 100ms".into()));
        }
        self.recommendation
            .validate()
            .map_err(|e| (format!("scaling.recommendation.{}", e.field), e.reason))?;
        self.eviction
            .validate()
            .map_err(|e| (format!("scaling.eviction.{}", e.field), e.reason))
    }
}

/// The eviction trigger's state for a model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvictionStatus {
    pub triggered: bool,
    pub memory_ratio: Option<f64>,
    /// P99 TTFT of this period minus the previous one's, seconds.
    pub latency_jump_s: Option<f64>,
    /// The worst instance first, when triggered and at least two instances report memory.
    pub candidate: Option<String>,
    pub ranking: Vec<(String, f64)>,
}

/// One model's latest recommendation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelScaling {
    pub model: String,
    pub at_unix_ms: i64,
    /// Instances that served the model over the last minute.
    pub observed_replicas: u32,
    pub desired_replicas: u32,
    pub min_replicas: u32,
    pub max_replicas: u32,
    pub score: f64,
    pub decision: det::ScalingDecision,
    pub eviction: EvictionStatus,
}

/// What the engine last published, for the API.
#[derive(Default)]
pub struct ScalingBook {
    inner: RwLock<BTreeMap<String, ModelScaling>>,
}

impl ScalingBook {
    pub fn get(&self, model: &str) -> Option<ModelScaling> {
        self.inner
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(model)
            .cloned()
    }

    pub fn all(&self) -> Vec<ModelScaling> {
        self.inner
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    fn publish(&self, m: BTreeMap<String, ModelScaling>) {
        *self.inner.write().unwrap_or_else(|p| p.into_inner()) = m;
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabel {
    model: String,
}

#[derive(Clone)]
struct ScalingMetrics {
    desired: Family<ModelLabel, Gauge>,
    score: Family<ModelLabel, Gauge<f64, AtomicU64>>,
    /// `export.prometheus.max_label_bytes` when registered: model names come from requests.
    max_label_bytes: usize,
}

impl ScalingMetrics {
    fn register(m: &Metrics) -> ScalingMetrics {
        let s = ScalingMetrics {
            desired: Family::default(),
            score: Family::default(),
            max_label_bytes: m.max_label_bytes(),
        };
        m.register(
            "tokenwatch_scaling_desired_replicas",
            "Recommended replicas per model (HPA external metric, AverageValue target 1)",
            s.desired.clone(),
        );
        m.register(
            "tokenwatch_scaling_score",
            "Scaling pressure per model: weighted logistic z-scores of GPU memory, TTFT against its SLO and throughput (0.5 = at baseline)",
            s.score.clone(),
        );
        s
    }
}

/// Models' scaling states, stepped once per period.
pub struct Scaler {
    cfg: ScalingConfig,
    states: HashMap<String, det::ScalingState>,
    prev_p99: HashMap<String, f64>,
    last: Option<i64>,
    latest: BTreeMap<String, ModelScaling>,
    book: Arc<ScalingBook>,
    metrics: Option<ScalingMetrics>,
}

/// Instances seen this long count as replicas.
const REPLICA_WINDOW_MS: i64 = 60_000;
/// A model without requests for this long is forgotten.
const FORGET_MS: i64 = 3_600_000;

impl Scaler {
    /// The eviction ranking (spec section 6) of the instances serving `model`, worst first, by
    /// `scaling.eviction`'s weights over its window; None with fewer than two instances
    /// reporting GPU memory. The trigger and a GPU-memory alert's enrichment both rank here.
    pub fn eviction_ranking(
        &self,
        board: &SignalBoard,
        inputs: &Inputs,
        model: &str,
        now: i64,
    ) -> Option<Vec<(String, f64)>> {
        let ev = &self.cfg.eviction;
        let window_ms = (ev.window_s * 1000.0) as i64;
        instance_loads(board, inputs, model, now, window_ms)
            .map(|l| det::eviction_ranking_weighted(&l, &ev.weights))
    }

    pub fn new(cfg: &ScalingConfig, book: Arc<ScalingBook>, metrics: Option<&Metrics>) -> Scaler {
        Scaler {
            cfg: cfg.clone(),
            states: HashMap::new(),
            prev_p99: HashMap::new(),
            last: None,
            latest: BTreeMap::new(),
            book,
            metrics: metrics.map(ScalingMetrics::register),
        }
    }

    /// One period, when due: every model with records is scored and published.
    pub fn step(&mut self, signals: &SharedSignals, inputs: &Inputs, now: i64) {
        let period_ms = self.cfg.period.0.as_millis() as i64;
        if !self.cfg.enabled || self.last.is_some_and(|t| now - t < period_ms) {
            return;
        }
        self.last = Some(now);
        let board = signals.read().unwrap_or_else(|p| p.into_inner());
        let threshold = ttft_threshold(inputs);
        for model in inputs.models() {
            let m = self.model_step(&board, inputs, &model, threshold, now);
            self.latest.insert(model, m);
        }
        drop(board);
        self.latest.retain(|_, m| now - m.at_unix_ms < FORGET_MS);
        let keep: BTreeSet<&String> = self.latest.keys().collect();
        self.states.retain(|k, _| keep.contains(k));
        self.prev_p99.retain(|k, _| keep.contains(k));
        if let Some(g) = &self.metrics {
            g.desired.clear();
            g.score.clear();
            for m in self.latest.values() {
                let mut l = ModelLabel {
                    model: m.model.clone(),
                };
                crate::kernel::telemetry::cap_label(&mut l.model, g.max_label_bytes);
                g.desired
                    .get_or_create(&l)
                    .set(i64::from(m.desired_replicas));
                g.score.get_or_create(&l).set(m.score);
            }
        }
        self.book.publish(self.latest.clone());
    }

    fn model_step(
        &mut self,
        board: &SignalBoard,
        inputs: &Inputs,
        model: &str,
        ttft_threshold_s: f64,
        now: i64,
    ) -> ModelScaling {
        let period_ms = self.cfg.period.0.as_millis() as i64;
        let period_s = period_ms as f64 / 1000.0;
        let recs: Vec<_> = inputs.window(model, now - period_ms, now).collect();
        let ttfts = values(recs.iter().copied(), "ttft");
        let p95 = quantile(ttfts.clone(), 0.95);
        let p99 = quantile(ttfts, 0.99);
        let tokens: u64 = recs.iter().filter_map(|r| r.output_tokens).sum();
        let prompts: Vec<f64> = recs
            .iter()
            .filter_map(|r| r.prompt_tokens)
            .map(|t| t as f64)
            .collect();
        let latest = board.latest(Some(model));
        let max_of = |signal: &str| {
            latest
                .iter()
                .filter(|p| p.signal == signal && p.value.is_finite())
                .map(|p| p.value)
                .reduce(f64::max)
        };
        let x = det::ScalingInputs {
            memory: max_of(names::GPU_MEMORY_USED_RATIO),
            kv_cache: max_of(names::KV_CACHE_USAGE),
            ttft_ratio: p95.map(|p| p / ttft_threshold_s.max(1e-6)),
            // No request this period: no throughput (an idle model is calm, not unknown).
            throughput: Some(tokens as f64 / period_s.max(1e-3)),
            mean_prompt_tokens: (!prompts.is_empty())
                .then(|| prompts.iter().sum::<f64>() / prompts.len() as f64),
        };
        let observed = inputs
            .window(model, now - REPLICA_WINDOW_MS, now)
            .map(|r| r.instance.as_str())
            .collect::<BTreeSet<_>>()
            .len()
            .max(1) as u32;
        let p = &self.cfg.recommendation;
        let state = self.states.entry(model.to_string()).or_default();
        let decision = state.step(&x, observed, now as f64 / 1000.0, p);
        if decision.action != "hold" {
            tracing::info!(model, action = decision.action, desired = decision.desired_replicas, score = decision.score, reason = %decision.reason, "scaling recommendation");
        }
        // Eviction trigger: nearly full memory and a latency jump on the previous period.
        let ev = &self.cfg.eviction;
        let jump = match (p99, self.prev_p99.get(model)) {
            (Some(now_p99), Some(prev)) => Some(now_p99 - prev),
            _ => None,
        };
        if let Some(v) = p99 {
            self.prev_p99.insert(model.to_string(), v);
        }
        let triggered = match (x.memory, jump) {
            (Some(m), Some(j)) => det::eviction_triggered(m, j, ev),
            _ => false,
        };
        let ranking = if triggered {
            self.eviction_ranking(board, inputs, model, now)
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        let candidate = ranking.first().map(|(i, _)| i.clone());
        if triggered {
            tracing::warn!(model, candidate = ?candidate, memory = ?x.memory, jump_s = ?jump, "eviction trigger: GPU memory nearly full and latency jumped");
        }
        ModelScaling {
            model: model.to_string(),
            at_unix_ms: now,
            observed_replicas: observed,
            desired_replicas: decision.desired_replicas,
            min_replicas: p.min_replicas,
            max_replicas: p.max_replicas,
            score: decision.score,
            eviction: EvictionStatus {
                triggered,
                memory_ratio: x.memory,
                latency_jump_s: jump,
                candidate,
                ranking,
            },
            decision,
        }
    }
}

/// The TTFT SLO's threshold in seconds: the strictest configured `ttft_p95` SLO's, else the
/// spec's 800 ms.
fn ttft_threshold(inputs: &Inputs) -> f64 {
    inputs
        .slos()
        .slos()
        .iter()
        .filter(|s| s.objective == super::Objective::TtftP95)
        .filter_map(|s| s.threshold_s)
        .reduce(f64::min)
        .unwrap_or(0.8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alerting::engine::record::Rec;

    #[test]
    fn periods_score_models_and_publish() {
        let book = Arc::new(ScalingBook::default());
        let metrics = Metrics::new();
        let cfg = ScalingConfig {
            period: HumanDuration(Duration::from_secs(1)),
            ..ScalingConfig::default()
        };
        let mut s = Scaler::new(&cfg, book.clone(), Some(&metrics));
        let mut inputs = Inputs::new(600_000, 100_000);
        let signals: SharedSignals = Arc::new(RwLock::new(SignalBoard::default()));
        let mut t = 0i64;
        let feed = |inputs: &mut Inputs, from: i64, n: i64, ttft: f64| {
            for k in 0..n {
                inputs.ingest(Rec {
                    model: "m".into(),
                    instance: "i-1".into(),
                    at_ms: from + k * 1000 / n,
                    ttft: Some(ttft),
                    output_tokens: Some(20),
                    prompt_tokens: Some(100),
                    ok: true,
                    ..Rec::default()
                });
            }
        };
        // 20 s of steady load, then load and TTFT rise.
        for _ in 0..20 {
            feed(&mut inputs, t, 10, 0.1 + 0.002 * (t / 1000 % 3) as f64);
            t += 1000;
            s.step(&signals, &inputs, t);
        }
        let m = book.get("m").unwrap();
        assert_eq!((m.desired_replicas, m.observed_replicas), (1, 1), "{m:?}");
        feed(&mut inputs, t, 30, 0.5);
        t += 1000;
        s.step(&signals, &inputs, t);
        let m = book.get("m").unwrap();
        assert_eq!((m.decision.action, m.desired_replicas), ("up", 2), "{m:?}");
        assert!((m.decision.ttft.value.unwrap() - 0.5 / 0.8).abs() < 1e-9);
        let text = metrics.encode();
        assert!(
            text.contains("tokenwatch_scaling_desired_replicas{model=\"m\"} 2"),
            "{text}"
        );
        // Not due yet: nothing changes within the period.
        s.step(&signals, &inputs, t + 10);
        assert_eq!(book.get("m").unwrap().at_unix_ms, t);
        assert!(!m.eviction.triggered && m.eviction.memory_ratio.is_none());
    }

    #[test]
    fn long_model_names_are_cut_at_the_label_limit() {
        let book = Arc::new(ScalingBook::default());
        let metrics = Metrics::new();
        metrics.set_series_limits(32, 100);
        let cfg = ScalingConfig {
            period: HumanDuration(Duration::from_secs(1)),
            ..ScalingConfig::default()
        };
        let mut s = Scaler::new(&cfg, book.clone(), Some(&metrics));
        let mut inputs = Inputs::new(600_000, 100_000);
        let signals: SharedSignals = Arc::new(RwLock::new(SignalBoard::default()));
        let long = "y".repeat(10_000);
        for t in 0..5i64 {
            inputs.ingest(Rec {
                model: long.as_str().into(),
                instance: "i-1".into(),
                at_ms: t * 1000,
                ttft: Some(0.1),
                output_tokens: Some(20),
                prompt_tokens: Some(100),
                ok: true,
                ..Rec::default()
            });
            s.step(&signals, &inputs, (t + 1) * 1000);
        }
        assert!(book.get(&long).is_some(), "the model was scored");
        let text = metrics.encode();
        let cut = format!("{}...", "y".repeat(29));
        assert!(
            text.contains(&format!("tokenwatch_scaling_score{{model=\"{cut}\"}}")),
            "{}",
            &text[..text.len().min(3000)]
        );
        assert!(!text.contains(&"y".repeat(30)));
    }

    #[test]
    fn eviction_trigger_names_the_worst_instance_with_configured_weights() {
        let mut cfg = ScalingConfig {
            period: HumanDuration(Duration::from_secs(1)),
            ..ScalingConfig::default()
        };
        // Memory alone decides: the fullest instance is named whatever its latency.
        cfg.eviction.weights = det::EvictionWeights {
            memory: 1.0,
            p99: 0.0,
            queued: 0.0,
        };
        let book = Arc::new(ScalingBook::default());
        let mut s = Scaler::new(&cfg, book.clone(), None);
        let mut inputs = Inputs::new(600_000, 100_000);
        let mut board = SignalBoard::default();
        for (instance, ratio) in [("i-1", 0.97), ("i-2", 0.93)] {
            board.update(tokenwatch_core::signals::SignalPoint {
                model_id: "m".into(),
                signal: names::GPU_MEMORY_USED_RATIO.into(),
                value: ratio,
                source: "test".into(),
                runtime: String::new(),
                instance: instance.into(),
                device_id: String::new(),
                timestamp_unix_ms: 0,
                notes: BTreeMap::new(),
            });
        }
        let signals: SharedSignals = Arc::new(RwLock::new(board));
        let add = |inputs: &mut Inputs, at: i64, instance: &str, ttft: f64| {
            inputs.ingest(Rec {
                model: "m".into(),
                instance: instance.into(),
                at_ms: at,
                ttft: Some(ttft),
                output_tokens: Some(10),
                ok: true,
                ..Rec::default()
            });
        };
        for k in 0..20 {
            add(&mut inputs, 500 + k * 20, "i-1", 0.1);
            add(&mut inputs, 510 + k * 20, "i-2", 0.1);
        }
        s.step(&signals, &inputs, 1000);
        assert!(
            !book.get("m").unwrap().eviction.triggered,
            "no previous period yet"
        );
        // P99 TTFT jumps by 0.5 s on the next period while memory is ≥ 92 %.
        for k in 0..20 {
            add(&mut inputs, 1500 + k * 20, "i-1", 0.2);
            add(&mut inputs, 1510 + k * 20, "i-2", 0.6);
        }
        s.step(&signals, &inputs, 2000);
        let e = book.get("m").unwrap().eviction;
        assert!(e.triggered, "{e:?}");
        assert!((e.latency_jump_s.unwrap() - 0.5).abs() < 1e-9, "{e:?}");
        assert_eq!(e.candidate.as_deref(), Some("i-1"), "{e:?}");
        assert_eq!(e.ranking.len(), 2);
        // A GPU-memory alert's enrichment ranks by the configured weights too: memory alone
        // names i-1, latency alone the slower i-2.
        let board = signals.read().unwrap();
        let by_memory = s.eviction_ranking(&board, &inputs, "m", 2000).unwrap();
        assert_eq!(by_memory[0].0, "i-1", "{by_memory:?}");
        cfg.eviction.weights = det::EvictionWeights {
            memory: 0.0,
            p99: 1.0,
            queued: 0.0,
        };
        let by_latency = Scaler::new(&cfg, Arc::new(ScalingBook::default()), None)
            .eviction_ranking(&board, &inputs, "m", 2000)
            .unwrap();
        assert_eq!(by_latency[0].0, "i-2", "{by_latency:?}");
    }

    #[test]
    fn config_checks() {
        assert!(ScalingConfig::default().validate().is_ok());
        let mut c = ScalingConfig::default();
        c.eviction.window_s = 0.0;
        assert_eq!(c.validate().unwrap_err().0, "scaling.eviction.window_s");
        let mut c = ScalingConfig::default();
        c.recommendation.max_replicas = 0;
        assert_eq!(
            c.validate().unwrap_err().0,
            "scaling.recommendation.max_replicas"
        );
        let mut c = ScalingConfig::default();
        c.eviction.memory_ratio = 2.0;
        assert_eq!(c.validate().unwrap_err().0, "scaling.eviction.memory_ratio");
    }
}
