// The ClickHouse schema as numbered migrations recorded in `schema_migrations`, kept to what
// ClickHouse 18.16 (Debian's) accepts; every table but alerts is partitioned by UTC day.

use crate::StoreError;
use crate::clickhouse::client::Client;
use crate::clickhouse::rowbinary::{Reader, Writer};

pub(crate) struct Migration {
    pub version: u32,
    pub name: &'static str,
    /// Statements run in order; `{db}` is the database. Each is idempotent (`IF NOT EXISTS`)
    /// so two instances migrating at once, or a migration cut off midway, redo it safely.
    pub statements: &'static [&'static str],
}

/// The day partition of a millisecond timestamp column. Newer servers (19.6+) allow a table
/// `TTL` instead of dropping partitions; DateTime64 (20.1+) would replace the Int64 times, and
/// LowCardinality(String) (19.x, without the experimental setting) the label columns.
macro_rules! day_of_ms {
    ($col:literal) => {
        concat!("toYYYYMMDD(toDateTime(intDiv(", $col, ", 1000), 'UTC'))")
    };
}
macro_rules! day_of_ns {
    ($col:literal) => {
        concat!(
            "toYYYYMMDD(toDateTime(intDiv(",
            $col,
            ", 1000000000), 'UTC'))"
        )
    };
}

pub(crate) const RECORDS_PARTITION: &str = day_of_ms!("arrival_unix_ms");
pub(crate) const TEXT_PARTITION: &str = day_of_ms!("arrival_unix_ms");
pub(crate) const ROLLUPS_PARTITION: &str = day_of_ms!("minute_start_unix_ms");
/// Version 1's roll-ups (without a writer), kept until retention drops them.
pub(crate) const LEGACY_ROLLUPS_PARTITION: &str = day_of_ms!("minute_start_unix_ms");
pub(crate) const SPANS_PARTITION: &str = day_of_ns!("start_unix_nano");
pub(crate) const LOGS_PARTITION: &str = day_of_ns!("time_unix_nano");
pub(crate) const EMBEDDINGS_PARTITION: &str = day_of_ms!("at_unix_ms");
pub(crate) const ANNOTATIONS_PARTITION: &str = day_of_ms!("at_unix_ms");
pub(crate) const SCRAPE_TARGETS_PARTITION: &str = day_of_ms!("updated_unix_ms");
pub(crate) const MARKERS_PARTITION: &str = day_of_ms!("at_unix_ms");
pub(crate) const SCORES_PARTITION: &str = day_of_ms!("at_unix_ms");

/// Append-only: never edit an applied migration, add a new one.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "records, text, roll-ups, spans, logs, embeddings, annotations, alerts",
        statements: &[
            // `seq` orders rows by insertion (a per-process clock, see `Seq`), as SQLite's rowid does.
            concat!(
                "CREATE TABLE IF NOT EXISTS {db}.records (
            seq UInt64, request_id String, trace_id String, model_id String, runtime String,
            instance String, tenant String, ab_group String, model_version String,
            prompt_version String, endpoint String, stream UInt8, arrival_unix_ms Int64,
            upstream_headers_s Nullable(Float64), first_token_s Nullable(Float64), end_s Float64,
            queue_s Nullable(Float64), chunk_offsets_us Array(UInt32), gap_count UInt32,
            gap_mean_s Float64, gap_max_s Float64, prompt_tokens Nullable(UInt64),
            output_tokens Nullable(UInt64), reasoning_tokens Nullable(UInt64),
            tokens_from_usage UInt8, finish_reason String, status UInt16,
            error_class Nullable(String), embedding Array(Float32), prefix_key Nullable(UInt64)
        ) ENGINE = MergeTree PARTITION BY ",
                day_of_ms!("arrival_unix_ms"),
                " ORDER BY (model_id, arrival_unix_ms, seq)"
            ),
            concat!(
                "CREATE TABLE IF NOT EXISTS {db}.record_text (
            seq UInt64, request_id String, arrival_unix_ms Int64, region String, prompt String,
            completion String, masked String, truncated UInt8
        ) ENGINE = MergeTree PARTITION BY ",
                day_of_ms!("arrival_unix_ms"),
                " ORDER BY (request_id, arrival_unix_ms)"
            ),
            // Replace semantics: the row with the highest `seq` wins, at merge time (the engine)
            // and at query time (`LIMIT 1 BY` the key, newest first), since merges are lazy.
            concat!(
                "CREATE TABLE IF NOT EXISTS {db}.rollups (
            model_id String, runtime String, instance String, tenant String, ab_group String,
            model_version String, bucket String, metric String, minute_start_unix_ms Int64,
            count UInt64, sketch String, seq UInt64
        ) ENGINE = ReplacingMergeTree(seq) PARTITION BY ",
                day_of_ms!("minute_start_unix_ms"),
                " ORDER BY (metric, model_id, runtime, instance, tenant, ab_group, model_version, \
             bucket, minute_start_unix_ms)"
            ),
            // A re-sent span is ignored: the first copy wins (`keep` = u64::MAX - seq is highest
            // for the first insert), and queries take the lowest `seq` per (trace, span).
            concat!(
                "CREATE TABLE IF NOT EXISTS {db}.spans (
            trace_id String, span_id String, parent_span_id String, name String, kind Int32,
            start_unix_nano Int64, end_unix_nano Int64, status_code Int32, status_message String,
            service_name String, attributes String, events_count UInt32, seq UInt64, keep UInt64
        ) ENGINE = ReplacingMergeTree(keep) PARTITION BY ",
                day_of_ns!("start_unix_nano"),
                " ORDER BY (trace_id, span_id)"
            ),
            concat!(
                "CREATE TABLE IF NOT EXISTS {db}.logs (
            time_unix_nano Int64, severity_number Int32, severity_text String, body String,
            trace_id String, span_id String, service_name String, attributes String, seq UInt64
        ) ENGINE = MergeTree PARTITION BY ",
                day_of_ns!("time_unix_nano"),
                " ORDER BY (time_unix_nano, seq)"
            ),
            concat!(
                "CREATE TABLE IF NOT EXISTS {db}.embeddings (
            request_id String, model_id String, at_unix_ms Int64, embedding Array(Float32),
            seq UInt64
        ) ENGINE = MergeTree PARTITION BY ",
                day_of_ms!("at_unix_ms"),
                " ORDER BY (request_id, seq)"
            ),
            concat!(
                "CREATE TABLE IF NOT EXISTS {db}.annotations (
            request_id String, model_id String, instance String, at_unix_ms Int64,
            detector String, score Float64, joint_grade String, value Float64, summary String,
            evidence String, seq UInt64
        ) ENGINE = MergeTree PARTITION BY ",
                day_of_ms!("at_unix_ms"),
                " ORDER BY (request_id, at_unix_ms, seq)"
            ),
            // One row per change of an alert; the newest (`seq`) is the alert. A delete (and
            // retention) writes a tombstone row (`deleted` = 1), which merges keep as the last word.
            "CREATE TABLE IF NOT EXISTS {db}.alerts (
            id String, fingerprint String, state String, active_at_unix_ms Int64,
            updated_unix_ms Int64, resolved_at_unix_ms Nullable(Int64), alert String,
            deleted UInt8, seq UInt64
        ) ENGINE = ReplacingMergeTree(seq) ORDER BY id",
        ],
    },
    Migration {
        version: 2,
        name: "scrape targets (sharded collectors' shared view)",
        statements: &[concat!(
            "CREATE TABLE IF NOT EXISTS {db}.scrape_targets (
            url String, updated_unix_ms Int64, target String, seq UInt64
        ) ENGINE = MergeTree PARTITION BY ",
            day_of_ms!("updated_unix_ms"),
            " ORDER BY (url, updated_unix_ms, seq)"
        )],
    },
    Migration {
        version: 3,
        name: "version and deploy markers",
        statements: &[concat!(
            "CREATE TABLE IF NOT EXISTS {db}.markers (
            id String, kind String, model String, from_version String, to_version String,
            source String, at_unix_ms Int64, note String, seq UInt64
        ) ENGINE = MergeTree PARTITION BY ",
            day_of_ms!("at_unix_ms"),
            " ORDER BY (model, at_unix_ms, id, seq)"
        )],
    },
    Migration {
        version: 4,
        name: "roll-ups keyed by writer (several instances fronting one upstream instance)",
        statements: &[
            // Version 1's `rollups` had no writer in its key, so two tokenwatch instances writing
            // the same series' minute replaced each other's row. Each writer's row now stands on
            // its own and queries merge the writers' sketches. Old rows are copied with writer ''
            // (re-running the copy is harmless: the copies replace each other, `LIMIT 1 BY` at
            // query time). `rollups` is left in place, read by nothing, dropped by retention.
            concat!(
                "CREATE TABLE IF NOT EXISTS {db}.rollups_v2 (
            model_id String, runtime String, instance String, tenant String, ab_group String,
            model_version String, bucket String, metric String, minute_start_unix_ms Int64,
            writer String, count UInt64, sketch String, seq UInt64
        ) ENGINE = ReplacingMergeTree(seq) PARTITION BY ",
                day_of_ms!("minute_start_unix_ms"),
                " ORDER BY (metric, model_id, runtime, instance, tenant, ab_group, model_version, \
             bucket, minute_start_unix_ms, writer)"
            ),
            "INSERT INTO {db}.rollups_v2 (model_id, runtime, instance, tenant, ab_group, \
         model_version, bucket, metric, minute_start_unix_ms, writer, count, sketch, seq) \
         SELECT model_id, runtime, instance, tenant, ab_group, model_version, bucket, metric, \
         minute_start_unix_ms, '', count, sketch, seq FROM {db}.rollups",
        ],
    },
    Migration {
        version: 5,
        name: "feedback and evaluation scores",
        statements: &[concat!(
            "CREATE TABLE IF NOT EXISTS {db}.scores (
            request_id String, trace_id String, at_unix_ms Int64, name String, value Float64,
            source String, seq UInt64
        ) ENGINE = MergeTree PARTITION BY ",
            day_of_ms!("at_unix_ms"),
            " ORDER BY (request_id, trace_id, at_unix_ms, seq)"
        )],
    },
];

/// The highest schema version this build knows.
pub(crate) fn latest_version() -> u32 {
    MIGRATIONS.iter().map(|m| m.version).max().unwrap_or(0)
}

/// Creates the database and `schema_migrations` if needed, then applies each migration not
/// yet recorded. A database migrated by a newer build is refused.
pub(crate) fn migrate(client: &Client) -> Result<(), StoreError> {
    migrate_up_to(client, latest_version())
}

/// As `migrate`, applying only the migrations up to `version` (tests build older schemas).
pub(crate) fn migrate_up_to(client: &Client, version: u32) -> Result<(), StoreError> {
    let db = client.database();
    client.query(
        "creating the database",
        &format!("CREATE DATABASE IF NOT EXISTS {db}"),
        false,
    )?;
    client.query(
        "creating schema_migrations",
        &format!(
            "CREATE TABLE IF NOT EXISTS {db}.schema_migrations \
             (version UInt32, name String, applied_unix_ms Int64) ENGINE = MergeTree ORDER BY version"
        ),
        true,
    )?;
    let applied = applied_versions(client)?;
    let found = applied.iter().copied().max().unwrap_or(0);
    if found > latest_version() {
        return Err(StoreError::SchemaTooNew {
            database: client.label().to_string(),
            found: i64::from(found),
            known: i64::from(latest_version()),
        });
    }
    for m in MIGRATIONS
        .iter()
        .filter(|m| m.version <= version && !applied.contains(&m.version))
    {
        let fail = |e: StoreError| StoreError::Migration {
            database: client.label().to_string(),
            version: i64::from(m.version),
            name: m.name,
            source: Box::new(e),
        };
        for st in m.statements {
            client
                .query("migration", &st.replace("{db}", db), true)
                .map_err(fail)?;
        }
        let mut w = Writer::default();
        w.u32(m.version);
        w.str(m.name);
        w.i64(super::now_unix_ms());
        client
            .insert(
                "recording a migration",
                "schema_migrations",
                "version, name, applied_unix_ms",
                &w.buf,
            )
            .map_err(fail)?;
        tracing::info!(database = %client.label(), version = m.version, name = m.name, "applied migration");
    }
    Ok(())
}

pub(crate) fn applied_versions(client: &Client) -> Result<Vec<u32>, StoreError> {
    let db = client.database();
    let body = client.query(
        "reading the schema version",
        &format!("SELECT DISTINCT version FROM {db}.schema_migrations FORMAT RowBinary"),
        true,
    )?;
    let mut r = Reader::new(&body);
    let mut out = Vec::new();
    while !r.is_empty() {
        out.push(r.u32().map_err(|e| StoreError::CorruptRow {
            database: client.label().to_string(),
            table: "schema_migrations",
            row: format!("after {} versions", out.len()),
            detail: e,
        })?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_unique_and_increasing() {
        for w in MIGRATIONS.windows(2) {
            assert!(w[0].version < w[1].version);
        }
        assert_eq!(MIGRATIONS[0].version, 1);
        for m in MIGRATIONS {
            for st in m.statements {
                // Copies are idempotent through their target's replace semantics.
                let copy = st.starts_with("INSERT INTO {db}.rollups_v2 ");
                assert!(
                    copy || st.contains("IF NOT EXISTS {db}."),
                    "not idempotent: {st}"
                );
            }
        }
    }
}
