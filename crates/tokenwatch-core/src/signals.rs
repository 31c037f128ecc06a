// Normalised signals: the latest value (and a short history) of every signal of every model,
// whatever source produced it — scrape, OTLP, NVML or the proxy (spec sections 2 and 3).

use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};

/// Well-known signal names. Sources may add others; these are the ones detectors rely on.
pub mod names {
    /// KV-cache usage as a fraction 0..1.
    pub const KV_CACHE_USAGE: &str = "kv_cache_usage";
    pub const PREFIX_CACHE_HIT_RATE: &str = "prefix_cache_hit_rate";
    pub const SPEC_DECODE_ACCEPTANCE_RATE: &str = "spec_decode_acceptance_rate";
    pub const PREEMPTIONS_PER_SECOND: &str = "preemptions_per_second";
    pub const REQUESTS_RUNNING: &str = "requests_running";
    pub const REQUESTS_WAITING: &str = "requests_waiting";
    pub const REQUESTS_PER_SECOND: &str = "requests_per_second";
    /// Requests the server failed, per second (vLLM `finished_reason="error"`, TGI failures);
    /// a part of `requests_per_second`.
    pub const REQUEST_ERRORS_PER_SECOND: &str = "request_errors_per_second";
    pub const PROMPT_TOKENS_PER_SECOND: &str = "prompt_tokens_per_second";
    pub const OUTPUT_TOKENS_PER_SECOND: &str = "output_tokens_per_second";
    pub const GPU_MEMORY_USED_BYTES: &str = "gpu_memory_used_bytes";
    pub const GPU_MEMORY_TOTAL_BYTES: &str = "gpu_memory_total_bytes";
    /// GPU memory used / total, 0..1.
    pub const GPU_MEMORY_USED_RATIO: &str = "gpu_memory_used_ratio";
    /// GPU utilisation as a fraction 0..1.
    pub const GPU_UTILIZATION: &str = "gpu_utilization";
    pub const GPU_TEMPERATURE_CELSIUS: &str = "gpu_temperature_celsius";
    pub const GPU_POWER_WATTS: &str = "gpu_power_watts";
    /// Profiling (DCGM DCP) ratios 0..1 per GPU, from dcgm-exporter's `DCGM_FI_PROF_*` fields:
    /// time at least one warp is resident on an SM, resident warps / the SM's maximum, cycles the
    /// tensor (HMMA) pipe, the device memory interface and the graphics engine are active.
    pub const GPU_SM_ACTIVE_RATIO: &str = "gpu_sm_active_ratio";
    pub const GPU_SM_OCCUPANCY_RATIO: &str = "gpu_sm_occupancy_ratio";
    pub const GPU_TENSOR_ACTIVE_RATIO: &str = "gpu_tensor_active_ratio";
    pub const GPU_DRAM_ACTIVE_RATIO: &str = "gpu_dram_active_ratio";
    pub const GPU_GR_ENGINE_ACTIVE_RATIO: &str = "gpu_gr_engine_active_ratio";
    /// The last XID error code the GPU reported (dcgm-exporter `DCGM_FI_DEV_XID_ERRORS`); 0: none.
    pub const GPU_XID_LAST_CODE: &str = "gpu_xid_last_code";

    /// Latency percentile signal name, e.g. `latency_signal("ttft", "p99")` = `ttft_p99_seconds`.
    pub fn latency_signal(metric: &str, quantile: &str) -> String {
        format!("{metric}_{quantile}_seconds")
    }
}

/// One value of one normalised signal.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SignalPoint {
    /// Model the value belongs to; empty for device-level values not tied to a model.
    pub model_id: String,
    pub signal: String,
    pub value: f64,
    /// Where it came from: `scrape:vllm`, `scrape:dcgm`, `otlp`, `nvml`, `proxy`…
    pub source: String,
    pub runtime: String,
    pub instance: String,
    /// GPU UUID (or index) for device-level signals; empty otherwise.
    pub device_id: String,
    pub timestamp_unix_ms: i64,
    /// Extra facts about the value (for example the bucket error bound of a histogram quantile).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub notes: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct SignalKey {
    model_id: String,
    signal: String,
    instance: String,
    device_id: String,
}

#[derive(Debug)]
struct Series {
    latest: SignalPoint,
    history: VecDeque<(i64, f64)>,
}

/// The latest value of each (model, signal, instance, device), plus a bounded history.
#[derive(Debug)]
pub struct SignalBoard {
    series: BTreeMap<SignalKey, Series>,
    history_len: usize,
    max_series: usize,
    refused: u64,
    /// What each scrape of a serving instance added (`crate::counts`), for per-replica tests.
    counts: crate::counts::CountsLog,
    /// Which serving instance each GPU works for (`crate::placement`).
    placement: crate::placement::Placement,
    /// The scraped counts per minute for the last hour, for runtime-side latency and rates.
    runtime_windows: crate::runtime_latency::RuntimeWindows,
}

impl Default for SignalBoard {
    fn default() -> Self {
        SignalBoard::new(720, 100_000)
    }
}

impl SignalBoard {
    /// `history_len` points kept per series; at most `max_series` series (new ones refused beyond).
    pub fn new(history_len: usize, max_series: usize) -> SignalBoard {
        SignalBoard {
            series: BTreeMap::new(),
            history_len: history_len.max(1),
            max_series,
            refused: 0,
            counts: crate::counts::CountsLog::default(),
            placement: crate::placement::Placement::default(),
            runtime_windows: crate::runtime_latency::RuntimeWindows::default(),
        }
    }

    /// Keep what one scrape of one (model, instance) added (read through `counts`).
    /// The counts also go into the per-minute runtime windows (read through `runtime_windows`).
    pub fn record_counts(&mut self, c: crate::counts::ScrapeCounts) {
        self.runtime_windows.record(&c);
        self.counts.push(c);
    }

    /// The runtime's own latency histograms and counters, per minute for the last hour.
    pub fn runtime_windows(&self) -> &crate::runtime_latency::RuntimeWindows {
        &self.runtime_windows
    }

    /// The log of scraped counts, read incrementally by sequence number.
    pub fn counts(&self) -> &crate::counts::CountsLog {
        &self.counts
    }

    /// Remember where a scraped serving instance or GPU runs (read through `placement`).
    pub fn record_placement(&mut self, p: crate::placement::Placed, now_unix_ms: i64) {
        self.placement.observe(p, now_unix_ms);
    }

    /// Which serving instance each GPU works for.
    pub fn placement(&self) -> &crate::placement::Placement {
        &self.placement
    }

    /// Record a value. Non-finite values are ignored (returns false).
    pub fn update(&mut self, point: SignalPoint) -> bool {
        if !point.value.is_finite() {
            return false;
        }
        let key = SignalKey {
            model_id: point.model_id.clone(),
            signal: point.signal.clone(),
            instance: point.instance.clone(),
            device_id: point.device_id.clone(),
        };
        if let Some(s) = self.series.get_mut(&key) {
            if s.history.len() == self.history_len {
                s.history.pop_front();
            }
            s.history.push_back((point.timestamp_unix_ms, point.value));
            s.latest = point;
            return true;
        }
        if self.series.len() >= self.max_series {
            self.refused += 1;
            return false;
        }
        let mut history = VecDeque::with_capacity(self.history_len.min(64));
        history.push_back((point.timestamp_unix_ms, point.value));
        self.series.insert(
            key,
            Series {
                latest: point,
                history,
            },
        );
        true
    }

    /// Latest points of one model (or of every model when `None`), sorted by signal.
    pub fn latest(&self, model: Option<&str>) -> Vec<SignalPoint> {
        self.series
            .iter()
            .filter(|(k, _)| model.is_none_or(|m| k.model_id == m))
            .map(|(_, s)| s.latest.clone())
            .collect()
    }

    /// Latest points of device-level signals for one device (or all devices).
    pub fn devices(&self) -> Vec<SignalPoint> {
        self.series
            .iter()
            .filter(|(k, _)| !k.device_id.is_empty())
            .map(|(_, s)| s.latest.clone())
            .collect()
    }

    /// The recent (timestamp, value) history of one series.
    pub fn history(
        &self,
        model_id: &str,
        signal: &str,
        instance: &str,
        device_id: &str,
    ) -> Vec<(i64, f64)> {
        let key = SignalKey {
            model_id: model_id.into(),
            signal: signal.into(),
            instance: instance.into(),
            device_id: device_id.into(),
        };
        self.series
            .get(&key)
            .map(|s| s.history.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Every series whose latest point passes `keep`: that point and the series' history since
    /// `since_unix_ms`, in key order (model, signal, instance, device).
    pub fn series_where(
        &self,
        since_unix_ms: i64,
        mut keep: impl FnMut(&SignalPoint) -> bool,
    ) -> Vec<(SignalPoint, Vec<(i64, f64)>)> {
        self.series
            .values()
            .filter(|s| keep(&s.latest))
            .map(|s| {
                let hist = s
                    .history
                    .iter()
                    .copied()
                    .filter(|(t, _)| *t >= since_unix_ms)
                    .collect();
                (s.latest.clone(), hist)
            })
            .collect()
    }

    pub fn models(&self) -> Vec<String> {
        let mut m: Vec<String> = self
            .series
            .keys()
            .map(|k| k.model_id.clone())
            .filter(|m| !m.is_empty())
            .collect();
        m.dedup();
        m
    }

    /// Drop series whose latest point is older than `max_age_ms`.
    pub fn evict_older_than(&mut self, now_unix_ms: i64, max_age_ms: i64) -> usize {
        let before = self.series.len();
        self.series
            .retain(|_, s| now_unix_ms - s.latest.timestamp_unix_ms <= max_age_ms);
        self.placement.evict_older_than(now_unix_ms, max_age_ms);
        before - self.series.len()
    }

    pub fn len(&self) -> usize {
        self.series.len()
    }

    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }

    pub fn refused(&self) -> u64 {
        self.refused
    }
}

/// The board shared between sources (writers) and the API and detectors (readers).
pub type SharedSignals = std::sync::Arc<std::sync::RwLock<SignalBoard>>;

#[cfg(test)]
mod tests {
    use super::*;

    fn point(model: &str, signal: &str, v: f64, ts: i64) -> SignalPoint {
        SignalPoint {
            model_id: model.into(),
            signal: signal.into(),
            value: v,
            source: "test".into(),
            runtime: "vllm".into(),
            instance: "i1".into(),
            device_id: String::new(),
            timestamp_unix_ms: ts,
            notes: BTreeMap::new(),
        }
    }

    #[test]
    fn keeps_latest_and_bounded_history() {
        let mut b = SignalBoard::new(3, 10);
        for i in 0..5 {
            assert!(b.update(point("m", names::KV_CACHE_USAGE, i as f64 / 10.0, i)));
        }
        assert!(!b.update(point("m", names::KV_CACHE_USAGE, f64::NAN, 9)));
        let latest = b.latest(Some("m"));
        assert_eq!(latest.len(), 1);
        assert_eq!(latest[0].value, 0.4);
        assert_eq!(
            b.history("m", names::KV_CACHE_USAGE, "i1", ""),
            vec![(2, 0.2), (3, 0.3), (4, 0.4)]
        );
        assert!(b.latest(Some("other")).is_empty());
        assert_eq!(b.models(), vec!["m".to_string()]);
    }

    #[test]
    fn series_where_filters_by_point_and_trims_history() {
        let mut b = SignalBoard::new(10, 10);
        for i in 0..4 {
            b.update(point("m", names::KV_CACHE_USAGE, 0.1 * i as f64, i * 1000));
            let mut gpu = point("m", names::GPU_MEMORY_USED_BYTES, 1e9 * i as f64, i * 1000);
            gpu.device_id = "GPU-0".into();
            b.update(gpu);
        }
        let devices = b.series_where(2000, |p| !p.device_id.is_empty());
        assert_eq!(devices.len(), 1);
        assert_eq!(devices[0].0.signal, names::GPU_MEMORY_USED_BYTES);
        assert_eq!(devices[0].1, vec![(2000, 2e9), (3000, 3e9)]);
        assert_eq!(b.series_where(0, |p| p.model_id == "m").len(), 2);
        assert!(b.series_where(0, |p| p.model_id == "x").is_empty());
    }

    #[test]
    fn refuses_series_beyond_the_limit_and_evicts_old() {
        let mut b = SignalBoard::new(4, 2);
        assert!(b.update(point("a", "x", 1.0, 0)));
        assert!(b.update(point("b", "x", 1.0, 1000)));
        assert!(!b.update(point("c", "x", 1.0, 0)));
        assert_eq!(b.refused(), 1);
        assert_eq!(b.evict_older_than(1500, 1000), 1);
        assert_eq!(b.len(), 1);
    }
}
