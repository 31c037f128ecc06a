// The pipeline between sources and everything downstream: a bounded telemetry queue that
// never blocks a request, and one thread that settles each record's identity (masked labels, a
// unique request id), resolves its model id through the configured aliases and admission, prices
// it (`pricing`), then aggregates, stores and exports each batch.

mod labels;
pub mod pricing;
pub mod proxy_span;
pub mod span_sampler;
mod store_sink;
mod store_writer;
pub mod supervise;
pub mod trace_components;

pub use proxy_span::{ProxySpanBuilder, ProxySpanSink};
pub use store_sink::StoreSink;
pub use store_writer::{StoreHealth, StoreWriter, StoreWriterConfig, StoreWriterThread};

use crate::capture::TextCapture;
pub use crate::kernel::queue::{Detour, Queued, TelemetryQueue};
use crate::kernel::telemetry::Metrics;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokenwatch_core::aggregate::{Aggregator, Rollup};
use tokenwatch_core::clock::now_unix_ms;
use tokenwatch_core::model::{FirstToken, RequestRecord};
use tokio::sync::mpsc;

#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("{sink}: {message}")]
    Failed { sink: &'static str, message: String },
}

/// A destination for finished request records (store, exporters). A new sink is one new file
/// implementing this trait, added to the list in `app.rs`.
pub trait RecordSink: Send {
    fn name(&self) -> &'static str;
    fn consume(&mut self, batch: &[RequestRecord]) -> Result<(), SinkError>;
    /// The pipeline's call: the batch shared, so that a sink keeping the records past the call
    /// (the store's writer queue) takes a reference instead of a copy. Default: `consume`.
    fn consume_shared(&mut self, batch: &Arc<Vec<RequestRecord>>) -> Result<(), SinkError> {
        self.consume(batch)
    }
    /// Per-minute sketch roll-ups completed by the aggregator.
    fn consume_rollups(&mut self, _rollups: &[Rollup]) -> Result<(), SinkError> {
        Ok(())
    }
    /// First tokens of responses still streaming (see `FirstToken`); most sinks wait for the
    /// record instead.
    fn consume_first_tokens(&mut self, _first: &[FirstToken]) -> Result<(), SinkError> {
        Ok(())
    }
    /// Housekeeping at most every `maintenance_interval` (retention, for example).
    fn maintain(&mut self, _now_unix_ms: i64) -> Result<(), SinkError> {
        Ok(())
    }
}

pub struct PipelineConfig {
    pub queue_capacity: usize,
    pub batch_max: usize,
    pub flush_interval: Duration,
    pub maintenance_interval: Duration,
    /// Priority of the pipeline thread (`runtime.analysis_niceness` / `analysis_idle`).
    pub thread_priority: crate::runtimes::AnalysisPriority,
    /// Masks captured text (`capture.text`); None: capture is off.
    pub text_capture: Option<TextCapture>,
    /// Other ids of a model (`models.aliases`): records and first tokens naming one are
    /// counted under the model's id.
    pub model_aliases: crate::kernel::models::SharedAliases,
    /// Model ids beyond `models.max_unlisted` are counted as `__other__` (after the aliases).
    /// None: every id is counted as itself (unit tests, proxy replicas: their aggregator admits).
    pub model_admission: Option<crate::kernel::models::ModelAdmission>,
    /// The price table (`pricing`) each record's `cost_usd` comes from; empty: no record is
    /// priced (and none counted as unpriced).
    pub prices: Arc<pricing::PriceTable>,
    /// Label values and request ids masked (`capture.mask.telemetry`) and request ids made
    /// unique among this many recent ones (`labels::RecordIdentity`). None: records keep them as
    /// sent (unit tests, proxy replicas: their aggregator settles them).
    pub record_identity: Option<RecordIdentityConfig>,
    /// Where the pipeline's status shows (`/readyz`'s `pipeline`): `ok`, or the panics it
    /// caught (`supervise`). None: nowhere (unit tests).
    pub health: Option<crate::sources::Components>,
}

/// How records' label values and request ids are settled (`labels::RecordIdentity`).
pub struct RecordIdentityConfig {
    /// The masker of received free text, while `capture.mask.telemetry` is on.
    pub masker: Option<Arc<crate::capture::mask::Masker>>,
    /// Request ids remembered to catch a reuse.
    pub recent_ids: usize,
}

impl RecordIdentityConfig {
    pub fn new(masker: Option<Arc<crate::capture::mask::Masker>>) -> RecordIdentityConfig {
        RecordIdentityConfig {
            masker,
            recent_ids: labels::DEFAULT_RECENT_IDS,
        }
    }
}

/// Handle to the running pipeline thread.
pub struct Pipeline {
    thread: Option<std::thread::JoinHandle<()>>,
    /// Set by `close_and_join`: the worker stops accepting records and drains what is queued.
    close: Arc<AtomicBool>,
}

impl Pipeline {
    /// Start the pipeline thread. It runs until every `TelemetryQueue` clone is dropped,
    /// then flushes what is left and returns. Without an aggregator (a proxy replica, `role:
    /// proxy`), records only reach the sinks.
    pub fn start(
        cfg: PipelineConfig,
        aggregator: Option<Arc<Mutex<Aggregator>>>,
        sinks: Vec<Box<dyn RecordSink>>,
        metrics: Arc<Metrics>,
    ) -> (Pipeline, TelemetryQueue) {
        let (tx, rx) = mpsc::channel(cfg.queue_capacity);
        let (first, first_rx) = mpsc::channel(cfg.queue_capacity);
        metrics.queue_capacity.set(cfg.queue_capacity as i64);
        let queue = TelemetryQueue::new(tx, first, metrics.clone());
        let handle = tokio::runtime::Handle::current();
        let close = Arc::new(AtomicBool::new(false));
        let watch = supervise::PanicWatch::new("pipeline", cfg.health.clone(), &metrics);
        let mut cfg = cfg;
        let admission = cfg
            .model_admission
            .take()
            .map(|rule| Admission::new(rule, &metrics));
        let identity = cfg
            .record_identity
            .take()
            .map(|c| labels::RecordIdentity::new(c.masker, c.recent_ids, &metrics));
        let pricer =
            (!cfg.prices.is_empty()).then(|| pricing::Pricer::new(cfg.prices.clone(), &metrics));
        let worker = Worker {
            cfg,
            admission,
            identity,
            pricer,
            aggregator,
            sinks,
            metrics,
            rx,
            first_rx,
            handle,
            close: close.clone(),
            batch: Vec::new(),
            firsts: Vec::new(),
            in_hand: 0,
            watch,
        };
        let thread = std::thread::Builder::new()
            .name("tokenwatch-pipeline".into())
            .spawn(move || {
                crate::runtimes::lower_current_thread_priority(worker.cfg.thread_priority);
                let health = worker.cfg.health.clone();
                let metrics = worker.metrics.clone();
                // `run` catches the panics of its work; one that escapes it (from the catching
                // itself) still ends the thread visibly.
                if let Err(payload) =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| worker.run()))
                {
                    let why = format!(
                        "the pipeline thread ended on a panic ({}); records sent to it since are counted as dropped (reason shutting_down)",
                        supervise::panic_message(&*payload)
                    );
                    supervise::PanicWatch::new("pipeline", health, &metrics).stopped(&why);
                }
            })
            .expect("spawning the pipeline thread");
        (
            Pipeline {
                thread: Some(thread),
                close,
            },
            queue,
        )
    }

    /// Wait for the pipeline to drain (after all queue handles are dropped).
    pub fn join(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// Stop accepting records even while queue handles remain (streams still open when the
    /// shutdown grace ran out hold them), process everything already queued, and wait.
    pub fn close_and_join(self) {
        self.close.store(true, Ordering::Relaxed);
        self.join();
    }
}

/// Model admission (`models.max_unlisted`) on the pipeline thread, and how it went.
struct Admission {
    rule: crate::kernel::models::ModelAdmission,
    folded: prometheus_client::metrics::counter::Counter,
    admitted: prometheus_client::metrics::gauge::Gauge,
}

impl Admission {
    fn new(rule: crate::kernel::models::ModelAdmission, metrics: &Metrics) -> Admission {
        let a = Admission {
            rule,
            folded: Default::default(),
            admitted: Default::default(),
        };
        metrics.register(
            "tokenwatch_models_folded",
            "Records and first tokens counted under model __other__: their model id is listed by no upstream and the unlisted ids already counted fill models.max_unlisted",
            a.folded.clone(),
        );
        metrics.register(
            "tokenwatch_models_unlisted_admitted",
            "Model ids counted as themselves that no upstream lists (at most models.max_unlisted)",
            a.admitted.clone(),
        );
        a
    }

    /// Admits `id` or renames it `__other__` (counted), and shows how many ids are admitted.
    fn admit(&mut self, id: &mut String, now_ms: i64) {
        if !self.rule.admit(id, now_ms) {
            self.folded.inc();
        }
        self.admitted.set(self.rule.admitted() as i64);
    }
}

struct Worker {
    cfg: PipelineConfig,
    /// `cfg.model_admission`, taken out at start.
    admission: Option<Admission>,
    /// Puts `cost_usd` on records; None when the price table is empty.
    pricer: Option<pricing::Pricer>,
    /// `cfg.record_identity`, taken out at start.
    identity: Option<labels::RecordIdentity>,
    aggregator: Option<Arc<Mutex<Aggregator>>>,
    sinks: Vec<Box<dyn RecordSink>>,
    metrics: Arc<Metrics>,
    rx: mpsc::Receiver<Queued>,
    first_rx: mpsc::Receiver<FirstToken>,
    handle: tokio::runtime::Handle,
    close: Arc<AtomicBool>,
    /// Records received, not yet processed.
    batch: Vec<Queued>,
    /// First tokens received, not yet processed.
    firsts: Vec<FirstToken>,
    /// Records being processed (taken out of `batch`): lost if processing panics.
    in_hand: usize,
    /// Panics caught in the loop: counted, logged, shown in `/readyz`.
    watch: supervise::PanicWatch,
}

/// How often the pipeline asks the aggregator for completed minutes.
const ROLL_UP_EVERY: Duration = Duration::from_secs(1);

impl Worker {
    /// The loop, restarted after each panic it catches: what was in hand is dropped and
    /// counted (`supervise`), the queues and every sink's state stay, the next batch is taken.
    fn run(mut self) {
        self.batch.reserve(self.cfg.batch_max);
        self.firsts.reserve(self.cfg.batch_max);
        let mut firsts_open = true;
        let mut last_maintenance = std::time::Instant::now();
        let mut last_roll_up = std::time::Instant::now();
        let mut refusing = false;
        loop {
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.run_loop(
                    &mut firsts_open,
                    &mut last_maintenance,
                    &mut last_roll_up,
                    &mut refusing,
                )
            }));
            match outcome {
                Ok(()) => return,
                Err(payload) => {
                    // The records being processed and those received after them; first tokens
                    // uncounted, as when their queue is full (their records carry the time).
                    let lost = (std::mem::take(&mut self.in_hand) + self.batch.len()) as u64;
                    self.batch.clear();
                    self.firsts.clear();
                    self.metrics.dropped_records_panic.inc_by(lost);
                    self.watch.caught(&*payload, lost);
                }
            }
        }
    }

    fn run_loop(
        &mut self,
        firsts_open: &mut bool,
        last_maintenance: &mut std::time::Instant,
        last_roll_up: &mut std::time::Instant,
        refusing: &mut bool,
    ) {
        loop {
            if !*refusing && self.close.load(Ordering::Relaxed) {
                // Queued records stay receivable; new sends fail (and are counted as dropped).
                self.rx.close();
                self.first_rx.close();
                *refusing = true;
            }
            let flush = self.cfg.flush_interval;
            let max = self.cfg.batch_max;
            let (rx, first_rx) = (&mut self.rx, &mut self.first_rx);
            let (batch, firsts) = (&mut self.batch, &mut self.firsts);
            let received = self.handle.block_on(async {
                tokio::time::timeout(flush, async {
                    tokio::select! {
                        // First tokens first: each is sent before its request's record.
                        biased;
                        n = first_rx.recv_many(firsts, max), if *firsts_open => {
                            *firsts_open = n > 0;
                            None
                        }
                        n = rx.recv_many(batch, max) => Some(n),
                    }
                })
                .await
            });
            let closed = matches!(received, Ok(Some(0)));
            // Take what else is queued, records first, so that a steady flow of first tokens
            // cannot starve the records (the select above prefers first tokens); then first
            // tokens, all of them: each is sent before its record, so every record in hand has
            // its first token in hand too, and the sinks see the first token first.
            while self.batch.len() < max
                && let Ok(r) = self.rx.try_recv()
            {
                self.batch.push(r);
            }
            while let Ok(f) = self.first_rx.try_recv() {
                self.firsts.push(f);
            }
            self.metrics.queue_depth.set(self.rx.len() as i64);
            if !self.firsts.is_empty() {
                let mut firsts = std::mem::take(&mut self.firsts);
                self.process_first_tokens(&mut firsts);
                firsts.clear();
                self.firsts = firsts;
            }
            if !self.batch.is_empty() {
                let mut batch = std::mem::take(&mut self.batch);
                self.in_hand = batch.len();
                self.process(&mut batch);
                self.in_hand = 0;
                self.batch = batch;
            }
            // Minutes are handed out 5 s after they end (ROLLUP_GRACE_MS), so looking once a
            // second is enough; scanning every series after every batch is not needed.
            if closed || last_roll_up.elapsed() >= ROLL_UP_EVERY {
                *last_roll_up = std::time::Instant::now();
                self.roll_up(now_unix_ms());
            }
            if last_maintenance.elapsed() >= self.cfg.maintenance_interval {
                *last_maintenance = std::time::Instant::now();
                self.maintain(now_unix_ms());
            }
            if closed {
                tracing::info!("telemetry queue closed; pipeline drained");
                return;
            }
        }
    }

    /// Masks captured text, then hands the records to the aggregator and every sink.
    fn process(&mut self, queued: &mut Vec<Queued>) {
        let now_ms = tokenwatch_core::clock::now_unix_ms();
        let batch: Vec<RequestRecord> = queued
            .drain(..)
            .filter_map(|q| {
                let (mut record, raw) = q.into_parts();
                if let Some(identity) = &mut self.identity
                    && !identity.settle(&mut record)
                {
                    return None;
                }
                self.cfg.model_aliases.apply(&mut record.labels.model_id);
                if let Some(a) = &mut self.admission {
                    a.admit(&mut record.labels.model_id, now_ms);
                }
                crate::kernel::failpoint::panic_on_model("pipeline", &record.labels.model_id);
                if let Some(p) = &self.pricer {
                    p.price(&mut record);
                }
                if let (Some(raw), Some(capture)) = (raw, &self.cfg.text_capture) {
                    record.text = Some(Box::new(capture.finish(&raw)));
                }
                Some(record)
            })
            .collect();
        let batch = Arc::new(batch);
        if let Some(aggregator) = &self.aggregator {
            let mut agg = aggregator.lock().unwrap_or_else(|p| p.into_inner());
            for r in batch.iter() {
                agg.observe(r);
            }
            self.metrics
                .aggregator_series
                .set(agg.series_count() as i64);
            self.metrics
                .aggregator_refused_series
                .set(agg.refused_series() as i64);
        }
        self.metrics.pipeline_records.inc_by(batch.len() as u64);
        for sink in &mut self.sinks {
            if let Err(e) = sink.consume_shared(&batch) {
                tracing::warn!(sink = sink.name(), error = %e, "sink failed on a batch");
            }
        }
    }

    fn process_first_tokens(&mut self, firsts: &mut [FirstToken]) {
        let now_ms = tokenwatch_core::clock::now_unix_ms();
        for f in firsts.iter_mut() {
            if let Some(identity) = &mut self.identity {
                identity.settle_first(f);
            }
            self.cfg.model_aliases.apply(&mut f.model_id);
            if let Some(a) = &mut self.admission {
                a.admit(&mut f.model_id, now_ms);
            }
        }
        for sink in &mut self.sinks {
            if let Err(e) = sink.consume_first_tokens(firsts) {
                tracing::warn!(sink = sink.name(), error = %e, "sink failed on first tokens");
            }
        }
    }

    fn roll_up(&mut self, now: i64) {
        let Some(aggregator) = &self.aggregator else {
            return;
        };
        let rollups = {
            let mut agg = aggregator.lock().unwrap_or_else(|p| p.into_inner());
            agg.drain_rollups(now)
        };
        if rollups.is_empty() {
            return;
        }
        for sink in &mut self.sinks {
            if let Err(e) = sink.consume_rollups(&rollups) {
                tracing::warn!(sink = sink.name(), error = %e, "sink failed on roll-ups");
            }
        }
    }

    fn maintain(&mut self, now: i64) {
        if let Some(aggregator) = &self.aggregator {
            let mut agg = aggregator.lock().unwrap_or_else(|p| p.into_inner());
            let evicted = agg.evict_idle(now);
            if evicted > 0 {
                tracing::debug!(evicted, "idle series evicted");
            }
        }
        for sink in &mut self.sinks {
            if let Err(e) = sink.maintain(now) {
                tracing::warn!(sink = sink.name(), error = %e, "sink maintenance failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenwatch_core::aggregate::AggregatorConfig;

    /// Remembers the order in which first tokens and records reached it.
    struct Order(Arc<Mutex<Vec<(bool, String)>>>);

    impl RecordSink for Order {
        fn name(&self) -> &'static str {
            "order"
        }
        fn consume(&mut self, batch: &[RequestRecord]) -> Result<(), SinkError> {
            let mut seen = self.0.lock().unwrap();
            seen.extend(batch.iter().map(|r| (false, r.request_id.clone())));
            Ok(())
        }
        fn consume_first_tokens(&mut self, first: &[FirstToken]) -> Result<(), SinkError> {
            let mut seen = self.0.lock().unwrap();
            seen.extend(first.iter().map(|f| (true, f.request_id.clone())));
            Ok(())
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn first_tokens_reach_sinks_before_their_records_and_every_record_arrives() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let cfg = PipelineConfig {
            // Small, so that the first-token queue fills now and then (those are dropped).
            queue_capacity: 512,
            batch_max: 64,
            flush_interval: Duration::from_millis(20),
            maintenance_interval: Duration::from_secs(600),
            thread_priority: Default::default(),
            text_capture: None,
            model_aliases: Default::default(),
            model_admission: None,
            prices: Default::default(),
            record_identity: None,
            health: None,
        };
        let agg = Arc::new(Mutex::new(Aggregator::new(AggregatorConfig::default())));
        let (pipeline, queue) = Pipeline::start(
            cfg,
            Some(agg),
            vec![Box::new(Order(seen.clone()))],
            Arc::new(Metrics::new()),
        );
        // Many more first tokens than records, interleaved as streams would send them, in a
        // steady flow (paced so that the pipeline can keep up with it).
        let n = 20_000;
        let producer = std::thread::spawn(move || {
            for i in 0..n {
                let id = format!("r{i}");
                queue.first_token(FirstToken {
                    request_id: id.clone(),
                    model_id: "m".into(),
                    ..Default::default()
                });
                if i % 10 == 0 {
                    // A full queue would drop the record (a loaded machine can hold the pipeline
                    // thread back); wait for room instead, as this checks order, not capacity.
                    let r = RequestRecord {
                        request_id: id,
                        arrival_unix_ms: now_unix_ms(),
                        ..Default::default()
                    };
                    while !queue.try_submit_all(vec![r.clone()]) {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
                if i % 50 == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        });
        tokio::task::spawn_blocking(move || producer.join().unwrap())
            .await
            .unwrap();
        tokio::task::spawn_blocking(move || pipeline.join())
            .await
            .unwrap();
        let seen = seen.lock().unwrap();
        let records: Vec<usize> = (0..seen.len()).filter(|k| !seen[*k].0).collect();
        assert_eq!(records.len(), n / 10, "every record reached the sink");
        // First tokens finding their queue full are dropped by design (the record carries the
        // same time), so only those that arrived are checked: never after their record.
        assert!(seen.len() > records.len(), "first tokens reached the sink");
        for k in records {
            let id = &seen[k].1;
            assert!(
                !seen[k..].iter().any(|(first, f)| *first && f == id),
                "the record of {id} came before its first token"
            );
        }
    }

    /// Panics on a record whose request id starts with `boom`; keeps the others' ids.
    struct Fragile(Arc<Mutex<Vec<String>>>);

    impl RecordSink for Fragile {
        fn name(&self) -> &'static str {
            "fragile"
        }
        fn consume(&mut self, batch: &[RequestRecord]) -> Result<(), SinkError> {
            if batch.iter().any(|r| r.request_id.starts_with("boom")) {
                panic!("a sink broke on {}", batch.len());
            }
            let mut seen = self.0.lock().unwrap();
            seen.extend(batch.iter().map(|r| r.request_id.clone()));
            Ok(())
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panic_drops_the_batch_in_hand_counted_and_the_pipeline_goes_on() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let components = crate::sources::Components::default();
        let metrics = Arc::new(Metrics::new());
        let cfg = PipelineConfig {
            queue_capacity: 64,
            batch_max: 64,
            flush_interval: Duration::from_millis(10),
            maintenance_interval: Duration::from_secs(600),
            thread_priority: Default::default(),
            text_capture: None,
            model_aliases: Default::default(),
            model_admission: None,
            prices: Default::default(),
            record_identity: None,
            health: Some(components.clone()),
        };
        let (pipeline, queue) = Pipeline::start(
            cfg,
            None,
            vec![Box::new(Fragile(seen.clone()))],
            metrics.clone(),
        );
        assert_eq!(components.snapshot()["pipeline"], "ok");
        let record = |id: &str| RequestRecord {
            request_id: id.into(),
            arrival_unix_ms: now_unix_ms(),
            ..Default::default()
        };
        let wait_for = |n: usize| {
            let seen = seen.clone();
            async move {
                for _ in 0..500 {
                    if seen.lock().unwrap().len() >= n {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                panic!("{n} records never arrived");
            }
        };
        queue.submit(record("a"));
        wait_for(1).await;
        // The poison among three: its batch lost, counted (the worker may take the three in
        // one batch or as they come).
        assert!(queue.try_submit_all(vec![record("b"), record("boom"), record("c")]));
        for _ in 0..500 {
            if metrics.dropped_records_panic.get() > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        queue.submit(record("d"));
        let dropped = metrics.dropped_records_panic.get();
        wait_for(5 - dropped as usize).await;
        let got = seen.lock().unwrap().clone();
        assert!(
            dropped >= 1 && got.len() as u64 + dropped == 5,
            "{got:?} {dropped}"
        );
        assert!(got.contains(&"d".to_string()) && !got.contains(&"boom".to_string()));
        let status = components.snapshot()["pipeline"].clone();
        assert!(
            status.starts_with("error: panicked 1 time(s), last: a sink broke on"),
            "{status}"
        );
        drop(queue);
        tokio::task::spawn_blocking(move || pipeline.join())
            .await
            .unwrap();
    }
}
