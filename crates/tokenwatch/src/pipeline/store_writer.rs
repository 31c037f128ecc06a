// The store's own writer thread behind a bounded queue: records, spans, log records, roll-ups
// and retention reach the store in order, and a slow or unreachable store never holds the pipeline.

use crate::kernel::telemetry::Metrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokenwatch_core::model::RequestRecord;
use tokenwatch_store::{LogRow, RollupRow, SpanRow, Store, StoreError};

/// After this long without touching the store, the writer asks it for its stats, so that
/// readiness notices a store gone away while no records arrive.
const PROBE_AFTER: Duration = Duration::from_secs(10);
/// A store call still running after this long makes readiness report the store as slow.
const SLOW_AFTER: Duration = Duration::from_secs(5);

/// `store.write_queue_records`, the largest batch written in one call (`store.batch_rows`) and
/// how long rows are gathered before a call (`store.flush_interval`).
#[derive(Debug, Clone, Copy)]
pub struct StoreWriterConfig {
    /// Records, span and log rows queued or being written, at most; more are dropped and counted.
    pub queue_rows: usize,
    pub batch_max: usize,
    /// After the first row of a batch arrives, wait this long for more (up to `batch_max`)
    /// before writing; zero writes whatever is queued at once.
    pub flush_interval: Duration,
    /// Priority of the writer thread (the pipeline's, `runtime.analysis_niceness` / `analysis_idle`).
    pub priority: crate::runtimes::AnalysisPriority,
}

enum Work {
    /// Shared with the pipeline's batch (no copy is made to queue it).
    Records(Arc<Vec<RequestRecord>>),
    Spans(Vec<SpanRow>),
    Logs(Vec<LogRow>),
    Rollups(Vec<RollupRow>),
    Retention(i64),
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

/// Rows of one kind that never reached the store, by reason; each counter is fetched once
/// so that counting is one atomic add.
#[derive(Clone)]
struct Lost {
    queue_full: Counter,
    write_failed: Counter,
    shutdown: Counter,
}

impl Lost {
    fn register(metrics: &Metrics, name: &str, help: &str) -> Lost {
        let family = Family::<ReasonLabels, Counter>::default();
        let child = |reason: &str| {
            family
                .get_or_create(&ReasonLabels {
                    reason: reason.into(),
                })
                .clone()
        };
        let lost = Lost {
            queue_full: child("queue_full"),
            write_failed: child("write_failed"),
            shutdown: child("shutdown"),
        };
        metrics.register(name, help, family);
        lost
    }
}

/// What the writer thread last learnt of the store, for `/readyz` (no store call to read it).
#[derive(Default)]
pub struct StoreHealth {
    state: Mutex<HealthState>,
}

#[derive(Default)]
struct HealthState {
    /// When the store call now running started.
    busy_since: Option<Instant>,
    /// The last call's error; None once a call succeeds.
    last_error: Option<String>,
}

impl StoreHealth {
    /// Ok while the last store call succeeded and none has been running for `SLOW_AFTER`;
    /// otherwise why not.
    pub fn readiness(&self) -> Result<(), String> {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let slow = s
            .busy_since
            .map(|t| t.elapsed())
            .filter(|d| *d >= SLOW_AFTER);
        match (slow, &s.last_error) {
            (Some(d), Some(e)) => Err(format!(
                "slow or unreachable: a write has been waiting {}s; the last failed: {e}",
                d.as_secs()
            )),
            (Some(d), None) => Err(format!(
                "slow or unreachable: a write has been waiting {}s",
                d.as_secs()
            )),
            (None, Some(e)) => Err(e.clone()),
            (None, None) => Ok(()),
        }
    }

    fn begin(&self) {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .busy_since = Some(Instant::now());
    }

    fn end(&self, result: Result<(), String>) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.busy_since = None;
        s.last_error = result.err();
    }
}

struct Shared {
    capacity: usize,
    /// Records, span and log rows queued or being written.
    queued: AtomicUsize,
    /// Set when a drop for a full queue was logged; cleared when rows fit again.
    full_logged: AtomicBool,
    /// Set by `StoreWriterThread::finish`: past it, what is still queued is counted as lost.
    abandon_at: Mutex<Option<Instant>>,
    depth: Gauge,
}

impl Shared {
    /// When shutdown gives up on what is still queued (None until `finish` is called).
    fn abandon_at(&self) -> Option<Instant> {
        *self.abandon_at.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn release(&self, n: usize) {
        let left = self.queued.fetch_sub(n, Ordering::AcqRel).saturating_sub(n);
        self.depth.set(left as i64);
    }
}

/// The pipeline's side of the writer: every method queues and returns at once. Rows that find
/// the queue full are counted (`tokenwatch_store_{records,spans,logs}_dropped_total{reason}`).
#[derive(Clone)]
pub struct StoreWriter {
    tx: mpsc::Sender<Work>,
    shared: Arc<Shared>,
    records_lost: Lost,
    spans_lost: Lost,
    logs_lost: Lost,
    /// `traces.sampling`: spans pass through the sampler's thread, which forwards what it keeps.
    sampler: Option<super::span_sampler::SpanSampler>,
}

/// The writer thread; `finish` drains it once every `StoreWriter` is dropped.
pub struct StoreWriterThread {
    thread: Option<std::thread::JoinHandle<()>>,
    shared: Arc<Shared>,
    health: Arc<StoreHealth>,
}

impl StoreWriter {
    /// Start the writer thread on `store`, registering its metrics on `metrics`.
    pub fn start(
        store: Arc<dyn Store>,
        cfg: StoreWriterConfig,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<(StoreWriter, StoreWriterThread)> {
        let records_lost = Lost::register(
            &metrics,
            "tokenwatch_store_records_dropped",
            "Request records that never reached the store, by reason (queue_full, write_failed, shutdown)",
        );
        let spans_lost = Lost::register(
            &metrics,
            "tokenwatch_store_spans_dropped",
            "Spans (the proxy's and those received over OTLP) that never reached the store, by reason (queue_full, write_failed, shutdown)",
        );
        let logs_lost = Lost::register(
            &metrics,
            "tokenwatch_store_logs_dropped",
            "Log records received over OTLP that never reached the store, by reason (queue_full, write_failed, shutdown)",
        );
        let depth = Gauge::default();
        metrics.register(
            "tokenwatch_store_write_queue_rows",
            "Records, spans and log records queued for the store or being written",
            depth.clone(),
        );
        let capacity = Gauge::<i64>::default();
        capacity.set(cfg.queue_rows as i64);
        metrics.register(
            "tokenwatch_store_write_queue_capacity",
            "store.write_queue_records",
            capacity,
        );
        let shared = Arc::new(Shared {
            capacity: cfg.queue_rows,
            queued: AtomicUsize::new(0),
            full_logged: AtomicBool::new(false),
            abandon_at: Mutex::new(None),
            depth,
        });
        let health = Arc::new(StoreHealth::default());
        let (tx, rx) = mpsc::channel();
        let writer = Writer {
            store,
            rx,
            shared: shared.clone(),
            health: health.clone(),
            metrics,
            batch_max: cfg.batch_max.max(1),
            flush_interval: cfg.flush_interval,
            records_lost: records_lost.clone(),
            spans_lost: spans_lost.clone(),
            logs_lost: logs_lost.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("tokenwatch-store-writer".into())
            .spawn(move || {
                crate::runtimes::lower_current_thread_priority(cfg.priority);
                writer.run()
            })?;
        Ok((
            StoreWriter {
                tx,
                shared: shared.clone(),
                records_lost,
                spans_lost,
                logs_lost,
                sampler: None,
            },
            StoreWriterThread {
                thread: Some(thread),
                shared,
                health,
            },
        ))
    }

    /// Queue request records; those without room are dropped and counted.
    pub fn records(&self, records: Vec<RequestRecord>) {
        self.records_shared(Arc::new(records));
    }

    /// Queue a batch of request records shared with the pipeline's other sinks, without
    /// copying it; those without room are dropped and counted (only then is a part copied).
    pub fn records_shared(&self, batch: Arc<Vec<RequestRecord>>) {
        let n = batch.len();
        let admitted = self.admit(n, &self.records_lost);
        if admitted == 0 {
            return;
        }
        let batch = if admitted < n {
            Arc::new(match Arc::try_unwrap(batch) {
                Ok(mut v) => {
                    v.truncate(admitted);
                    v
                }
                Err(shared) => shared[..admitted].to_vec(),
            })
        } else {
            batch
        };
        self.send(Work::Records(batch), &self.records_lost);
    }

    /// Queue spans (the proxy's, or received over OTLP); those without room are dropped and
    /// counted. Returns how many were queued: the first that many of `rows`.
    pub fn spans(&self, rows: Vec<SpanRow>) -> usize {
        match &self.sampler {
            Some(sampler) => sampler.push(rows),
            None => self.bounded(rows, &self.spans_lost, Work::Spans),
        }
    }

    /// Spans queued from now on go through a span sampler first (`traces.sampling`, when
    /// enabled): it decides each trace on its own thread and queues the spans it keeps here.
    pub fn with_span_sampler(
        mut self,
        cfg: &super::span_sampler::SamplingConfig,
        metrics: &Metrics,
        priority: crate::runtimes::AnalysisPriority,
    ) -> std::io::Result<StoreWriter> {
        if cfg.enabled {
            let inner = StoreWriter {
                sampler: None,
                ..self.clone()
            };
            let forward = Box::new(move |rows: Vec<SpanRow>| inner.spans(rows));
            self.sampler = Some(super::span_sampler::SpanSampler::start(
                cfg, metrics, priority, forward,
            )?);
        }
        Ok(self)
    }

    /// Queue log records received over OTLP; those without room are dropped and counted.
    /// Returns how many were queued: the first that many of `rows`.
    pub fn logs(&self, rows: Vec<LogRow>) -> usize {
        self.bounded(rows, &self.logs_lost, Work::Logs)
    }

    /// Queue roll-ups. They are not bounded: at most one per series and minute, and losing
    /// them loses the long-term history.
    pub fn rollups(&self, rows: Vec<RollupRow>) {
        if !rows.is_empty() && self.tx.send(Work::Rollups(rows)).is_err() {
            tracing::warn!("the store writer has stopped; roll-ups not stored");
        }
    }

    /// Queue retention, after everything queued so far.
    pub fn retention(&self, now_unix_ms: i64) {
        let _ = self.tx.send(Work::Retention(now_unix_ms));
    }

    /// Takes as many rows as there is room for (the first ones), counting the rest as lost;
    /// returns how many it took.
    fn bounded<T>(&self, mut rows: Vec<T>, lost: &Lost, work: fn(Vec<T>) -> Work) -> usize {
        let admitted = self.admit(rows.len(), lost);
        if admitted == 0 {
            return 0;
        }
        rows.truncate(admitted);
        self.send(work(rows), lost)
    }

    /// Reserves room for as many of `n` rows as fit (the first ones), counting the rest as
    /// lost; returns how many.
    fn admit(&self, n: usize, lost: &Lost) -> usize {
        if n == 0 {
            return 0;
        }
        let mut queued = self.shared.queued.load(Ordering::Acquire);
        let admitted = loop {
            let room = self.shared.capacity.saturating_sub(queued);
            let take = room.min(n);
            if take == 0 {
                break 0;
            }
            match self.shared.queued.compare_exchange_weak(
                queued,
                queued + take,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break take,
                Err(seen) => queued = seen,
            }
        };
        if admitted < n {
            lost.queue_full.inc_by((n - admitted) as u64);
            if !self.shared.full_logged.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    capacity = self.shared.capacity,
                    "the store write queue is full; rows are dropped and counted until it drains (store.write_queue_records)"
                );
            }
        } else {
            self.shared.full_logged.store(false, Ordering::Relaxed);
        }
        if admitted > 0 {
            self.shared.depth.set((queued + admitted) as i64);
        }
        admitted
    }

    /// Queues `work`, whose rows `admit` made room for; returns how many rows it holds (0
    /// when the writer thread is gone: they are counted as lost).
    fn send(&self, work: Work, lost: &Lost) -> usize {
        let admitted = match &work {
            Work::Records(r) => r.len(),
            Work::Spans(s) => s.len(),
            Work::Logs(l) => l.len(),
            Work::Rollups(_) | Work::Retention(_) => 0,
        };
        if let Err(mpsc::SendError(w)) = self.tx.send(work) {
            // The writer thread is gone (it only stops once every sender is dropped, or by a
            // panic): nothing will write these.
            let n = match w {
                Work::Records(r) => r.len(),
                Work::Spans(s) => s.len(),
                Work::Logs(l) => l.len(),
                Work::Rollups(_) | Work::Retention(_) => 0,
            };
            lost.shutdown.inc_by(n as u64);
            self.shared.release(n);
            return 0;
        }
        admitted
    }
}

impl StoreWriterThread {
    /// What the writer last learnt of the store.
    pub fn health(&self) -> Arc<StoreHealth> {
        self.health.clone()
    }

    /// Once every `StoreWriter` is dropped: write what is queued within `grace`; rows still
    /// queued after it are counted as lost (reason `shutdown`). Waits at most a little past
    /// `grace` for a store call still running, then leaves the thread behind. True when the
    /// thread ended.
    pub fn finish(mut self, grace: Duration) -> bool {
        let abandon_at = Instant::now() + grace;
        *self
            .shared
            .abandon_at
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(abandon_at);
        let give_up = abandon_at + Duration::from_secs(1);
        let Some(thread) = self.thread.take() else {
            return true;
        };
        while !thread.is_finished() {
            if Instant::now() >= give_up {
                tracing::warn!(
                    rows = self.shared.queued.load(Ordering::Acquire),
                    "the store writer is still waiting on the store at shutdown; its rows are not written"
                );
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = thread.join();
        true
    }
}

struct Writer {
    store: Arc<dyn Store>,
    rx: mpsc::Receiver<Work>,
    shared: Arc<Shared>,
    health: Arc<StoreHealth>,
    metrics: Arc<Metrics>,
    batch_max: usize,
    flush_interval: Duration,
    records_lost: Lost,
    spans_lost: Lost,
    logs_lost: Lost,
}

impl Writer {
    /// Writes in queue order, records, spans and log records batched together up to
    /// `batch_max` each, gathered for up to `flush_interval` after a batch's first row;
    /// roll-ups and retention wait for everything queued before them. Ends once every sender
    /// is dropped and the queue is empty.
    fn run(self) {
        let mut held: Option<Work> = None;
        let mut last_call = Instant::now();
        loop {
            let work = match held.take() {
                Some(w) => w,
                None => match self.rx.recv_timeout(PROBE_AFTER) {
                    Ok(w) => w,
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        if last_call.elapsed() >= PROBE_AFTER && !self.abandoning() {
                            let _ = self.call(|s| s.stats().map(|_| ()));
                            last_call = Instant::now();
                        }
                        continue;
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                },
            };
            match work {
                Work::Rollups(rows) => self.write_rollups(&rows),
                Work::Retention(now) => self.retain(now),
                first => {
                    let (mut batches, mut spans, mut logs) = (Vec::new(), Vec::new(), Vec::new());
                    let mut n_records = 0;
                    let mut next = Some(first);
                    let flush_at = Instant::now() + self.flush_interval;
                    while let Some(w) = next.take() {
                        match w {
                            Work::Records(r) if n_records < self.batch_max => {
                                n_records += r.len();
                                batches.push(r);
                            }
                            Work::Spans(s) if spans.len() < self.batch_max => spans.extend(s),
                            Work::Logs(l) if logs.len() < self.batch_max => logs.extend(l),
                            other => {
                                held = Some(other);
                                break;
                            }
                        }
                        let full = n_records >= self.batch_max
                            || spans.len() >= self.batch_max
                            || logs.len() >= self.batch_max;
                        next = if full {
                            self.rx.try_recv().ok()
                        } else {
                            self.next_before(flush_at)
                        };
                    }
                    let records = Self::contiguous(batches, n_records);
                    self.write_rows(
                        &records[..],
                        &self.records_lost,
                        |s, c| s.insert_records(c),
                        |m, n| {
                            m.store_records_written.inc_by(n);
                        },
                    );
                    self.write_rows(
                        &spans,
                        &self.spans_lost,
                        |s, c| s.insert_spans(c),
                        |_, _| {},
                    );
                    self.write_rows(&logs, &self.logs_lost, |s, c| s.insert_logs(c), |_, _| {});
                }
            }
            last_call = Instant::now();
        }
    }

    /// The queued batches as one slice: the only one as it is, several moved into one (a
    /// batch the pipeline still shares, rarely, is copied).
    fn contiguous(mut batches: Vec<Arc<Vec<RequestRecord>>>, n: usize) -> Arc<Vec<RequestRecord>> {
        if batches.len() == 1
            && let Some(only) = batches.pop()
        {
            return only;
        }
        let mut all = Vec::with_capacity(n);
        for b in batches {
            match Arc::try_unwrap(b) {
                Ok(v) => all.extend(v),
                Err(shared) => all.extend_from_slice(&shared),
            }
        }
        Arc::new(all)
    }

    /// The next queued work, waiting for it until `flush_at` (not at all once shutdown has
    /// begun); None when there is none by then.
    fn next_before(&self, flush_at: Instant) -> Option<Work> {
        let wait = flush_at.saturating_duration_since(Instant::now());
        if wait.is_zero() || self.shared.abandon_at().is_some() {
            return self.rx.try_recv().ok();
        }
        self.rx.recv_timeout(wait).ok()
    }

    fn abandoning(&self) -> bool {
        self.shared
            .abandon_at()
            .is_some_and(|t| Instant::now() >= t)
    }

    /// One store call, reflected in `health`.
    fn call(
        &self,
        op: impl FnOnce(&dyn Store) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        self.health.begin();
        let result = op(self.store.as_ref());
        self.health
            .end(result.as_ref().map(|_| ()).map_err(|e| e.to_string()));
        result
    }

    /// Writes `rows` in chunks of `batch_max`, counting each row lost when its chunk fails.
    fn write_rows<T>(
        &self,
        rows: &[T],
        lost: &Lost,
        insert: impl Fn(&dyn Store, &[T]) -> Result<(), StoreError>,
        written: impl Fn(&Metrics, u64),
    ) {
        for chunk in rows.chunks(self.batch_max) {
            let n = chunk.len() as u64;
            if self.abandoning() {
                lost.shutdown.inc_by(n);
            } else {
                let started = Instant::now();
                let result = self.call(|s| insert(s, chunk));
                self.metrics
                    .store_write_seconds
                    .observe(started.elapsed().as_secs_f64());
                match result {
                    Ok(()) => written(&self.metrics, n),
                    Err(e) => {
                        self.metrics.store_write_errors.inc();
                        lost.write_failed.inc_by(n);
                        tracing::warn!(rows = n, error = %e, "a store write failed; its rows are lost");
                    }
                }
            }
            self.shared.release(chunk.len());
        }
    }

    fn write_rollups(&self, rows: &[RollupRow]) {
        if self.abandoning() {
            tracing::warn!(
                rollups = rows.len(),
                "shutdown grace over; roll-ups not stored"
            );
            return;
        }
        match self.call(|s| s.insert_rollups(rows)) {
            Ok(()) => {
                self.metrics.store_rollups_written.inc_by(rows.len() as u64);
            }
            Err(e) => {
                self.metrics.store_write_errors.inc();
                tracing::warn!(rollups = rows.len(), error = %e, "storing roll-ups failed");
            }
        }
    }

    fn retain(&self, now_unix_ms: i64) {
        if self.abandoning() {
            return;
        }
        match self.call(|s| {
            s.apply_retention(now_unix_ms)
                .map(|report| tracing::debug!(?report, "retention applied"))
        }) {
            Ok(()) => {}
            Err(e) => {
                self.metrics.store_write_errors.inc();
                tracing::warn!(error = %e, "store retention failed");
            }
        }
    }
}

/// The sources' port to the writer (`kernel::rows`): spans and log records they receive.
impl crate::kernel::rows::RowSink for StoreWriter {
    fn spans(&self, rows: Vec<SpanRow>) -> usize {
        StoreWriter::spans(self, rows)
    }

    fn logs(&self, rows: Vec<LogRow>) -> usize {
        StoreWriter::logs(self, rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store whose writes block until released, and fail while `failing` is set.
    #[derive(Default)]
    struct Gate {
        inner: Option<Arc<dyn Store>>,
        open: Mutex<bool>,
        opened: std::sync::Condvar,
        failing: AtomicBool,
        order: Mutex<Vec<String>>,
    }

    impl Gate {
        fn over(store: Arc<dyn Store>, open: bool) -> Arc<Gate> {
            Arc::new(Gate {
                inner: Some(store),
                open: Mutex::new(open),
                ..Default::default()
            })
        }
        fn release(&self) {
            *self.open.lock().unwrap() = true;
            self.opened.notify_all();
        }
        fn pass(&self, what: String) -> Result<(), StoreError> {
            let mut open = self.open.lock().unwrap();
            while !*open {
                open = self.opened.wait(open).unwrap();
            }
            self.order.lock().unwrap().push(what);
            if self.failing.load(Ordering::SeqCst) {
                return Err(StoreError::Config(
                    "the test store is down: unreachable".into(),
                ));
            }
            Ok(())
        }
        fn inner(&self) -> &dyn Store {
            self.inner.as_deref().expect("inner store")
        }
    }

    impl Store for Gate {
        fn insert_records(&self, records: &[RequestRecord]) -> Result<(), StoreError> {
            self.pass(format!("records {}", records.len()))?;
            self.inner().insert_records(records)
        }
        fn insert_rollups(&self, rows: &[RollupRow]) -> Result<(), StoreError> {
            self.pass(format!("rollups {}", rows.len()))?;
            self.inner().insert_rollups(rows)
        }
        fn query_records(
            &self,
            q: &tokenwatch_store::RecordQuery,
        ) -> Result<Vec<RequestRecord>, StoreError> {
            self.inner().query_records(q)
        }
        fn query_rollups(
            &self,
            q: &tokenwatch_store::RollupQuery,
        ) -> Result<Vec<RollupRow>, StoreError> {
            self.inner().query_rollups(q)
        }
        fn apply_retention(
            &self,
            now: i64,
        ) -> Result<tokenwatch_store::RetentionReport, StoreError> {
            self.pass("retention".into())?;
            self.inner().apply_retention(now)
        }
        fn stats(&self) -> Result<tokenwatch_store::StoreStats, StoreError> {
            self.inner().stats()
        }
        fn insert_spans(&self, spans: &[SpanRow]) -> Result<(), StoreError> {
            self.pass(format!("spans {}", spans.len()))?;
            self.inner().insert_spans(spans)
        }
        fn query_spans(&self, q: &tokenwatch_store::SpanQuery) -> Result<Vec<SpanRow>, StoreError> {
            self.inner().query_spans(q)
        }
        fn insert_logs(&self, logs: &[tokenwatch_store::LogRow]) -> Result<(), StoreError> {
            self.pass(format!("logs {}", logs.len()))?;
            self.inner().insert_logs(logs)
        }
        fn query_logs(
            &self,
            q: &tokenwatch_store::LogQuery,
        ) -> Result<Vec<tokenwatch_store::LogRow>, StoreError> {
            self.inner().query_logs(q)
        }
        fn insert_embeddings(
            &self,
            rows: &[tokenwatch_store::EmbeddingRow],
        ) -> Result<(), StoreError> {
            self.inner().insert_embeddings(rows)
        }
        fn insert_annotations(
            &self,
            rows: &[tokenwatch_store::AnnotationRow],
        ) -> Result<(), StoreError> {
            self.inner().insert_annotations(rows)
        }
        fn query_annotations(
            &self,
            ids: &[String],
        ) -> Result<Vec<tokenwatch_store::AnnotationRow>, StoreError> {
            self.inner().query_annotations(ids)
        }
        fn insert_scores(&self, rows: &[tokenwatch_store::ScoreRow]) -> Result<(), StoreError> {
            self.inner().insert_scores(rows)
        }
        fn query_scores(
            &self,
            request_ids: &[String],
            trace_ids: &[String],
        ) -> Result<Vec<tokenwatch_store::ScoreRow>, StoreError> {
            self.inner().query_scores(request_ids, trace_ids)
        }
        fn upsert_alerts(
            &self,
            alerts: &[tokenwatch_core::alert::Alert],
        ) -> Result<(), StoreError> {
            self.inner().upsert_alerts(alerts)
        }
        fn delete_alerts(&self, ids: &[String]) -> Result<(), StoreError> {
            self.inner().delete_alerts(ids)
        }
        fn load_alerts(
            &self,
            since_unix_ms: i64,
        ) -> Result<Vec<tokenwatch_core::alert::Alert>, StoreError> {
            self.inner().load_alerts(since_unix_ms)
        }
        fn upsert_scrape_targets(
            &self,
            rows: &[tokenwatch_store::ScrapeTargetRow],
        ) -> Result<(), StoreError> {
            self.inner().upsert_scrape_targets(rows)
        }
        fn load_scrape_targets(
            &self,
            since_unix_ms: i64,
        ) -> Result<Vec<tokenwatch_store::ScrapeTargetRow>, StoreError> {
            self.inner().load_scrape_targets(since_unix_ms)
        }
        fn insert_markers(&self, rows: &[tokenwatch_store::MarkerRow]) -> Result<(), StoreError> {
            self.inner().insert_markers(rows)
        }
        fn query_markers(
            &self,
            q: &tokenwatch_store::MarkerQuery,
        ) -> Result<Vec<tokenwatch_store::MarkerRow>, StoreError> {
            self.inner().query_markers(q)
        }
        fn query_spend(
            &self,
            q: &tokenwatch_store::SpendQuery,
        ) -> Result<Vec<tokenwatch_store::SpendRow>, StoreError> {
            self.inner().query_spend(q)
        }
    }

    fn sqlite() -> (tempfile::TempDir, Arc<dyn Store>) {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(tokenwatch_store::SqliteStore::open(dir.path(), Default::default()).unwrap());
        (dir, store)
    }

    fn records(from: usize, n: usize) -> Vec<RequestRecord> {
        (from..from + n)
            .map(|i| RequestRecord {
                request_id: format!("r{i:04}"),
                arrival_unix_ms: tokenwatch_core::clock::now_unix_ms() + i as i64,
                ..Default::default()
            })
            .collect()
    }

    fn value(metrics: &Metrics, series: &str) -> f64 {
        let text = metrics.encode();
        text.lines()
            .find_map(|l| {
                l.strip_prefix(series)
                    .and_then(|rest| rest.trim().parse().ok())
            })
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    }

    fn until(what: &str, ok: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ok() {
            assert!(Instant::now() < deadline, "timed out waiting: {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A writer over `gate` with room for `queue_rows` rows, batches of 4, and its own metrics.
    fn start_writer(
        gate: &Arc<Gate>,
        queue_rows: usize,
    ) -> (StoreWriter, StoreWriterThread, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new());
        let config = StoreWriterConfig {
            queue_rows,
            batch_max: 4,
            priority: Default::default(),
            flush_interval: Duration::ZERO,
        };
        let (writer, thread) = StoreWriter::start(gate.clone(), config, metrics.clone()).unwrap();
        (writer, thread, metrics)
    }

    #[test]
    fn a_full_queue_counts_each_record_and_never_waits_then_the_writer_drains_in_order() {
        let (_dir, sqlite) = sqlite();
        let gate = Gate::over(sqlite.clone(), false);
        let (writer, thread, metrics) = start_writer(&gate, 10);
        // The first batch is taken by the writer, which then waits on the closed gate.
        writer.records(records(0, 3));
        until("the writer holds the first batch", || {
            thread.health().state.lock().unwrap().busy_since.is_some()
        });
        let started = Instant::now();
        writer.records(records(3, 4));
        writer.spans(vec![SpanRow {
            trace_id: "t".into(),
            span_id: "s1".into(),
            ..Default::default()
        }]);
        // 3 + 4 + 1 queued: room for 2 of these 5, the other 3 dropped and counted one by one.
        writer.records(records(7, 5));
        writer.spans(vec![SpanRow {
            trace_id: "t".into(),
            span_id: "s2".into(),
            ..Default::default()
        }]);
        assert!(
            started.elapsed() < Duration::from_millis(200),
            "queuing waited on the store"
        );
        assert_eq!(
            value(
                &metrics,
                "tokenwatch_store_records_dropped_total{reason=\"queue_full\"}"
            ),
            3.0
        );
        assert_eq!(
            value(
                &metrics,
                "tokenwatch_store_spans_dropped_total{reason=\"queue_full\"}"
            ),
            1.0
        );
        assert_eq!(value(&metrics, "tokenwatch_store_write_queue_rows"), 10.0);
        writer.rollups(vec![RollupRow {
            labels: Default::default(),
            bucket: tokenwatch_core::model::ContextBucket::Unknown,
            metric: tokenwatch_core::model::LatencyMetric::E2e,
            minute_start_unix_ms: 60_000,
            count: 1,
            sketch: tokenwatch_core::sketch::LatencySketch::default().to_bytes(),
        }]);
        writer.records(records(9, 1));
        assert_eq!(
            value(
                &metrics,
                "tokenwatch_store_records_dropped_total{reason=\"queue_full\"}"
            ),
            4.0
        );
        gate.release();
        drop(writer);
        assert!(thread.finish(Duration::from_secs(5)));
        assert_eq!(
            value(&metrics, "tokenwatch_store_records_written_total"),
            9.0
        );
        assert_eq!(value(&metrics, "tokenwatch_store_write_queue_rows"), 0.0);
        // Records and spans batched up to batch_max each, each kind in queue order; roll-ups
        // only after everything queued before them.
        let order = gate.order.lock().unwrap().clone();
        assert_eq!(
            order,
            [
                "records 3",
                "records 4",
                "spans 1",
                "records 2",
                "rollups 1"
            ]
        );
        let stored = sqlite
            .query_records(&tokenwatch_store::RecordQuery {
                limit: 100,
                ..Default::default()
            })
            .unwrap();
        let mut ids: Vec<String> = stored.into_iter().map(|r| r.request_id).collect();
        ids.sort();
        let want: Vec<String> = (0..9).map(|i| format!("r{i:04}")).collect();
        assert_eq!(ids, want, "the records admitted are the ones stored");
    }

    #[test]
    fn a_flush_interval_gathers_batches_into_one_insert_and_a_full_batch_goes_at_once() {
        let (_dir, sqlite) = sqlite();
        let gate = Gate::over(sqlite.clone(), true);
        let metrics = Arc::new(Metrics::new());
        let config = StoreWriterConfig {
            queue_rows: 1_000,
            batch_max: 10,
            priority: Default::default(),
            flush_interval: Duration::from_millis(400),
        };
        let (writer, thread) = StoreWriter::start(gate.clone(), config, metrics.clone()).unwrap();
        // Three small batches within the interval: one insert, not before the interval ends.
        let started = Instant::now();
        for i in 0..3 {
            writer.records(records(i * 2, 2));
            std::thread::sleep(Duration::from_millis(50));
        }
        until("the gathered batch is written", || {
            !gate.order.lock().unwrap().is_empty()
        });
        assert!(
            started.elapsed() >= Duration::from_millis(390),
            "written after {:?}, before the flush interval",
            started.elapsed()
        );
        // A batch that fills `batch_max` is written without waiting for the interval.
        let started = Instant::now();
        writer.records(records(6, 10));
        until("the full batch is written", || {
            gate.order.lock().unwrap().len() == 2
        });
        assert!(
            started.elapsed() < Duration::from_millis(300),
            "a full batch waited {:?}",
            started.elapsed()
        );
        // Shutdown writes what is gathered without waiting for the interval either.
        writer.records(records(16, 1));
        drop(writer);
        let started = Instant::now();
        assert!(thread.finish(Duration::from_secs(5)));
        assert!(started.elapsed() < Duration::from_millis(300));
        let order = gate.order.lock().unwrap().clone();
        assert_eq!(order, ["records 6", "records 10", "records 1"]);
        assert_eq!(
            value(&metrics, "tokenwatch_store_records_written_total"),
            17.0
        );
    }

    fn log_rows(from: usize, n: usize) -> Vec<LogRow> {
        (from..from + n)
            .map(|i| LogRow {
                time_unix_nano: 1_000 + i as i64,
                body: format!("line {i}"),
                ..Default::default()
            })
            .collect()
    }

    #[test]
    fn log_records_share_the_bounded_queue_and_are_counted_as_logs_when_it_is_full() {
        let (_dir, sqlite) = sqlite();
        let gate = Gate::over(sqlite.clone(), false);
        let (writer, thread, metrics) = start_writer(&gate, 6);
        assert_eq!(writer.logs(log_rows(0, 2)), 2);
        until("the writer holds the first batch", || {
            thread.health().state.lock().unwrap().busy_since.is_some()
        });
        // 2 rows held by the writer: room for 4 more, shared with records and spans; the
        // first rows of each call are the ones queued.
        assert_eq!(writer.spans(vec![SpanRow::default()]), 1);
        assert_eq!(writer.logs(log_rows(2, 5)), 3);
        assert_eq!(writer.logs(log_rows(7, 1)), 0);
        assert_eq!(
            value(
                &metrics,
                "tokenwatch_store_logs_dropped_total{reason=\"queue_full\"}"
            ),
            3.0
        );
        assert_eq!(
            value(
                &metrics,
                "tokenwatch_store_spans_dropped_total{reason=\"queue_full\"}"
            ),
            0.0
        );
        gate.release();
        drop(writer);
        assert!(thread.finish(Duration::from_secs(5)));
        let order = gate.order.lock().unwrap().clone();
        assert_eq!(order, ["logs 2", "spans 1", "logs 3"]);
        let stored = sqlite
            .query_logs(&tokenwatch_store::LogQuery::default())
            .unwrap();
        let bodies: Vec<&str> = stored.iter().map(|r| r.body.as_str()).collect();
        assert_eq!(bodies, ["line 0", "line 1", "line 2", "line 3", "line 4"]);
        assert_eq!(value(&metrics, "tokenwatch_store_write_queue_rows"), 0.0);
    }

    #[test]
    fn a_failed_write_counts_each_record_and_readiness_reports_it_until_a_write_succeeds() {
        let (_dir, sqlite) = sqlite();
        let gate = Gate::over(sqlite, true);
        gate.failing.store(true, Ordering::SeqCst);
        let (writer, thread, metrics) = start_writer(&gate, 100);
        let health = thread.health();
        assert_eq!(health.readiness(), Ok(()));
        writer.records(records(0, 6));
        until("both chunks failed", || {
            metrics
                .encode()
                .contains("tokenwatch_store_records_dropped_total{reason=\"write_failed\"} 6")
        });
        assert_eq!(value(&metrics, "tokenwatch_store_write_errors_total"), 2.0);
        let why = health.readiness().unwrap_err();
        assert!(why.contains("unreachable"), "{why}");
        gate.failing.store(false, Ordering::SeqCst);
        writer.records(records(6, 1));
        until("the next write succeeded", || health.readiness().is_ok());
        drop(writer);
        assert!(thread.finish(Duration::from_secs(5)));
        assert_eq!(
            value(&metrics, "tokenwatch_store_records_written_total"),
            1.0
        );
    }

    #[test]
    fn readiness_reports_a_write_that_hangs_and_shutdown_counts_what_it_could_not_write() {
        let (_dir, sqlite) = sqlite();
        let gate = Gate::over(sqlite, false);
        let (writer, thread, metrics) = start_writer(&gate, 100);
        let health = thread.health();
        writer.records(records(0, 2));
        until("the writer holds the first batch", || {
            health.state.lock().unwrap().busy_since.is_some()
        });
        health.state.lock().unwrap().busy_since = Some(Instant::now() - SLOW_AFTER);
        let why = health.readiness().unwrap_err();
        assert!(why.starts_with("slow or unreachable"), "{why}");
        writer.records(records(2, 5));
        drop(writer);
        // The grace ends while the first write still hangs: the thread is left behind; once the
        // store answers, the 5 records queued behind it are counted as lost, not written.
        assert!(!thread.finish(Duration::from_millis(50)));
        gate.release();
        until("the queued records were counted at shutdown", || {
            metrics
                .encode()
                .contains("tokenwatch_store_records_dropped_total{reason=\"shutdown\"} 5")
        });
        assert_eq!(
            value(&metrics, "tokenwatch_store_records_written_total"),
            2.0
        );
    }
}
