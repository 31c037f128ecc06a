// Local embeddings of proxied responses (`capture.embeddings`): the settings, and one analysis
// thread behind a bounded queue that embeds each completion, drops its text and sets the vector.

#[cfg(feature = "embeddings")]
pub mod bert;

use crate::kernel::queue::{Detour, TelemetryQueue};
use crate::kernel::raw_text::RawText;
use crate::kernel::telemetry::Metrics;
use prometheus_client::metrics::counter::Counter;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{SyncSender, TrySendError};
use tokenwatch_core::model::RequestRecord;

#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    /// The model directory or one of its files cannot be used.
    #[error("capture.embeddings.model_dir: {}: {message}", path.display())]
    Model { path: PathBuf, message: String },
    #[error(
        "capture.embeddings.enabled: this tokenwatch was built without the `embeddings` feature (off by default): build it with `cargo build --release --features embeddings`"
    )]
    NotBuilt,
    #[error("embedding failed: {0}")]
    Compute(String),
    #[error("starting the embedding thread: {0}")]
    Thread(std::io::Error),
}

/// A loaded model that runs on its own thread pool of `threads` threads.
#[cfg(feature = "embeddings")]
pub struct Embedder {
    model: bert::SentenceEmbedder,
    pool: rayon::ThreadPool,
}

#[cfg(feature = "embeddings")]
impl Embedder {
    pub fn load(dir: &Path, threads: usize) -> Result<Embedder, EmbedError> {
        let model = bert::SentenceEmbedder::load(dir)?;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(|i| format!("tokenwatch-embed-{i}"))
            .build()
            .map_err(|e| EmbedError::Thread(std::io::Error::other(e)))?;
        Ok(Embedder { model, pool })
    }

    /// The unit-length embedding of `text`.
    pub fn embed(&self, text: &str) -> Result<Vec<f32>, EmbedError> {
        self.pool.install(|| self.model.embed(text))
    }

    /// Token ids of `text` (what `embed` reads), for comparing tokenizer and model cost.
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>, EmbedError> {
        self.model.tokenize(text)
    }

    pub fn dim(&self) -> usize {
        self.model.dim()
    }
}

#[cfg(not(feature = "embeddings"))]
pub struct Embedder(());

#[cfg(not(feature = "embeddings"))]
impl Embedder {
    pub fn load(_dir: &Path, _threads: usize) -> Result<Embedder, EmbedError> {
        Err(EmbedError::NotBuilt)
    }

    pub fn embed(&self, _text: &str) -> Result<Vec<f32>, EmbedError> {
        Err(EmbedError::NotBuilt)
    }
}

/// The first `max_chars` characters of `text` (cut on a character boundary).
pub fn cut_chars(text: &str, max_chars: usize) -> &str {
    match text.char_indices().nth(max_chars) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}

/// The proxy side of the embedder's queue: `offer` never waits.
#[derive(Clone)]
pub struct EmbedQueue {
    tx: SyncSender<(RequestRecord, Box<RawText>)>,
    dropped: Counter,
}

impl Detour for EmbedQueue {
    /// Queue a record with its response bytes; a full queue hands them back (counted), and
    /// the caller sends the record on without an embedding.
    fn offer(
        &self,
        record: RequestRecord,
        raw: Box<RawText>,
    ) -> Result<(), (RequestRecord, Box<RawText>)> {
        match self.tx.try_send((record, raw)) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(back)) => {
                self.dropped.inc();
                Err(back)
            }
            Err(TrySendError::Disconnected(back)) => Err(back),
        }
    }
}

/// With `capture.embeddings.enabled`: loads the model (an error names the key and the path),
/// starts the embedding thread and returns `queue` routed through it; else `queue` unchanged.
/// The thread sends each record on through `queue` and ends when the returned queue's last
/// clone is dropped.
pub fn start(
    cfg: &crate::capture::CaptureConfig,
    queue: TelemetryQueue,
    metrics: &Metrics,
    priority: crate::runtimes::AnalysisPriority,
) -> Result<TelemetryQueue, EmbedError> {
    let e = &cfg.embeddings;
    if !e.enabled {
        return Ok(queue);
    }
    let dir = e.model_dir.as_deref().ok_or_else(|| EmbedError::Model {
        path: PathBuf::new(),
        message: "is required when capture.embeddings.enabled is true".into(),
    })?;
    let embedder = Embedder::load(dir, e.threads)?;
    let dropped = Counter::default();
    let computed = Counter::default();
    let failed = Counter::default();
    metrics.register(
        "tokenwatch_embeddings_dropped",
        "Responses not embedded because the embedding queue was full (capture.embeddings)",
        dropped.clone(),
    );
    metrics.register(
        "tokenwatch_embeddings_computed",
        "Responses embedded by the local model (capture.embeddings)",
        computed.clone(),
    );
    metrics.register(
        "tokenwatch_embeddings_failed",
        "Responses whose embedding failed (capture.embeddings)",
        failed.clone(),
    );
    let (tx, rx) = std::sync::mpsc::sync_channel(e.queue_capacity);
    let worker = Worker {
        embedder,
        max_chars: e.max_chars,
        keep_text: cfg.text,
        forward: queue.clone(),
        computed,
        failed,
    };
    std::thread::Builder::new()
        .name("tokenwatch-embed".into())
        .spawn(move || {
            crate::runtimes::lower_current_thread_priority(priority);
            for (record, raw) in rx {
                worker.handle(record, raw);
            }
        })
        .map_err(EmbedError::Thread)?;
    tracing::info!(model_dir = %dir.display(), "local embeddings of responses are on (capture.embeddings)");
    Ok(queue.with_embeddings(EmbedQueue { tx, dropped }))
}

struct Worker {
    embedder: Embedder,
    max_chars: usize,
    keep_text: bool,
    forward: TelemetryQueue,
    computed: Counter,
    failed: Counter,
}

impl Worker {
    fn handle(&self, mut record: RequestRecord, raw: Box<RawText>) {
        if record.embedding.is_empty() {
            let text = crate::capture::completion_text(&raw);
            let text = cut_chars(&text, self.max_chars);
            if !text.trim().is_empty() {
                match self.embedder.embed(text) {
                    Ok(v) => {
                        record.embedding = v;
                        self.computed.inc();
                    }
                    Err(e) => {
                        self.failed.inc();
                        tracing::debug!(request_id = %record.request_id, error = %e, "response not embedded");
                    }
                }
            }
        }
        // The response bytes go on only for text capture, which masks them; else dropped here.
        let raw = self.keep_text.then_some(raw);
        self.forward.submit_with_text(record, raw);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::EmbeddingsConfig;

    #[test]
    fn cut_chars_keeps_whole_characters() {
        assert_eq!(cut_chars("héllo", 2), "hé");
        assert_eq!(cut_chars("héllo", 10), "héllo");
        assert_eq!(cut_chars("日本語", 1), "日");
        assert_eq!(cut_chars("", 3), "");
    }

    #[test]
    fn validation_names_the_key() {
        let on = EmbeddingsConfig {
            enabled: true,
            ..Default::default()
        };
        assert_eq!(on.validate().unwrap_err().0, "capture.embeddings.model_dir");
        let zero = EmbeddingsConfig {
            max_chars: 0,
            ..Default::default()
        };
        assert_eq!(
            zero.validate().unwrap_err().0,
            "capture.embeddings.max_chars"
        );
        let threads = EmbeddingsConfig {
            threads: 0,
            ..Default::default()
        };
        assert_eq!(
            threads.validate().unwrap_err().0,
            "capture.embeddings.threads"
        );
        assert!(EmbeddingsConfig::default().validate().is_ok());
    }

    #[cfg(feature = "embeddings")]
    #[test]
    fn a_missing_model_dir_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let err = Embedder::load(&missing, 1).err().unwrap().to_string();
        assert!(err.starts_with("capture.embeddings.model_dir: "), "{err}");
        assert!(err.contains(&missing.display().to_string()), "{err}");
        std::fs::write(dir.path().join("config.json"), "{").unwrap();
        let err = Embedder::load(dir.path(), 1).err().unwrap().to_string();
        assert!(err.contains("config.json"), "{err}");
    }
}
