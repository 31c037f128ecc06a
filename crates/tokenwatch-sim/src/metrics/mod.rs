// Engine statistics (vLLM-style counters, gauges, histograms) and their
// Prometheus text rendering together with the simulated dcgm-exporter series.

mod histogram;
mod render;
mod stats;

pub use histogram::{Histogram, ITL_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS, token_buckets};
pub use render::{Exporters, MetricsInput, render_exporters, render_metrics};
pub use stats::{EngineStats, FinishReason};
