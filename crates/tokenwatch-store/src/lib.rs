// tokenwatch-store: the stores behind the `Store` trait (spec section 9) — the trait, its
// query/option/report types, the SQLite and ClickHouse backends and `open_store` choosing one.

mod alerts;
mod annotations;
mod clickhouse;
mod codec;
mod embeddings;
mod error;
mod markers;
mod schema;
mod scores;
mod scrape_targets;
mod span_attrs;
mod spend;
mod sqlite;
mod telemetry;
mod text;

/// The suite every backend passes (used by this crate's tests and other crates' tests).
#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
/// A throwaway ClickHouse server for tests.
#[cfg(any(test, feature = "conformance"))]
pub mod testing;

pub use annotations::AnnotationRow;
pub use clickhouse::{ClickHouseConfig, ClickHouseStore};
pub use embeddings::EmbeddingRow;
pub use error::{BackendError, StoreError};
pub use markers::{MarkerQuery, MarkerRow};
pub use scores::ScoreRow;
pub use scrape_targets::ScrapeTargetRow;
pub use spend::{SpendQuery, SpendRow};
pub use sqlite::SqliteStore;
pub use telemetry::{LogQuery, LogRow, SpanQuery, SpanRow};
pub use text::DEFAULT_REGION;

use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokenwatch_core::model::{
    ContextBucket, ErrorClass, LatencyMetric, RequestRecord, SeriesLabels,
};

/// Name of the database file created inside the data directory.
pub const DB_FILE_NAME: &str = "tokenwatch.db";

/// `store.backend` in the configuration: which backend keeps tokenwatch's data.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema, serde::Serialize,
)]
pub enum StoreBackendKind {
    #[serde(rename = "sqlite")]
    Sqlite,
    #[serde(rename = "clickhouse")]
    ClickHouse,
}

/// Which backend keeps tokenwatch's data.
#[derive(Debug, Clone, PartialEq, Eq)]
// One value, built once at start: a box would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum StoreBackend {
    /// The embedded SQLite file `<data_dir>/tokenwatch.db`.
    Sqlite { data_dir: PathBuf },
    /// A ClickHouse server, shared by any number of tokenwatch instances.
    ClickHouse(ClickHouseConfig),
}

/// Opens the configured backend (creating its database and applying migrations). Blocking:
/// call it off async threads.
pub fn open_store(
    backend: &StoreBackend,
    opts: StoreOptions,
) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match backend {
        StoreBackend::Sqlite { data_dir } => Arc::new(SqliteStore::open(data_dir, opts)?),
        StoreBackend::ClickHouse(cfg) => Arc::new(ClickHouseStore::open(cfg, opts)?),
    })
}

/// The storage tiers tokenwatch keeps: raw request records and per-minute sketch roll-ups.
pub trait Store: Send + Sync + 'static {
    /// Durably append records; when this returns Ok they survive kill -9 of the process.
    /// One transaction per call: either the whole batch is stored or none of it.
    fn insert_records(&self, records: &[RequestRecord]) -> Result<(), StoreError>;
    /// Insert or replace roll-ups: a re-emitted (labels, bucket, metric, minute) replaces the old row.
    fn insert_rollups(&self, rows: &[RollupRow]) -> Result<(), StoreError>;
    /// Newest first (by arrival, then insertion order). See [`RecordQuery`] for the filters.
    fn query_records(&self, q: &RecordQuery) -> Result<Vec<RequestRecord>, StoreError>;
    /// Roll-ups whose minute starts in `[from_unix_ms, to_unix_ms)`, oldest minute first.
    fn query_rollups(&self, q: &RollupQuery) -> Result<Vec<RollupRow>, StoreError>;
    /// Deletes raw records older than the raw retention and roll-ups older than the roll-up retention.
    fn apply_retention(&self, now_unix_ms: i64) -> Result<RetentionReport, StoreError>;
    /// Row counts and on-disk size.
    fn stats(&self) -> Result<StoreStats, StoreError>;
    /// Store OTLP spans in one transaction. A span already stored (same trace and span id) is
    /// left as is, so a retried export does not duplicate it.
    fn insert_spans(&self, spans: &[SpanRow]) -> Result<(), StoreError>;
    /// Spans of one trace and/or starting in a time range, oldest start first.
    fn query_spans(&self, q: &SpanQuery) -> Result<Vec<SpanRow>, StoreError>;
    /// Store OTLP log records in one transaction.
    fn insert_logs(&self, logs: &[LogRow]) -> Result<(), StoreError>;
    /// Log records of one trace and/or in a time range, oldest first.
    fn query_logs(&self, q: &LogQuery) -> Result<Vec<LogRow>, StoreError>;
    /// Store output embeddings posted for request ids, in one transaction. A record without its
    /// own embedding is read back with the latest one posted for its request id and model.
    fn insert_embeddings(&self, rows: &[EmbeddingRow]) -> Result<(), StoreError>;
    /// Store per-request anomaly annotations in one transaction (retained like raw records).
    fn insert_annotations(&self, rows: &[AnnotationRow]) -> Result<(), StoreError>;
    /// The annotations of these requests, oldest first.
    fn query_annotations(&self, request_ids: &[String]) -> Result<Vec<AnnotationRow>, StoreError>;
    /// Insert or replace alerts by id, in one transaction (resolved ones are retained like raw
    /// records).
    fn upsert_alerts(&self, alerts: &[tokenwatch_core::alert::Alert]) -> Result<(), StoreError>;
    /// Forget alerts by id (a pending alert whose condition went away before it fired).
    fn delete_alerts(&self, ids: &[String]) -> Result<(), StoreError>;
    /// Every pending or firing alert, and the resolved ones resolved at or after
    /// `resolved_since_unix_ms`; newest first.
    fn load_alerts(
        &self,
        resolved_since_unix_ms: i64,
    ) -> Result<Vec<tokenwatch_core::alert::Alert>, StoreError>;
    /// Insert or replace the status of scrape targets by URL (the latest `updated_unix_ms`
    /// wins): sharded collectors sharing a store publish theirs so each lists every target.
    /// Rows are retained like raw records.
    fn upsert_scrape_targets(&self, rows: &[ScrapeTargetRow]) -> Result<(), StoreError>;
    /// The latest row of every target updated at or after `updated_since_unix_ms`, by URL.
    fn load_scrape_targets(
        &self,
        updated_since_unix_ms: i64,
    ) -> Result<Vec<ScrapeTargetRow>, StoreError>;
    /// Store version and deploy markers in one transaction; a marker whose id is already
    /// stored is left as is. Markers are retained like roll-ups.
    fn insert_markers(&self, rows: &[MarkerRow]) -> Result<(), StoreError>;
    /// The newest `q.limit` markers matching `q`, oldest first (by time, then id).
    fn query_markers(&self, q: &MarkerQuery) -> Result<Vec<MarkerRow>, StoreError>;
    /// Store feedback and evaluation scores in one transaction (retained like raw records).
    fn insert_scores(&self, rows: &[ScoreRow]) -> Result<(), StoreError>;
    /// The scores given to any of these request ids or trace ids, oldest first (by time, then
    /// insertion order); each row once even when it matches both.
    fn query_scores(
        &self,
        request_ids: &[String],
        trace_ids: &[String],
    ) -> Result<Vec<ScoreRow>, StoreError>;
    /// The records' cost (`cost_usd`) summed per model and tenant over an arrival range,
    /// ordered by model, then tenant.
    fn query_spend(&self, q: &SpendQuery) -> Result<Vec<SpendRow>, StoreError>;
}

/// A storage-level roll-up: one minute of one latency sketch for one series and context bucket.
/// `sketch` is the opaque serialised sketch (`LatencySketch::to_bytes`); `count` its sample count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollupRow {
    pub labels: SeriesLabels,
    pub bucket: ContextBucket,
    pub metric: LatencyMetric,
    pub minute_start_unix_ms: i64,
    pub count: u64,
    pub sketch: Vec<u8>,
}

/// Filters for [`Store::query_records`]; all given filters must hold.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordQuery {
    /// Exact `model_id`.
    pub model: Option<String>,
    /// Only records with `arrival_unix_ms >= since_unix_ms`.
    pub since_unix_ms: Option<i64>,
    /// Exact tenant (the header value or its salted hash, as recorded).
    pub tenant: Option<String>,
    /// Exact request id. Records are then answered oldest first (newest first otherwise): of
    /// records sharing an id — a caller's reuse older than the pipeline remembers — the first
    /// keeps answering a lookup by it.
    pub request_id: Option<String>,
    /// Exact W3C trace id (32 hex digits).
    pub trace_id: Option<String>,
    /// Only succeeded, only failed, or only one error class.
    pub outcome: Option<RecordOutcome>,
    /// Only records whose end-to-end time is at least this many seconds.
    pub min_e2e_s: Option<f64>,
    /// Only records with at least one annotation (a per-request anomaly).
    pub annotated: bool,
    /// Maximum number of rows returned (0 returns none).
    pub limit: usize,
    /// Read each record's captured text too (`RequestRecord::text`); lists leave it out.
    pub with_text: bool,
}

/// Outcome filter of [`RecordQuery`]; success is `RequestRecord::is_success`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordOutcome {
    Ok,
    Error,
    Class(ErrorClass),
}

impl RecordOutcome {
    /// `ok`, `error`, or an error class name such as `upstream_5xx`.
    pub fn parse(s: &str) -> Option<RecordOutcome> {
        match s {
            "ok" => Some(RecordOutcome::Ok),
            "error" => Some(RecordOutcome::Error),
            other => ErrorClass::parse(other).map(RecordOutcome::Class),
        }
    }
}

impl Default for RecordQuery {
    /// No filter, the 100 newest records.
    fn default() -> Self {
        RecordQuery {
            model: None,
            since_unix_ms: None,
            tenant: None,
            request_id: None,
            trace_id: None,
            outcome: None,
            min_e2e_s: None,
            annotated: false,
            limit: 100,
            with_text: false,
        }
    }
}

/// Filters for [`Store::query_rollups`]; the minute range is half-open: `[from, to)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollupQuery {
    /// Exact `model_id`; None for every model.
    pub model: Option<String>,
    /// One metric; None for every metric.
    pub metric: Option<LatencyMetric>,
    /// Inclusive lower bound on `minute_start_unix_ms`.
    pub from_unix_ms: i64,
    /// Exclusive upper bound on `minute_start_unix_ms`.
    pub to_unix_ms: i64,
}

/// How the store is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreOptions {
    /// How long raw request records are kept (default 7 days).
    pub raw_retention: Duration,
    /// How long per-minute roll-ups are kept (default 90 days).
    pub rollup_retention: Duration,
    /// false: WAL + synchronous=NORMAL (a commit survives a process crash / kill -9);
    /// true: synchronous=FULL (a commit also survives power loss, at an fsync per commit).
    /// SQLite only: a ClickHouse server keeps its own durability.
    pub fsync: bool,
    /// How long captured text is kept, by region (`retention.regions`); the `default` entry,
    /// when given, covers every other region. Text never outlives its record (`raw_retention`).
    pub text_retention: std::collections::BTreeMap<String, Duration>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            raw_retention: Duration::from_secs(7 * 24 * 3600),
            rollup_retention: Duration::from_secs(90 * 24 * 3600),
            fsync: false,
            text_retention: Default::default(),
        }
    }
}

/// What [`Store::apply_retention`] deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct RetentionReport {
    pub records_deleted: u64,
    pub rollups_deleted: u64,
    /// Captured texts deleted (their region's retention, or with their record).
    pub texts_deleted: u64,
}

/// Row counts and size on disk of the store.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct StoreStats {
    pub records: u64,
    pub rollups: u64,
    /// Size on disk, bytes: the SQLite file plus its write-ahead log, or the active parts of
    /// the ClickHouse database.
    pub file_bytes: u64,
}
