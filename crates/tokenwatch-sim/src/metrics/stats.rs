// Live statistics of one engine: gauges refreshed every step, counters and
// histograms updated as sequences are scheduled, emit tokens and finish.

use serde::Serialize;

use super::histogram::{
    Histogram, ITL_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS, token_buckets,
};

/// Why a request ended (vLLM's `finished_reason` label values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    Stop,
    Length,
    Abort,
    Error,
}

impl FinishReason {
    pub const ALL: [FinishReason; 4] = [
        FinishReason::Stop,
        FinishReason::Length,
        FinishReason::Abort,
        FinishReason::Error,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::Error => "error",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Everything `/metrics` and `/admin/state` show about one engine.
#[derive(Debug, Clone)]
pub struct EngineStats {
    pub running: usize,
    pub waiting: usize,
    pub kv_total_blocks: u32,
    pub kv_used_blocks: u32,
    pub kv_leaked_blocks: u32,
    /// GPU memory leaked outside the KV pool by the `kv_leak` fault (bytes).
    pub leaked_bytes: u64,
    pub preemptions: u64,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    finished: [u64; 4],
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    pub queue: Histogram,
    pub inference: Histogram,
    pub prefill: Histogram,
    pub decode: Histogram,
    pub prompt_len: Histogram,
    pub generation_len: Histogram,
}

impl EngineStats {
    pub fn new(kv_total_blocks: u32, max_model_len: u32) -> EngineStats {
        let tokens = token_buckets(max_model_len);
        EngineStats {
            running: 0,
            waiting: 0,
            kv_total_blocks,
            kv_used_blocks: 0,
            kv_leaked_blocks: 0,
            leaked_bytes: 0,
            preemptions: 0,
            prompt_tokens: 0,
            generation_tokens: 0,
            prefix_queries: 0,
            prefix_hits: 0,
            finished: [0; 4],
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(REQUEST_LATENCY_BUCKETS),
            queue: Histogram::new(REQUEST_LATENCY_BUCKETS),
            inference: Histogram::new(REQUEST_LATENCY_BUCKETS),
            prefill: Histogram::new(REQUEST_LATENCY_BUCKETS),
            decode: Histogram::new(REQUEST_LATENCY_BUCKETS),
            prompt_len: Histogram::new(&tokens),
            generation_len: Histogram::new(&tokens),
        }
    }

    pub fn count_finished(&mut self, reason: FinishReason) {
        self.finished[reason.index()] += 1;
    }

    pub fn finished(&self, reason: FinishReason) -> u64 {
        self.finished[reason.index()]
    }

    /// KV-cache usage as a fraction 0..1, leaked blocks included.
    pub fn kv_usage(&self) -> f64 {
        if self.kv_total_blocks == 0 {
            return 0.0;
        }
        f64::from(self.kv_used_blocks + self.kv_leaked_blocks) / f64::from(self.kv_total_blocks)
    }
}
