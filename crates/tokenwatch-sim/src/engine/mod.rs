// One simulated inference engine per model: configuration, the messages and
// events exchanged with HTTP handlers, and the handle used to reach the task.

mod batcher;
mod kv;
mod sampling;
mod seq;
mod speed;
mod task;

pub use batcher::EngineCore;
pub use kv::KvCache;
pub use seq::{SeqEvent, SubmitRequest};
pub use speed::SpeedDrift;

use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::fault::FaultBoard;
use crate::metrics::EngineStats;

/// Static configuration of one engine (one model on one simulated GPU).
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub model: String,
    pub gpu_index: u32,
    pub max_num_seqs: usize,
    pub kv_blocks: u32,
    pub block_size: u32,
    pub max_model_len: u32,
    pub ttft_ms: f64,
    pub itl_ms: f64,
    pub batch_slowdown: f64,
    pub prefill_ms_per_token: f64,
    /// Amplitude of the slow speed drift (fraction; 0 = off), see [`SpeedDrift`].
    pub speed_drift: f64,
    /// Main period of the speed drift (seconds).
    pub speed_drift_period_s: f64,
    pub default_max_tokens: u32,
    pub seed: u64,
    pub gpu_total_bytes: u64,
    pub weights_bytes: u64,
    pub block_bytes: u64,
}

impl EngineConfig {
    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.block_size.max(1))
    }
}

/// Messages to the engine task.
#[derive(Debug)]
pub enum EngineMsg {
    Submit(SubmitRequest),
    /// The fault board changed (e.g. kv_leak disabled): re-read it now.
    FaultsChanged,
}

/// The engine task is gone (server shutting down).
#[derive(Debug, thiserror::Error)]
#[error("engine for model `{0}` is not running")]
pub struct EngineGone(pub String);

/// Cheap, cloneable handle to a running engine task.
#[derive(Clone, Debug)]
pub struct EngineHandle {
    config: Arc<EngineConfig>,
    tx: mpsc::UnboundedSender<EngineMsg>,
    stats: Arc<Mutex<EngineStats>>,
}

impl EngineHandle {
    /// Start the engine task on the current tokio runtime. It ends when every handle is dropped.
    pub fn spawn(config: EngineConfig, board: Arc<FaultBoard>) -> EngineHandle {
        let config = Arc::new(config);
        let core = EngineCore::new(Arc::clone(&config), board);
        let stats = core.stats_handle();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(task::run(core, rx));
        EngineHandle { config, tx, stats }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn model(&self) -> &str {
        &self.config.model
    }

    pub fn submit(&self, req: SubmitRequest) -> Result<(), EngineGone> {
        self.tx
            .send(EngineMsg::Submit(req))
            .map_err(|_| EngineGone(self.config.model.clone()))
    }

    pub fn faults_changed(&self) {
        // If the engine is gone there is nothing to notify.
        let _ = self.tx.send(EngineMsg::FaultsChanged);
    }

    /// A copy of the current statistics.
    pub fn stats(&self) -> EngineStats {
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
