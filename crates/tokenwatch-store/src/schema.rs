// The database schema as a numbered list of migrations, each applied once and recorded in
// `schema_migrations`; `migrate` is idempotent and refuses a database from a newer build.

use crate::StoreError;
use rusqlite::{Connection, TransactionBehavior};
use std::path::Path;

pub(crate) struct Migration {
    pub version: i64,
    pub name: &'static str,
    pub sql: &'static str,
}

/// Append-only: never edit an applied migration, add a new one.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "request records",
        sql: "
        CREATE TABLE records (
            id                 INTEGER PRIMARY KEY,
            request_id         TEXT    NOT NULL,
            trace_id           TEXT    NOT NULL,
            model_id           TEXT    NOT NULL,
            runtime            TEXT    NOT NULL,
            instance           TEXT    NOT NULL,
            tenant             TEXT    NOT NULL,
            ab_group           TEXT    NOT NULL,
            model_version      TEXT    NOT NULL,
            prompt_version     TEXT    NOT NULL,
            endpoint           TEXT    NOT NULL,
            stream             INTEGER NOT NULL,
            arrival_unix_ms    INTEGER NOT NULL,
            upstream_headers_s REAL,
            first_token_s      REAL,
            end_s              REAL,
            queue_s            REAL,
            chunk_offsets_us   BLOB    NOT NULL,
            gap_count          INTEGER NOT NULL,
            gap_mean_s         REAL,
            gap_max_s          REAL,
            prompt_tokens      INTEGER,
            output_tokens      INTEGER,
            tokens_from_usage  INTEGER NOT NULL,
            finish_reason      TEXT    NOT NULL,
            status             INTEGER NOT NULL,
            error_class        TEXT
        );
        CREATE INDEX records_model_arrival ON records (model_id, arrival_unix_ms);
        CREATE INDEX records_arrival ON records (arrival_unix_ms);
        CREATE INDEX records_request_id ON records (request_id);
        CREATE INDEX records_trace_id ON records (trace_id);
        ",
    },
    Migration {
        version: 2,
        name: "per-minute sketch roll-ups",
        sql: "
        CREATE TABLE rollups (
            model_id             TEXT    NOT NULL,
            runtime              TEXT    NOT NULL,
            instance             TEXT    NOT NULL,
            tenant               TEXT    NOT NULL,
            ab_group             TEXT    NOT NULL,
            model_version        TEXT    NOT NULL,
            bucket               TEXT    NOT NULL,
            metric               TEXT    NOT NULL,
            minute_start_unix_ms INTEGER NOT NULL,
            count                INTEGER NOT NULL,
            sketch               BLOB    NOT NULL,
            PRIMARY KEY (model_id, runtime, instance, tenant, ab_group, model_version,
                         bucket, metric, minute_start_unix_ms)
        ) WITHOUT ROWID;
        CREATE INDEX rollups_metric_minute ON rollups (metric, minute_start_unix_ms);
        CREATE INDEX rollups_minute ON rollups (minute_start_unix_ms);
        ",
    },
    Migration {
        version: 3,
        name: "OTLP spans",
        sql: "
        CREATE TABLE spans (
            id              INTEGER PRIMARY KEY,
            trace_id        TEXT    NOT NULL,
            span_id         TEXT    NOT NULL,
            parent_span_id  TEXT    NOT NULL,
            name            TEXT    NOT NULL,
            kind            INTEGER NOT NULL,
            start_unix_nano INTEGER NOT NULL,
            end_unix_nano   INTEGER NOT NULL,
            status_code     INTEGER NOT NULL,
            status_message  TEXT    NOT NULL,
            service_name    TEXT    NOT NULL,
            attributes      TEXT    NOT NULL,
            events_count    INTEGER NOT NULL,
            UNIQUE (trace_id, span_id)
        );
        CREATE INDEX spans_start ON spans (start_unix_nano);
        ",
    },
    Migration {
        version: 4,
        name: "OTLP log records",
        sql: "
        CREATE TABLE logs (
            id              INTEGER PRIMARY KEY,
            time_unix_nano  INTEGER NOT NULL,
            severity_number INTEGER NOT NULL,
            severity_text   TEXT    NOT NULL,
            body            TEXT    NOT NULL,
            trace_id        TEXT    NOT NULL,
            span_id         TEXT    NOT NULL,
            service_name    TEXT    NOT NULL,
            attributes      TEXT    NOT NULL
        );
        CREATE INDEX logs_time ON logs (time_unix_nano);
        CREATE INDEX logs_trace_id ON logs (trace_id);
        ",
    },
    Migration {
        version: 5,
        name: "output embeddings and prefix-cache keys",
        sql: "
        ALTER TABLE records ADD COLUMN embedding BLOB;
        ALTER TABLE records ADD COLUMN prefix_key INTEGER;
        CREATE TABLE embeddings (
            id         INTEGER PRIMARY KEY,
            request_id TEXT    NOT NULL,
            model_id   TEXT    NOT NULL,
            at_unix_ms INTEGER NOT NULL,
            embedding  BLOB    NOT NULL
        );
        CREATE INDEX embeddings_request_id ON embeddings (request_id);
        CREATE INDEX embeddings_at ON embeddings (at_unix_ms);
        ",
    },
    Migration {
        version: 6,
        name: "per-request anomaly annotations",
        sql: "
        CREATE TABLE annotations (
            id          INTEGER PRIMARY KEY,
            request_id  TEXT    NOT NULL,
            model_id    TEXT    NOT NULL,
            instance    TEXT    NOT NULL,
            at_unix_ms  INTEGER NOT NULL,
            detector    TEXT    NOT NULL,
            score       REAL    NOT NULL,
            joint_grade TEXT    NOT NULL,
            value       REAL    NOT NULL,
            summary     TEXT    NOT NULL,
            evidence    TEXT    NOT NULL
        );
        CREATE INDEX annotations_request_id ON annotations (request_id);
        CREATE INDEX annotations_at ON annotations (at_unix_ms);
        ",
    },
    Migration {
        version: 7,
        name: "reasoning token counts",
        sql: "
        ALTER TABLE records ADD COLUMN reasoning_tokens INTEGER;
        ",
    },
    Migration {
        version: 8,
        name: "captured text (masked), by region",
        sql: "
        CREATE TABLE record_text (
            id              INTEGER PRIMARY KEY,
            request_id      TEXT    NOT NULL,
            arrival_unix_ms INTEGER NOT NULL,
            region          TEXT    NOT NULL,
            prompt          TEXT    NOT NULL,
            completion      TEXT    NOT NULL,
            masked          TEXT    NOT NULL,
            truncated       INTEGER NOT NULL
        );
        CREATE INDEX record_text_request_id ON record_text (request_id);
        CREATE INDEX record_text_region_arrival ON record_text (region, arrival_unix_ms);
        CREATE INDEX record_text_arrival ON record_text (arrival_unix_ms);
        ",
    },
    Migration {
        version: 9,
        name: "alerts (survive restarts)",
        sql: "
        CREATE TABLE alerts (
            id                  TEXT    PRIMARY KEY,
            fingerprint         TEXT    NOT NULL,
            state               TEXT    NOT NULL,
            active_at_unix_ms   INTEGER NOT NULL,
            updated_unix_ms     INTEGER NOT NULL,
            resolved_at_unix_ms INTEGER,
            alert               TEXT    NOT NULL
        );
        CREATE INDEX alerts_state ON alerts (state);
        CREATE INDEX alerts_resolved_at ON alerts (resolved_at_unix_ms);
        ",
    },
    Migration {
        version: 10,
        name: "scrape targets (sharded collectors' shared view)",
        sql: "
        CREATE TABLE scrape_targets (
            url             TEXT    PRIMARY KEY,
            updated_unix_ms INTEGER NOT NULL,
            target          TEXT    NOT NULL
        );
        CREATE INDEX scrape_targets_updated ON scrape_targets (updated_unix_ms);
        ",
    },
    Migration {
        version: 11,
        name: "version and deploy markers",
        sql: "
        CREATE TABLE markers (
            id           TEXT    PRIMARY KEY,
            kind         TEXT    NOT NULL,
            model        TEXT    NOT NULL,
            from_version TEXT    NOT NULL,
            to_version   TEXT    NOT NULL,
            source       TEXT    NOT NULL,
            at_unix_ms   INTEGER NOT NULL,
            note         TEXT    NOT NULL
        );
        CREATE INDEX markers_model_at ON markers (model, at_unix_ms);
        CREATE INDEX markers_at ON markers (at_unix_ms);
        ",
    },
    Migration {
        version: 12,
        name: "feedback and evaluation scores",
        sql: "
        CREATE TABLE scores (
            id         INTEGER PRIMARY KEY,
            request_id TEXT    NOT NULL,
            trace_id   TEXT    NOT NULL,
            at_unix_ms INTEGER NOT NULL,
            name       TEXT    NOT NULL,
            value      REAL    NOT NULL,
            source     TEXT    NOT NULL
        );
        CREATE INDEX scores_request_id ON scores (request_id);
        CREATE INDEX scores_trace_id ON scores (trace_id);
        CREATE INDEX scores_at ON scores (at_unix_ms);
        ",
    },
    Migration {
        version: 13,
        name: "compact span attributes",
        // No table changes: `spans.attributes` may now hold the compact form (a BLOB, see
        // span_attrs.rs) beside JSON text. The version makes builds that only read text refuse
        // the file (SchemaTooNew) instead of failing on the first compact row.
        sql: "SELECT 1;",
    },
    Migration {
        version: 14,
        name: "cached input tokens and request cost",
        sql: "
        ALTER TABLE records ADD COLUMN cached_input_tokens INTEGER;
        ALTER TABLE records ADD COLUMN cost_usd REAL;
        ",
    },
];

/// The highest schema version this build knows.
pub(crate) fn latest_version() -> i64 {
    MIGRATIONS.iter().map(|m| m.version).max().unwrap_or(0)
}

/// Applies every migration not yet recorded, each in its own IMMEDIATE transaction (so two
/// processes opening the same file at once cannot both apply one).
pub(crate) fn migrate(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let sqlite = |op: &'static str| {
        move |source: rusqlite::Error| StoreError::Backend {
            database: path.display().to_string(),
            op,
            source: Box::new(source),
        }
    };
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
            version         INTEGER PRIMARY KEY,
            name            TEXT    NOT NULL,
            applied_unix_ms INTEGER NOT NULL
        );",
    )
    .map_err(sqlite("creating schema_migrations"))?;

    let found: i64 = conn
        .query_row(
            "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
            [],
            |r| r.get(0),
        )
        .map_err(sqlite("reading schema version"))?;
    if found > latest_version() {
        return Err(StoreError::SchemaTooNew {
            database: path.display().to_string(),
            found,
            known: latest_version(),
        });
    }

    for m in MIGRATIONS {
        let fail = |source: rusqlite::Error| StoreError::Migration {
            database: path.display().to_string(),
            version: m.version,
            name: m.name,
            source: Box::new(source),
        };
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(fail)?;
        let applied: bool = tx
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE version = ?1)",
                [m.version],
                |r| r.get(0),
            )
            .map_err(fail)?;
        if applied {
            continue; // tx rolls back on drop: nothing was written
        }
        tx.execute_batch(m.sql).map_err(fail)?;
        tx.execute(
            "INSERT INTO schema_migrations (version, name, applied_unix_ms) VALUES (?1, ?2, ?3)",
            rusqlite::params![m.version, m.name, now_unix_ms()],
        )
        .map_err(fail)?;
        tx.commit().map_err(fail)?;
        tracing::info!(path = %path.display(), version = m.version, name = m.name, "applied migration");
    }
    Ok(())
}

fn now_unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(conn: &Connection) -> Vec<i64> {
        let mut st = conn
            .prepare("SELECT version FROM schema_migrations ORDER BY version")
            .unwrap();
        st.query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }

    #[test]
    fn versions_are_unique_and_increasing() {
        for w in MIGRATIONS.windows(2) {
            assert!(w[0].version < w[1].version);
        }
        assert_eq!(MIGRATIONS[0].version, 1);
    }

    #[test]
    fn migrate_twice_applies_each_once() {
        let mut conn = Connection::open_in_memory().unwrap();
        let p = Path::new(":memory:");
        migrate(&mut conn, p).unwrap();
        migrate(&mut conn, p).unwrap();
        let want: Vec<i64> = MIGRATIONS.iter().map(|m| m.version).collect();
        assert_eq!(applied(&conn), want);
    }

    #[test]
    fn newer_schema_is_refused() {
        let mut conn = Connection::open_in_memory().unwrap();
        let p = Path::new("x.db");
        migrate(&mut conn, p).unwrap();
        conn.execute(
            "INSERT INTO schema_migrations VALUES (?1, 'future', 0)",
            [latest_version() + 1],
        )
        .unwrap();
        let err = migrate(&mut conn, p).unwrap_err();
        assert!(matches!(err, StoreError::SchemaTooNew { .. }), "{err}");
        assert!(err.to_string().contains("x.db"));
    }
}
