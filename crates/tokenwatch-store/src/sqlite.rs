// SqliteStore: the `Store` on one SQLite file in WAL mode — a mutex-guarded write connection
// (one transaction per batch) and a separate query-only read connection.

use crate::alerts;
use crate::annotations::{self, AnnotationRow};
use crate::codec::{self, RECORD_COLUMNS, RECORD_SELECT, ROLLUP_COLUMNS};
use crate::embeddings::{self, EmbeddingRow};
use crate::markers::{self, MarkerQuery, MarkerRow};
use crate::scores::{self, ScoreRow};
use crate::scrape_targets;
use crate::telemetry::{self, LogQuery, LogRow, SpanQuery, SpanRow};
use crate::text;
use crate::{
    DB_FILE_NAME, RecordOutcome, RecordQuery, RetentionReport, RollupQuery, RollupRow, Store,
    StoreError, StoreOptions, StoreStats, schema,
};
use rusqlite::types::Value;
use rusqlite::{Connection, TransactionBehavior, params_from_iter};
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokenwatch_core::model::RequestRecord;

/// Rows deleted per retention transaction, so writers never wait long behind a big delete.
const RETENTION_CHUNK: i64 = 10_000;
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

static INSERT_RECORD: LazyLock<String> = LazyLock::new(|| {
    let n = RECORD_COLUMNS.split(',').count();
    format!(
        "INSERT INTO records ({RECORD_COLUMNS}) VALUES ({})",
        vec!["?"; n].join(", ")
    )
});
static INSERT_ROLLUP: LazyLock<String> = LazyLock::new(|| {
    let n = ROLLUP_COLUMNS.split(',').count();
    format!(
        "INSERT OR REPLACE INTO rollups ({ROLLUP_COLUMNS}) VALUES ({})",
        vec!["?"; n].join(", ")
    )
});

/// The embedded store: `<data_dir>/tokenwatch.db`.
pub struct SqliteStore {
    path: PathBuf,
    opts: StoreOptions,
    write: Mutex<Connection>,
    read: Mutex<Connection>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .field("opts", &self.opts)
            .finish()
    }
}

impl SqliteStore {
    /// Creates `data_dir` if needed, opens (or creates) `tokenwatch.db` in it and applies any
    /// pending migrations. A damaged or foreign file is an error naming its path.
    pub fn open(data_dir: &Path, opts: StoreOptions) -> Result<SqliteStore, StoreError> {
        std::fs::create_dir_all(data_dir).map_err(|source| StoreError::CreateDir {
            path: data_dir.to_path_buf(),
            source,
        })?;
        let path = data_dir.join(DB_FILE_NAME);
        let mut write = open_connection(&path)?;
        let sync = if opts.fsync { "FULL" } else { "NORMAL" };
        write
            .pragma_update(None, "synchronous", sync)
            .map_err(|source| StoreError::Open {
                path: path.clone(),
                source: Box::new(source),
            })?;
        schema::migrate(&mut write, &path)?;
        let read = open_connection(&path)?;
        read.pragma_update(None, "query_only", true)
            .map_err(|source| StoreError::Open {
                path: path.clone(),
                source: Box::new(source),
            })?;
        tracing::debug!(path = %path.display(), fsync = opts.fsync, "opened store");
        Ok(SqliteStore {
            path,
            opts,
            write: Mutex::new(write),
            read: Mutex::new(read),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn options(&self) -> &StoreOptions {
        &self.opts
    }

    fn err(&self, op: &'static str) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
        move |source: rusqlite::Error| StoreError::Backend {
            database: self.path.display().to_string(),
            op,
            source: Box::new(source),
        }
    }

    fn invalid(&self, what: String) -> impl FnOnce(String) -> StoreError + '_ {
        move |detail| StoreError::InvalidInput {
            database: self.path.display().to_string(),
            what,
            detail,
        }
    }

    /// Deletes matching rows `RETENTION_CHUNK` at a time, each chunk its own transaction.
    fn delete_chunked(&self, sql: &str, cutoff: i64, op: &'static str) -> Result<u64, StoreError> {
        let mut total = 0u64;
        loop {
            let n = {
                let conn = lock(&self.write);
                let mut st = conn.prepare_cached(sql).map_err(self.err(op))?;
                st.execute([cutoff, RETENTION_CHUNK])
                    .map_err(self.err(op))?
            };
            total += n as u64;
            if (n as i64) < RETENTION_CHUNK {
                return Ok(total);
            }
        }
    }

    fn count(&self, conn: &Connection, table: &str, op: &'static str) -> Result<u64, StoreError> {
        let n: i64 = conn
            .query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))
            .map_err(self.err(op))?;
        Ok(n.max(0) as u64)
    }
}

/// Opens one connection, forces a read of the file header (so a damaged or non-SQLite file
/// fails here, naming the path) and switches the file to WAL.
fn open_connection(path: &Path) -> Result<Connection, StoreError> {
    let open = |source: rusqlite::Error| StoreError::Open {
        path: path.to_path_buf(),
        source: Box::new(source),
    };
    let conn = Connection::open(path).map_err(open)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(open)?;
    conn.query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| {
        r.get::<_, i64>(0)
    })
    .map_err(open)?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(open)?;
    if !mode.eq_ignore_ascii_case("wal") {
        tracing::warn!(path = %path.display(), %mode, "WAL not available; using rollback journal");
    }
    Ok(conn)
}

fn lock(m: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    // A panic mid-transaction drops (rolls back) the transaction: the connection stays usable.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn where_clause(conds: &[&str]) -> String {
    if conds.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conds.join(" AND "))
    }
}

fn retention_cutoff(now_unix_ms: i64, keep: Duration) -> i64 {
    now_unix_ms.saturating_sub(i64::try_from(keep.as_millis()).unwrap_or(i64::MAX))
}

impl Store for SqliteStore {
    fn insert_records(&self, records: &[RequestRecord]) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        let mut conn = lock(&self.write);
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(self.err("begin insert_records"))?;
        {
            let mut st = tx
                .prepare_cached(&INSERT_RECORD)
                .map_err(self.err("insert_records"))?;
            for r in records {
                let params = codec::record_params(r)
                    .map_err(self.invalid(format!("record {:?}", r.request_id)))?;
                st.execute(params_from_iter(params))
                    .map_err(self.err("insert_records"))?;
            }
        }
        text::insert(&tx, records).map_err(self.err("insert_records (captured text)"))?;
        tx.commit().map_err(self.err("commit insert_records"))
    }

    fn insert_rollups(&self, rows: &[RollupRow]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        let mut conn = lock(&self.write);
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(self.err("begin insert_rollups"))?;
        {
            let mut st = tx
                .prepare_cached(&INSERT_ROLLUP)
                .map_err(self.err("insert_rollups"))?;
            for r in rows {
                let what = format!(
                    "roll-up {:?} {} minute {}",
                    r.labels.model_id, r.metric, r.minute_start_unix_ms
                );
                let params = codec::rollup_params(r).map_err(self.invalid(what))?;
                st.execute(params_from_iter(params))
                    .map_err(self.err("insert_rollups"))?;
            }
        }
        tx.commit().map_err(self.err("commit insert_rollups"))
    }

    fn query_records(&self, q: &RecordQuery) -> Result<Vec<RequestRecord>, StoreError> {
        let mut conds = Vec::new();
        let mut params = Vec::new();
        if let Some(m) = &q.model {
            conds.push("model_id = ?");
            params.push(Value::Text(m.clone()));
        }
        if let Some(since) = q.since_unix_ms {
            conds.push("arrival_unix_ms >= ?");
            params.push(Value::Integer(since));
        }
        if let Some(t) = &q.tenant {
            conds.push("tenant = ?");
            params.push(Value::Text(t.clone()));
        }
        if let Some(id) = &q.request_id {
            conds.push("request_id = ?");
            params.push(Value::Text(id.clone()));
        }
        if let Some(id) = &q.trace_id {
            conds.push("trace_id = ?");
            params.push(Value::Text(id.clone()));
        }
        match q.outcome {
            None => {}
            Some(RecordOutcome::Ok) => conds.push("(error_class IS NULL AND status < 400)"),
            Some(RecordOutcome::Error) => conds.push("NOT (error_class IS NULL AND status < 400)"),
            Some(RecordOutcome::Class(c)) => {
                conds.push("error_class = ?");
                params.push(Value::Text(c.name().to_owned()));
            }
        }
        if let Some(min) = q.min_e2e_s.filter(|v| v.is_finite()) {
            conds.push("end_s >= ?");
            params.push(Value::Real(min));
        }
        if q.annotated {
            conds.push("request_id IN (SELECT request_id FROM annotations)");
        }
        params.push(Value::Integer(i64::try_from(q.limit).unwrap_or(i64::MAX)));
        let order = if q.request_id.is_some() {
            "ASC"
        } else {
            "DESC"
        };
        let sql = format!(
            "SELECT id, {} FROM records{} ORDER BY arrival_unix_ms {order}, id {order} LIMIT ?",
            *RECORD_SELECT,
            where_clause(&conds)
        );
        let conn = lock(&self.read);
        let mut st = conn
            .prepare_cached(&sql)
            .map_err(self.err("query_records"))?;
        let mut rows = st
            .query(params_from_iter(params))
            .map_err(self.err("query_records"))?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(self.err("query_records"))? {
            out.push(codec::record_from_row(row, &self.path)?);
        }
        drop(rows);
        if q.with_text {
            text::attach(&conn, &mut out).map_err(self.err("query_records (captured text)"))?;
        }
        Ok(out)
    }

    fn query_rollups(&self, q: &RollupQuery) -> Result<Vec<RollupRow>, StoreError> {
        let mut conds = vec!["minute_start_unix_ms >= ?", "minute_start_unix_ms < ?"];
        let mut params = vec![Value::Integer(q.from_unix_ms), Value::Integer(q.to_unix_ms)];
        if let Some(m) = &q.model {
            conds.push("model_id = ?");
            params.push(Value::Text(m.clone()));
        }
        if let Some(m) = q.metric {
            conds.push("metric = ?");
            params.push(Value::Text(m.name().to_owned()));
        }
        let sql = format!(
            "SELECT {ROLLUP_COLUMNS} FROM rollups{} ORDER BY minute_start_unix_ms, model_id, \
             runtime, instance, tenant, ab_group, model_version, bucket, metric",
            where_clause(&conds)
        );
        let conn = lock(&self.read);
        let mut st = conn
            .prepare_cached(&sql)
            .map_err(self.err("query_rollups"))?;
        let mut rows = st
            .query(params_from_iter(params))
            .map_err(self.err("query_rollups"))?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(self.err("query_rollups"))? {
            out.push(codec::rollup_from_row(row, &self.path)?);
        }
        Ok(out)
    }

    fn apply_retention(&self, now_unix_ms: i64) -> Result<RetentionReport, StoreError> {
        let raw_cutoff = retention_cutoff(now_unix_ms, self.opts.raw_retention);
        let rollup_cutoff = retention_cutoff(now_unix_ms, self.opts.rollup_retention);
        let records_deleted = self.delete_chunked(
            "DELETE FROM records WHERE id IN \
             (SELECT id FROM records WHERE arrival_unix_ms < ?1 LIMIT ?2)",
            raw_cutoff,
            "retention of records",
        )?;
        let rollups_deleted = self.delete_chunked(
            "DELETE FROM rollups WHERE (model_id, runtime, instance, tenant, ab_group, \
             model_version, bucket, metric, minute_start_unix_ms) IN \
             (SELECT model_id, runtime, instance, tenant, ab_group, model_version, bucket, \
              metric, minute_start_unix_ms FROM rollups WHERE minute_start_unix_ms < ?1 LIMIT ?2)",
            rollup_cutoff,
            "retention of rollups",
        )?;
        // Spans and log records follow the raw-record retention.
        self.delete_chunked(telemetry::RETENTION_SPANS, raw_cutoff, "retention of spans")?;
        self.delete_chunked(telemetry::RETENTION_LOGS, raw_cutoff, "retention of logs")?;
        self.delete_chunked(embeddings::RETENTION, raw_cutoff, "retention of embeddings")?;
        self.delete_chunked(
            annotations::RETENTION,
            raw_cutoff,
            "retention of annotations",
        )?;
        self.delete_chunked(alerts::RETENTION, raw_cutoff, "retention of alerts")?;
        self.delete_chunked(
            scrape_targets::RETENTION,
            raw_cutoff,
            "retention of scrape targets",
        )?;
        self.delete_chunked(markers::RETENTION, rollup_cutoff, "retention of markers")?;
        self.delete_chunked(scores::RETENTION, raw_cutoff, "retention of scores")?;
        let texts_deleted = text::apply_retention(
            &lock(&self.write),
            now_unix_ms,
            raw_cutoff,
            &self.opts.text_retention,
        )
        .map_err(self.err("retention of captured text"))?;
        let report = RetentionReport {
            records_deleted,
            rollups_deleted,
            texts_deleted,
        };
        tracing::debug!(path = %self.path.display(), ?report, "applied retention");
        Ok(report)
    }

    fn insert_spans(&self, spans: &[SpanRow]) -> Result<(), StoreError> {
        if spans.is_empty() {
            return Ok(());
        }
        telemetry::insert_spans(&mut lock(&self.write), spans).map_err(self.err("insert_spans"))
    }

    fn query_spans(&self, q: &SpanQuery) -> Result<Vec<SpanRow>, StoreError> {
        telemetry::query_spans(&lock(&self.read), q).map_err(self.err("query_spans"))
    }

    fn insert_logs(&self, logs: &[LogRow]) -> Result<(), StoreError> {
        if logs.is_empty() {
            return Ok(());
        }
        telemetry::insert_logs(&mut lock(&self.write), logs).map_err(self.err("insert_logs"))
    }

    fn query_logs(&self, q: &LogQuery) -> Result<Vec<LogRow>, StoreError> {
        telemetry::query_logs(&lock(&self.read), q).map_err(self.err("query_logs"))
    }

    fn insert_embeddings(&self, rows: &[EmbeddingRow]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        embeddings::insert(&mut lock(&self.write), rows).map_err(self.err("insert_embeddings"))
    }

    fn insert_annotations(&self, rows: &[AnnotationRow]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        annotations::insert(&mut lock(&self.write), rows).map_err(self.err("insert_annotations"))
    }

    fn insert_scores(&self, rows: &[ScoreRow]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        scores::insert(&mut lock(&self.write), rows).map_err(self.err("insert_scores"))
    }

    fn query_scores(
        &self,
        request_ids: &[String],
        trace_ids: &[String],
    ) -> Result<Vec<ScoreRow>, StoreError> {
        if request_ids.is_empty() && trace_ids.is_empty() {
            return Ok(Vec::new());
        }
        scores::query(&lock(&self.read), request_ids, trace_ids).map_err(self.err("query_scores"))
    }

    fn query_annotations(&self, request_ids: &[String]) -> Result<Vec<AnnotationRow>, StoreError> {
        if request_ids.is_empty() {
            return Ok(Vec::new());
        }
        annotations::query(&lock(&self.read), request_ids).map_err(self.err("query_annotations"))
    }

    fn upsert_alerts(&self, list: &[tokenwatch_core::alert::Alert]) -> Result<(), StoreError> {
        if list.is_empty() {
            return Ok(());
        }
        alerts::upsert(&mut lock(&self.write), list).map_err(|e| match e {
            alerts::UpsertError::Sqlite(source) => self.err("upsert_alerts")(source),
            alerts::UpsertError::Json(id, e) => self.invalid(format!("alert {id}"))(e.to_string()),
        })
    }

    fn delete_alerts(&self, ids: &[String]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        alerts::delete(&mut lock(&self.write), ids).map_err(self.err("delete_alerts"))
    }

    fn load_alerts(
        &self,
        resolved_since_unix_ms: i64,
    ) -> Result<Vec<tokenwatch_core::alert::Alert>, StoreError> {
        alerts::load(&lock(&self.read), resolved_since_unix_ms).map_err(self.err("load_alerts"))
    }

    fn upsert_scrape_targets(&self, rows: &[crate::ScrapeTargetRow]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        scrape_targets::upsert(&mut lock(&self.write), rows).map_err(|e| match e {
            scrape_targets::UpsertError::Sqlite(source) => {
                self.err("upsert_scrape_targets")(source)
            }
            scrape_targets::UpsertError::Json(url, e) => {
                self.invalid(format!("scrape target {url}"))(e.to_string())
            }
        })
    }

    fn load_scrape_targets(
        &self,
        updated_since_unix_ms: i64,
    ) -> Result<Vec<crate::ScrapeTargetRow>, StoreError> {
        scrape_targets::load(&lock(&self.read), updated_since_unix_ms)
            .map_err(self.err("load_scrape_targets"))
    }

    fn insert_markers(&self, rows: &[MarkerRow]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        markers::insert(&mut lock(&self.write), rows).map_err(self.err("insert_markers"))
    }

    fn query_markers(&self, q: &MarkerQuery) -> Result<Vec<MarkerRow>, StoreError> {
        markers::query(&lock(&self.read), q).map_err(self.err("query_markers"))
    }

    fn query_spend(&self, q: &crate::SpendQuery) -> Result<Vec<crate::SpendRow>, StoreError> {
        crate::spend::query(&lock(&self.read), q).map_err(self.err("query_spend"))
    }

    fn stats(&self) -> Result<StoreStats, StoreError> {
        let (records, rollups) = {
            let conn = lock(&self.read);
            (
                self.count(&conn, "records", "counting records")?,
                self.count(&conn, "rollups", "counting rollups")?,
            )
        };
        let io = |source| StoreError::Io {
            path: self.path.clone(),
            source,
        };
        let mut file_bytes = std::fs::metadata(&self.path).map_err(io)?.len();
        let mut wal = self.path.clone().into_os_string();
        wal.push("-wal");
        match std::fs::metadata(&wal) {
            Ok(m) => file_bytes += m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        Ok(StoreStats {
            records,
            rollups,
            file_bytes,
        })
    }
}

#[cfg(test)]
#[path = "sqlite_tests.rs"]
mod tests;
