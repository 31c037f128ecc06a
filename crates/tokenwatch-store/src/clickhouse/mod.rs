// ClickHouseStore: the `Store` on a ClickHouse server over HTTP (23.8 and newer) — batched
// RowBinary inserts with deduplication tokens, query-time dedup of replacing tables, retention by
// table TTLs (or, with `ttl` off, by dropping day partitions).

pub(crate) mod client;
mod cluster;
mod insert;
mod markers;
mod query;
mod retention;
mod rowbinary;
mod schema;
mod scores;
mod scrape_targets;

use crate::{
    AnnotationRow, EmbeddingRow, LogQuery, LogRow, MarkerQuery, MarkerRow, RecordQuery,
    RetentionReport, RollupQuery, RollupRow, SpanQuery, SpanRow, Store, StoreError, StoreOptions,
    StoreStats,
};
use client::{Client, Params};
use retention::DayTable;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokenwatch_core::alert::Alert;
use tokenwatch_core::model::RequestRecord;

/// Where the ClickHouse store lives and how it is reached.
#[derive(Clone, PartialEq, Eq)]
pub struct ClickHouseConfig {
    /// `http://host:port` or `https://host:port` (ClickHouse Cloud: 8443) of the server's HTTP
    /// interface.
    pub url: String,
    /// Database holding tokenwatch's tables; created when missing.
    pub database: String,
    /// User for HTTP basic authentication; empty sends none.
    pub user: String,
    /// File holding the user's password (first line; surrounding whitespace is trimmed).
    pub password_file: Option<PathBuf>,
    /// Name of an environment variable holding the password (instead of `password_file`).
    pub password_env: Option<String>,
    /// PEM file of CA certificates trusted for `https://` besides the system's roots.
    pub ca_file: Option<PathBuf>,
    /// How long one operation keeps retrying transient failures (connection refused, 5xx).
    pub retry_for: Duration,
    /// Longest one HTTP request may take, response included.
    pub timeout: Duration,
    /// This instance's name in the roll-up key: instances sharing the database must each have
    /// their own (their minutes of one series are merged at query time, never replaced).
    pub writer_id: String,
    /// Retention by the tables' `TTL` (the server drops expired days and regional text in its
    /// merges); false: none, and `apply_retention` drops day partitions and deletes text at the
    /// time it is given (what a test with its own clock needs).
    pub ttl: bool,
    /// A cluster of the server's configuration (`remote_servers`): tables are created
    /// `ON CLUSTER` as `Replicated*` tables behind `Distributed` ones (`cluster`). None: one
    /// node.
    pub cluster: Option<String>,
}

impl Default for ClickHouseConfig {
    fn default() -> Self {
        ClickHouseConfig {
            url: "http://127.0.0.1:8123".into(),
            database: "tokenwatch".into(),
            user: "default".into(),
            password_file: None,
            password_env: None,
            ca_file: None,
            retry_for: Duration::from_secs(10),
            timeout: Duration::from_secs(30),
            writer_id: String::new(),
            ttl: true,
            cluster: None,
        }
    }
}

impl std::fmt::Debug for ClickHouseConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClickHouseConfig")
            .field("url", &self.url)
            .field("database", &self.database)
            .field("user", &self.user)
            .field("password_file", &self.password_file)
            .field("password_env", &self.password_env)
            .field("ca_file", &self.ca_file)
            .field("retry_for", &self.retry_for)
            .field("timeout", &self.timeout)
            .field("writer_id", &self.writer_id)
            .field("ttl", &self.ttl)
            .field("cluster", &self.cluster)
            .finish()
    }
}

impl ClickHouseConfig {
    /// The password from `password_file` or `password_env`, if one is set.
    fn password(&self) -> Result<Option<String>, StoreError> {
        self.password_from(|var| std::env::var(var))
    }

    fn password_from(
        &self,
        env: impl Fn(&str) -> Result<String, std::env::VarError>,
    ) -> Result<Option<String>, StoreError> {
        if let Some(var) = &self.password_env {
            if self.password_file.is_some() {
                return Err(StoreError::Config(
                    "clickhouse password: password_file and password_env are both set; keep one"
                        .into(),
                ));
            }
            return match env(var) {
                Ok(v) => Ok(Some(v.trim().to_string())),
                Err(e) => Err(StoreError::Config(format!(
                    "clickhouse password: environment variable {var}: {e}"
                ))),
            };
        }
        let Some(path) = &self.password_file else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path).map_err(|e| {
            StoreError::Config(format!(
                "cannot read clickhouse password file {}: {e}",
                path.display()
            ))
        })?;
        Ok(Some(text.lines().next().unwrap_or("").trim().to_string()))
    }
}

/// Orders rows by insertion across batches and threads (SQLite's rowid): wall-clock
/// nanoseconds, strictly increasing within the process.
fn next_seq(n: usize) -> u64 {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let n = n.max(1) as u64;
    let mut last = LAST.load(Ordering::Relaxed);
    loop {
        let start = now.max(last + 1);
        match LAST.compare_exchange_weak(last, start + n - 1, Ordering::SeqCst, Ordering::Relaxed) {
            Ok(_) => return start,
            Err(seen) => last = seen,
        }
    }
}

pub(crate) fn now_unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn retention_cutoff(now_unix_ms: i64, keep: Duration) -> i64 {
    now_unix_ms.saturating_sub(i64::try_from(keep.as_millis()).unwrap_or(i64::MAX))
}

const COUNT_ROWS: &str = "SELECT count() FROM {t} WHERE {cond}";
/// Distinct roll-up keys (a re-emitted minute not yet merged away counts once), hashed so the
/// count needs little memory.
const COUNT_ROLLUPS: &str = "SELECT uniqExact(cityHash64(minute_start_unix_ms, model_id, \
    runtime, instance, tenant, ab_group, model_version, bucket, metric, writer)) FROM {t} \
    WHERE {cond}";

/// Tables dropped by day with the raw-record retention, and the roll-ups' own (`ttl` off).
const RECORDS: DayTable = DayTable {
    table: schema::RECORDS,
    partition: schema::RECORDS_TIME.partition,
    count: Some(COUNT_ROWS),
};
const TEXT: DayTable = DayTable {
    table: schema::TEXT,
    partition: schema::TEXT_TIME.partition,
    count: Some(COUNT_ROWS),
};
const ROLLUPS: DayTable = DayTable {
    table: schema::ROLLUPS,
    partition: schema::ROLLUPS_TIME.partition,
    count: Some(COUNT_ROLLUPS),
};
/// Markers are kept as long as roll-ups.
const MARKERS: DayTable = DayTable {
    table: schema::MARKERS,
    partition: schema::MARKERS_TIME.partition,
    count: None,
};

/// The store on ClickHouse. Retention works by whole UTC days: a day's rows go once all of the
/// day is older than the retention (so a row lives up to a day past it), except captured text
/// of regions with a shorter retention, which is deleted row by row. With `ttl` (the default)
/// the server does it in its merges, on its own clock (within `merge_with_ttl_timeout`, 4 h);
/// without, `apply_retention` does it at the time it is given.
pub struct ClickHouseStore {
    client: Client,
    opts: StoreOptions,
    writer_id: String,
    ttl: bool,
}

impl std::fmt::Debug for ClickHouseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClickHouseStore")
            .field("database", &self.client.label())
            .field("opts", &self.opts)
            .finish()
    }
}

impl ClickHouseStore {
    /// Connects (retrying within `cfg.retry_for` while the server is unreachable), creates the
    /// database and applies pending migrations. `opts.fsync` does not apply (the server owns
    /// durability).
    pub fn open(cfg: &ClickHouseConfig, opts: StoreOptions) -> Result<ClickHouseStore, StoreError> {
        let password = cfg.password()?;
        let client = Client::new(cfg, password.as_deref())?;
        schema::migrate(&client)?;
        schema::apply_ttl(&client, &opts, cfg.ttl)?;
        tracing::debug!(database = %client.label(), "opened store");
        Ok(ClickHouseStore {
            client,
            opts,
            writer_id: cfg.writer_id.clone(),
            ttl: cfg.ttl,
        })
    }

    /// `clickhouse URL (database NAME)`.
    pub fn label(&self) -> &str {
        self.client.label()
    }

    pub fn options(&self) -> &StoreOptions {
        &self.opts
    }

    /// Runs one statement and returns the raw answer (for tests and tools: e.g.
    /// `SELECT count() FROM tokenwatch.records_v6 FORMAT TSV`).
    pub fn raw_query(&self, sql: &str) -> Result<Vec<u8>, StoreError> {
        self.client.query("raw query", sql, true)
    }
}

impl Store for ClickHouseStore {
    fn insert_records(&self, records: &[RequestRecord]) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        let seq = next_seq(records.len());
        // Text first: a failed record insert leaves at most text without a record, which
        // retention removes; never a record whose text was lost.
        if let Some(body) = insert::texts(records, seq) {
            self.client.insert(
                "insert_records (captured text)",
                schema::TEXT,
                insert::TEXT_COLUMNS,
                &body,
            )?;
        }
        let body = insert::records(records, seq);
        self.client.insert(
            "insert_records",
            schema::RECORDS,
            insert::RECORD_COLUMNS,
            &body,
        )
    }

    fn insert_rollups(&self, rows: &[RollupRow]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        let body = insert::rollups(rows, &self.writer_id, next_seq(rows.len()));
        self.client.insert(
            "insert_rollups",
            schema::ROLLUPS,
            insert::ROLLUP_COLUMNS,
            &body,
        )
    }

    fn query_records(&self, q: &RecordQuery) -> Result<Vec<RequestRecord>, StoreError> {
        query::records(&self.client, q)
    }

    fn query_rollups(&self, q: &RollupQuery) -> Result<Vec<RollupRow>, StoreError> {
        query::rollups(&self.client, q)
    }

    /// With `ttl` the server expires rows itself: only alerts (tombstones) are done here and the
    /// report counts none. Without, day partitions past the retention are dropped and regional
    /// text deleted, at `now_unix_ms`.
    fn apply_retention(&self, now_unix_ms: i64) -> Result<RetentionReport, StoreError> {
        let c = &self.client;
        let raw_cutoff = retention_cutoff(now_unix_ms, self.opts.raw_retention);
        let rollup_cutoff = retention_cutoff(now_unix_ms, self.opts.rollup_retention);
        let mut report = RetentionReport::default();
        if !self.ttl {
            report.records_deleted =
                retention::drop_old_partitions(c, &RECORDS, raw_cutoff, "retention of records")?;
            report.rollups_deleted =
                retention::drop_old_partitions(c, &ROLLUPS, rollup_cutoff, "retention of rollups")?;
            for t in schema::RAW_TIER_TIME {
                let day = DayTable {
                    table: t.table,
                    partition: t.partition,
                    count: None,
                };
                retention::drop_old_partitions(c, &day, raw_cutoff, "retention of telemetry")?;
            }
            retention::drop_old_partitions(c, &MARKERS, rollup_cutoff, "retention of markers")?;
            report.texts_deleted =
                retention::drop_old_partitions(c, &TEXT, raw_cutoff, "retention of captured text")?;
            report.texts_deleted += retention::delete_region_text(
                c,
                now_unix_ms,
                raw_cutoff,
                &self.opts.text_retention,
            )?;
        }
        let expired = query::expired_alert_ids(c, raw_cutoff)?;
        if !expired.is_empty() {
            let body = insert::alert_tombstones(&expired, next_seq(expired.len()), now_unix_ms);
            c.insert(
                "retention of alerts",
                schema::ALERTS,
                insert::ALERT_COLUMNS,
                &body,
            )?;
        }
        tracing::debug!(database = %c.label(), ?report, ttl = self.ttl, "applied retention");
        Ok(report)
    }

    fn stats(&self) -> Result<StoreStats, StoreError> {
        let c = &self.client;
        let db = c.database();
        let records = query::scalar_u64(
            c,
            "counting records",
            &format!("SELECT count() FROM {db}.{}", schema::RECORDS),
            &Params::default(),
        )?;
        let rollups = query::scalar_u64(
            c,
            "counting rollups",
            &COUNT_ROLLUPS
                .replace("{t}", &format!("{db}.{}", schema::ROLLUPS))
                .replace("{cond}", "1"),
            &Params::default(),
        )?;
        let mut p = Params::default();
        let file_bytes = query::scalar_u64(
            c,
            "reading the size on disk",
            &format!(
                "SELECT toUInt64(sum(bytes_on_disk)) FROM {} WHERE database = {} \
                 AND active",
                c.layout().system("parts"),
                p.str(db)
            ),
            &p,
        )?;
        Ok(StoreStats {
            records,
            rollups,
            file_bytes,
        })
    }

    fn insert_spans(&self, spans: &[SpanRow]) -> Result<(), StoreError> {
        if spans.is_empty() {
            return Ok(());
        }
        let body = insert::spans(spans, next_seq(spans.len()));
        self.client
            .insert("insert_spans", schema::SPANS, insert::SPAN_COLUMNS, &body)
    }

    fn query_spans(&self, q: &SpanQuery) -> Result<Vec<SpanRow>, StoreError> {
        query::spans(&self.client, q)
    }

    fn insert_logs(&self, logs: &[LogRow]) -> Result<(), StoreError> {
        if logs.is_empty() {
            return Ok(());
        }
        let body = insert::logs(logs, next_seq(logs.len()));
        self.client
            .insert("insert_logs", schema::LOGS, insert::LOG_COLUMNS, &body)
    }

    fn query_logs(&self, q: &LogQuery) -> Result<Vec<LogRow>, StoreError> {
        query::logs(&self.client, q)
    }

    fn insert_embeddings(&self, rows: &[EmbeddingRow]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        let body = insert::embeddings(rows, next_seq(rows.len()));
        self.client.insert(
            "insert_embeddings",
            schema::EMBEDDINGS,
            insert::EMBEDDING_COLUMNS,
            &body,
        )
    }

    fn insert_annotations(&self, rows: &[AnnotationRow]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        let body = insert::annotations(rows, next_seq(rows.len()));
        self.client.insert(
            "insert_annotations",
            schema::ANNOTATIONS,
            insert::ANNOTATION_COLUMNS,
            &body,
        )
    }

    fn query_annotations(&self, request_ids: &[String]) -> Result<Vec<AnnotationRow>, StoreError> {
        if request_ids.is_empty() {
            return Ok(Vec::new());
        }
        query::annotations(&self.client, request_ids)
    }

    fn upsert_alerts(&self, list: &[Alert]) -> Result<(), StoreError> {
        if list.is_empty() {
            return Ok(());
        }
        let body = insert::alerts(list, next_seq(list.len())).map_err(|(id, detail)| {
            StoreError::InvalidInput {
                database: self.client.label().to_string(),
                what: format!("alert {id}"),
                detail,
            }
        })?;
        self.client.insert(
            "upsert_alerts",
            schema::ALERTS,
            insert::ALERT_COLUMNS,
            &body,
        )
    }

    fn delete_alerts(&self, ids: &[String]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        let body = insert::alert_tombstones(ids, next_seq(ids.len()), now_unix_ms());
        self.client.insert(
            "delete_alerts",
            schema::ALERTS,
            insert::ALERT_COLUMNS,
            &body,
        )
    }

    fn load_alerts(&self, resolved_since_unix_ms: i64) -> Result<Vec<Alert>, StoreError> {
        query::alerts(&self.client, resolved_since_unix_ms)
    }

    fn upsert_scrape_targets(&self, rows: &[crate::ScrapeTargetRow]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        let body = scrape_targets::rows(rows, next_seq(rows.len())).map_err(|(url, detail)| {
            StoreError::InvalidInput {
                database: self.client.label().to_string(),
                what: format!("scrape target {url}"),
                detail,
            }
        })?;
        self.client.insert(
            "upsert_scrape_targets",
            schema::SCRAPE_TARGETS,
            scrape_targets::COLUMNS,
            &body,
        )
    }

    fn load_scrape_targets(
        &self,
        updated_since_unix_ms: i64,
    ) -> Result<Vec<crate::ScrapeTargetRow>, StoreError> {
        scrape_targets::load(&self.client, updated_since_unix_ms)
    }

    fn insert_markers(&self, rows: &[MarkerRow]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        let body = markers::rows(rows, next_seq(rows.len()));
        self.client
            .insert("insert_markers", schema::MARKERS, markers::COLUMNS, &body)
    }

    fn query_markers(&self, q: &MarkerQuery) -> Result<Vec<MarkerRow>, StoreError> {
        markers::query(&self.client, q)
    }

    fn query_spend(&self, q: &crate::SpendQuery) -> Result<Vec<crate::SpendRow>, StoreError> {
        query::spend(&self.client, q)
    }

    fn insert_scores(&self, rows: &[crate::ScoreRow]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        let body = scores::rows(rows, next_seq(rows.len()));
        self.client
            .insert("insert_scores", schema::SCORES, scores::COLUMNS, &body)
    }

    fn query_scores(
        &self,
        request_ids: &[String],
        trace_ids: &[String],
    ) -> Result<Vec<crate::ScoreRow>, StoreError> {
        if request_ids.is_empty() && trace_ids.is_empty() {
            return Ok(Vec::new());
        }
        scores::query(&self.client, request_ids, trace_ids)
    }
}

/// The current records table (for the test harness's schema comparison).
#[cfg(any(test, feature = "conformance"))]
pub(crate) fn schema_records_table() -> &'static str {
    schema::RECORDS
}

/// What `testing::compare_record_schemas` needs of the store's internals.
#[cfg(any(test, feature = "conformance"))]
pub(crate) mod bench_support {
    use super::{StoreError, client::Client, insert, schema};

    pub(crate) const RECORD_COLUMNS: &str = insert::RECORD_COLUMNS;

    pub(crate) fn encode_records(rows: &[RequestRecord], seq: u64) -> Vec<u8> {
        insert::records(rows, seq)
    }

    use tokenwatch_core::model::RequestRecord;

    /// Schema version 5's tables, and the current records table beside them.
    pub(crate) fn create_v5_and_v6_records(client: &Client) -> Result<(), StoreError> {
        schema::migrate_up_to(client, 5)?;
        let create = schema::MIGRATIONS
            .iter()
            .flat_map(|m| m.statements)
            .find(|s| {
                s.starts_with(&format!(
                    "CREATE TABLE IF NOT EXISTS {{db}}.{} (",
                    schema::RECORDS
                ))
            })
            .ok_or_else(|| StoreError::Config("no CREATE of the records table".into()))?;
        client.query(
            "benchmark table",
            &create.replace("{db}", client.database()),
            true,
        )?;
        for table in ["records_v6", "records"] {
            for alter in schema::RECORDS_COST_COLUMNS {
                let sql = alter
                    .replace("{db}.records_v6", &format!("{{db}}.{table}"))
                    .replace("{db}", client.database());
                client.query("benchmark table", &sql, true)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod server_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seq_is_strictly_increasing_across_threads() {
        let handles: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(|| (0..1000).map(|_| next_seq(3)).collect::<Vec<_>>()))
            .collect();
        let mut all: Vec<u64> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .flat_map(|s| [s, s + 1, s + 2])
            .collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "ranges never overlap");
    }

    #[test]
    fn password_comes_from_its_file_and_never_shows_in_debug() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("pw");
        std::fs::write(&f, "s3cret\n").unwrap();
        let cfg = ClickHouseConfig {
            password_file: Some(f),
            ..Default::default()
        };
        assert_eq!(cfg.password().unwrap().as_deref(), Some("s3cret"));
        assert!(!format!("{cfg:?}").contains("s3cret"));
        let missing = ClickHouseConfig {
            password_file: Some(dir.path().join("nope")),
            ..Default::default()
        };
        let err = missing.password().unwrap_err().to_string();
        assert!(
            err.contains("password file") && err.contains("nope"),
            "{err}"
        );
    }

    #[test]
    fn password_may_come_from_an_environment_variable_but_not_from_both() {
        let env = |v: &str| match v {
            "CH_PW" => Ok(" from-env\n".to_string()),
            _ => Err(std::env::VarError::NotPresent),
        };
        let cfg = ClickHouseConfig {
            password_env: Some("CH_PW".into()),
            ..Default::default()
        };
        assert_eq!(cfg.password_from(env).unwrap().as_deref(), Some("from-env"));
        assert!(!format!("{cfg:?}").contains("from-env"));
        let unset = ClickHouseConfig {
            password_env: Some("NOPE".into()),
            ..Default::default()
        };
        let err = unset.password_from(env).unwrap_err().to_string();
        assert!(err.contains("NOPE"), "{err}");
        let both = ClickHouseConfig {
            password_file: Some("/x".into()),
            ..cfg
        };
        let err = both.password_from(env).unwrap_err().to_string();
        assert!(err.contains("both"), "{err}");
    }
}
