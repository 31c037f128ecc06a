// The ClickHouse schema as numbered migrations recorded in `schema_migrations`: versions 1–5 as
// ClickHouse 18.16 took them, version 6 the tables for ClickHouse >= 23.8 (LowCardinality labels,
// codecs, DateTime64 times, bloom-filter indexes on ids, deduplication windows) with the data
// copied over, version 7 dropping the old tables; and the tables' TTLs set from the retention.

use crate::clickhouse::client::{Client, Params, quote, quote_list};
use crate::clickhouse::rowbinary::{Reader, Writer};
use crate::text::DEFAULT_REGION;
use crate::{StoreError, StoreOptions};
use std::time::Duration;

pub(crate) struct Migration {
    pub version: u32,
    pub name: &'static str,
    /// Statements run in order; `{db}` is the database. Each is idempotent (`IF NOT EXISTS`)
    /// so two instances migrating at once, or a migration cut off midway, redo it safely.
    pub statements: &'static [&'static str],
}

/// The day partition of a millisecond timestamp column of the version-1 tables.
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

/// The tables of schema version 6 on (the names of version 1–5 are dropped by version 7).
pub(crate) const RECORDS: &str = "records_v6";
pub(crate) const TEXT: &str = "record_text_v6";
pub(crate) const ROLLUPS: &str = "rollups_v6";
pub(crate) const SPANS: &str = "spans_v6";
pub(crate) const LOGS: &str = "logs_v6";
pub(crate) const EMBEDDINGS: &str = "embeddings_v6";
pub(crate) const ANNOTATIONS: &str = "annotations_v6";
pub(crate) const ALERTS: &str = "alerts_v6";
pub(crate) const SCRAPE_TARGETS: &str = "scrape_targets_v6";
pub(crate) const MARKERS: &str = "markers_v6";
pub(crate) const SCORES: &str = "scores_v6";

/// A table's time column as its TTL and retention see it.
pub(crate) struct Timed {
    pub table: &'static str,
    pub column: &'static str,
    /// `toYYYYMMDD(column)`: the day partition.
    pub partition: &'static str,
}

macro_rules! timed {
    ($table:expr, $col:literal) => {
        Timed {
            table: $table,
            column: $col,
            partition: concat!("toYYYYMMDD(", $col, ")"),
        }
    };
}

pub(crate) const RECORDS_TIME: Timed = timed!(RECORDS, "arrival_unix_ms");
pub(crate) const TEXT_TIME: Timed = timed!(TEXT, "arrival_unix_ms");
pub(crate) const ROLLUPS_TIME: Timed = timed!(ROLLUPS, "minute_start_unix_ms");
pub(crate) const MARKERS_TIME: Timed = timed!(MARKERS, "at_unix_ms");
/// The other tables kept as long as raw records.
pub(crate) const RAW_TIER_TIME: &[Timed] = &[
    timed!(SPANS, "start_unix_nano"),
    timed!(LOGS, "time_unix_nano"),
    timed!(EMBEDDINGS, "at_unix_ms"),
    timed!(ANNOTATIONS, "at_unix_ms"),
    timed!(SCRAPE_TARGETS, "updated_unix_ms"),
    timed!(SCORES, "at_unix_ms"),
];

/// Settings of every version-6 table: a window of recent insert tokens, so a retried batch is
/// stored once (replicated tables keep one by default).
/// `ttl_only_drop_parts`: a TTL drops whole parts (parts never span days: the tables are
/// partitioned by day), not rows by rewriting — as the partition drops of version 5 did. The
/// text table deletes rows by region and keeps it off.
macro_rules! v6_settings {
    () => {
        " SETTINGS non_replicated_deduplication_window = 1000, ttl_only_drop_parts = 1"
    };
    (rows) => {
        " SETTINGS non_replicated_deduplication_window = 1000"
    };
}

/// Copies a version-5 table into its version-6 successor: rows whose `seq` is not there yet,
/// so a copy cut off midway and run again completes without doubling rows.
macro_rules! copy_v5 {
    ($new:literal, $old:literal, $cols:literal, $select:literal) => {
        concat!(
            "INSERT INTO {db}.",
            $new,
            " (",
            $cols,
            ") SELECT ",
            $select,
            " FROM {db}.",
            $old,
            " WHERE seq NOT IN (SELECT seq FROM {db}.",
            $new,
            ")"
        )
    };
}

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
    Migration {
        version: 6,
        name: "tables for ClickHouse >= 23.8: LowCardinality labels, codecs, DateTime64 times, \
               bloom-filter indexes on ids, insert deduplication; data copied from version 5",
        statements: &[
            // Times are DateTime64 (ticks in RowBinary, the same bytes as the Int64 they were);
            // label columns LowCardinality (plain String in RowBinary); ids keep String with a
            // bloom filter where they are not the sorting key's prefix.
            concat!(
                "CREATE TABLE IF NOT EXISTS {db}.records_v6 (
            seq UInt64 CODEC(Delta, ZSTD(1)), request_id String CODEC(ZSTD(1)),
            trace_id String CODEC(ZSTD(1)), model_id LowCardinality(String),
            runtime LowCardinality(String), instance LowCardinality(String),
            tenant LowCardinality(String), ab_group LowCardinality(String),
            model_version LowCardinality(String), prompt_version LowCardinality(String),
            endpoint LowCardinality(String), stream UInt8,
            arrival_unix_ms DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
            upstream_headers_s Nullable(Float64) CODEC(ZSTD(1)),
            first_token_s Nullable(Float64) CODEC(ZSTD(1)), end_s Float64 CODEC(ZSTD(1)),
            queue_s Nullable(Float64) CODEC(ZSTD(1)),
            chunk_offsets_us Array(UInt32) CODEC(T64, ZSTD(1)), gap_count UInt32 CODEC(T64, ZSTD(1)),
            gap_mean_s Float64 CODEC(ZSTD(1)), gap_max_s Float64 CODEC(ZSTD(1)),
            prompt_tokens Nullable(UInt64) CODEC(T64, ZSTD(1)),
            output_tokens Nullable(UInt64) CODEC(T64, ZSTD(1)),
            reasoning_tokens Nullable(UInt64) CODEC(T64, ZSTD(1)), tokens_from_usage UInt8,
            finish_reason LowCardinality(String), status UInt16 CODEC(T64, ZSTD(1)),
            error_class LowCardinality(Nullable(String)), embedding Array(Float32) CODEC(ZSTD(1)),
            prefix_key Nullable(UInt64) CODEC(ZSTD(1)),
            INDEX request_id_bf request_id TYPE bloom_filter(0.001) GRANULARITY 1,
            INDEX trace_id_bf trace_id TYPE bloom_filter(0.001) GRANULARITY 1
        ) ENGINE = MergeTree PARTITION BY toYYYYMMDD(arrival_unix_ms) \
        ORDER BY (model_id, arrival_unix_ms, seq)",
                v6_settings!()
            ),
            concat!(
                "CREATE TABLE IF NOT EXISTS {db}.record_text_v6 (
            seq UInt64 CODEC(Delta, ZSTD(1)), request_id String CODEC(ZSTD(1)),
            arrival_unix_ms DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
            region LowCardinality(String), prompt String CODEC(ZSTD(3)),
            completion String CODEC(ZSTD(3)), masked String CODEC(ZSTD(1)), truncated UInt8
        ) ENGINE = MergeTree PARTITION BY toYYYYMMDD(arrival_unix_ms) \
        ORDER BY (request_id, arrival_unix_ms)",
                v6_settings!(rows)
            ),
            concat!(
                "CREATE TABLE IF NOT EXISTS {db}.rollups_v6 (
            model_id LowCardinality(String), runtime LowCardinality(String),
            instance LowCardinality(String), tenant LowCardinality(String),
            ab_group LowCardinality(String), model_version LowCardinality(String),
            bucket LowCardinality(String), metric LowCardinality(String),
            minute_start_unix_ms DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
            writer LowCardinality(String), count UInt64 CODEC(T64, ZSTD(1)),
            sketch String CODEC(ZSTD(1)), seq UInt64 CODEC(Delta, ZSTD(1))
        ) ENGINE = ReplacingMergeTree(seq) PARTITION BY toYYYYMMDD(minute_start_unix_ms) \
        ORDER BY (metric, model_id, runtime, instance, tenant, ab_group, model_version, bucket, \
        minute_start_unix_ms, writer)",
                v6_settings!()
            ),
            concat!(
                "CREATE TABLE IF NOT EXISTS {db}.spans_v6 (
            trace_id String CODEC(ZSTD(1)), span_id String CODEC(ZSTD(1)),
            parent_span_id String CODEC(ZSTD(1)), name LowCardinality(String), kind Int32,
            start_unix_nano DateTime64(9, 'UTC') CODEC(Delta, ZSTD(1)),
            end_unix_nano DateTime64(9, 'UTC') CODEC(Delta, ZSTD(1)), status_code Int32,
            status_message String CODEC(ZSTD(1)), service_name LowCardinality(String),
            attributes String CODEC(ZSTD(3)), events_count UInt32 CODEC(T64, ZSTD(1)),
            seq UInt64 CODEC(Delta, ZSTD(1)), keep UInt64 CODEC(Delta, ZSTD(1))
        ) ENGINE = ReplacingMergeTree(keep) PARTITION BY toYYYYMMDD(start_unix_nano) \
        ORDER BY (trace_id, span_id)",
                v6_settings!()
            ),
            concat!(
                "CREATE TABLE IF NOT EXISTS {db}.logs_v6 (
            time_unix_nano DateTime64(9, 'UTC') CODEC(Delta, ZSTD(1)), severity_number Int32,
            severity_text LowCardinality(String), body String CODEC(ZSTD(3)),
            trace_id String CODEC(ZSTD(1)), span_id String CODEC(ZSTD(1)),
            service_name LowCardinality(String), attributes String CODEC(ZSTD(3)),
            seq UInt64 CODEC(Delta, ZSTD(1)),
            INDEX trace_id_bf trace_id TYPE bloom_filter(0.001) GRANULARITY 1
        ) ENGINE = MergeTree PARTITION BY toYYYYMMDD(time_unix_nano) \
        ORDER BY (time_unix_nano, seq)",
                v6_settings!()
            ),
            concat!(
                "CREATE TABLE IF NOT EXISTS {db}.embeddings_v6 (
            request_id String CODEC(ZSTD(1)), model_id LowCardinality(String),
            at_unix_ms DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
            embedding Array(Float32) CODEC(ZSTD(1)), seq UInt64 CODEC(Delta, ZSTD(1))
        ) ENGINE = MergeTree PARTITION BY toYYYYMMDD(at_unix_ms) ORDER BY (request_id, seq)",
                v6_settings!()
            ),
            concat!(
                "CREATE TABLE IF NOT EXISTS {db}.annotations_v6 (
            request_id String CODEC(ZSTD(1)), model_id LowCardinality(String),
            instance LowCardinality(String),
            at_unix_ms DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
            detector LowCardinality(String), score Float64 CODEC(ZSTD(1)),
            joint_grade LowCardinality(String), value Float64 CODEC(ZSTD(1)),
            summary String CODEC(ZSTD(1)), evidence String CODEC(ZSTD(3)),
            seq UInt64 CODEC(Delta, ZSTD(1))
        ) ENGINE = MergeTree PARTITION BY toYYYYMMDD(at_unix_ms) \
        ORDER BY (request_id, at_unix_ms, seq)",
                v6_settings!()
            ),
            concat!(
                "CREATE TABLE IF NOT EXISTS {db}.alerts_v6 (
            id String, fingerprint String, state LowCardinality(String),
            active_at_unix_ms DateTime64(3, 'UTC'), updated_unix_ms DateTime64(3, 'UTC'),
            resolved_at_unix_ms Nullable(DateTime64(3, 'UTC')), alert String CODEC(ZSTD(3)),
            deleted UInt8, seq UInt64
        ) ENGINE = ReplacingMergeTree(seq) ORDER BY id",
                v6_settings!(rows)
            ),
            // Updated in place: the newest row per URL replaces the older ones at merge time.
            concat!(
                "CREATE TABLE IF NOT EXISTS {db}.scrape_targets_v6 (
            url String, updated_unix_ms DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
            target String CODEC(ZSTD(3)), seq UInt64
        ) ENGINE = ReplacingMergeTree(seq) PARTITION BY toYYYYMMDD(updated_unix_ms) ORDER BY url",
                v6_settings!()
            ),
            concat!(
                "CREATE TABLE IF NOT EXISTS {db}.markers_v6 (
            id String, kind LowCardinality(String), model LowCardinality(String),
            from_version LowCardinality(String), to_version LowCardinality(String),
            source LowCardinality(String), at_unix_ms DateTime64(3, 'UTC'),
            note String CODEC(ZSTD(1)), seq UInt64
        ) ENGINE = MergeTree PARTITION BY toYYYYMMDD(at_unix_ms) \
        ORDER BY (model, at_unix_ms, id, seq)",
                v6_settings!()
            ),
            concat!(
                "CREATE TABLE IF NOT EXISTS {db}.scores_v6 (
            request_id String CODEC(ZSTD(1)), trace_id String CODEC(ZSTD(1)),
            at_unix_ms DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
            name LowCardinality(String), value Float64 CODEC(ZSTD(1)),
            source LowCardinality(String), seq UInt64 CODEC(Delta, ZSTD(1)),
            INDEX trace_id_bf trace_id TYPE bloom_filter(0.001) GRANULARITY 1
        ) ENGINE = MergeTree PARTITION BY toYYYYMMDD(at_unix_ms) \
        ORDER BY (request_id, trace_id, at_unix_ms, seq)",
                v6_settings!()
            ),
            // The data, times converted explicitly (an Int64 cast to DateTime64 would be taken
            // as seconds).
            copy_v5!(
                "records_v6",
                "records",
                "seq, request_id, trace_id, model_id, runtime, instance, tenant, ab_group, \
                 model_version, prompt_version, endpoint, stream, arrival_unix_ms, \
                 upstream_headers_s, first_token_s, end_s, queue_s, chunk_offsets_us, gap_count, \
                 gap_mean_s, gap_max_s, prompt_tokens, output_tokens, reasoning_tokens, \
                 tokens_from_usage, finish_reason, status, error_class, embedding, prefix_key",
                "seq, request_id, trace_id, model_id, runtime, instance, tenant, ab_group, \
                 model_version, prompt_version, endpoint, stream, \
                 fromUnixTimestamp64Milli(arrival_unix_ms, 'UTC'), upstream_headers_s, \
                 first_token_s, end_s, queue_s, chunk_offsets_us, gap_count, gap_mean_s, \
                 gap_max_s, prompt_tokens, output_tokens, reasoning_tokens, tokens_from_usage, \
                 finish_reason, status, error_class, embedding, prefix_key"
            ),
            copy_v5!(
                "record_text_v6",
                "record_text",
                "seq, request_id, arrival_unix_ms, region, prompt, completion, masked, truncated",
                "seq, request_id, fromUnixTimestamp64Milli(arrival_unix_ms, 'UTC'), region, \
                 prompt, completion, masked, truncated"
            ),
            copy_v5!(
                "rollups_v6",
                "rollups_v2",
                "model_id, runtime, instance, tenant, ab_group, model_version, bucket, metric, \
                 minute_start_unix_ms, writer, count, sketch, seq",
                "model_id, runtime, instance, tenant, ab_group, model_version, bucket, metric, \
                 fromUnixTimestamp64Milli(minute_start_unix_ms, 'UTC'), writer, count, sketch, seq"
            ),
            copy_v5!(
                "spans_v6",
                "spans",
                "trace_id, span_id, parent_span_id, name, kind, start_unix_nano, end_unix_nano, \
                 status_code, status_message, service_name, attributes, events_count, seq, keep",
                "trace_id, span_id, parent_span_id, name, kind, \
                 fromUnixTimestamp64Nano(start_unix_nano, 'UTC'), \
                 fromUnixTimestamp64Nano(end_unix_nano, 'UTC'), status_code, status_message, \
                 service_name, attributes, events_count, seq, keep"
            ),
            copy_v5!(
                "logs_v6",
                "logs",
                "time_unix_nano, severity_number, severity_text, body, trace_id, span_id, \
                 service_name, attributes, seq",
                "fromUnixTimestamp64Nano(time_unix_nano, 'UTC'), severity_number, severity_text, \
                 body, trace_id, span_id, service_name, attributes, seq"
            ),
            copy_v5!(
                "embeddings_v6",
                "embeddings",
                "request_id, model_id, at_unix_ms, embedding, seq",
                "request_id, model_id, fromUnixTimestamp64Milli(at_unix_ms, 'UTC'), embedding, seq"
            ),
            copy_v5!(
                "annotations_v6",
                "annotations",
                "request_id, model_id, instance, at_unix_ms, detector, score, joint_grade, value, \
                 summary, evidence, seq",
                "request_id, model_id, instance, fromUnixTimestamp64Milli(at_unix_ms, 'UTC'), \
                 detector, score, joint_grade, value, summary, evidence, seq"
            ),
            copy_v5!(
                "alerts_v6",
                "alerts",
                "id, fingerprint, state, active_at_unix_ms, updated_unix_ms, resolved_at_unix_ms, \
                 alert, deleted, seq",
                "id, fingerprint, state, fromUnixTimestamp64Milli(active_at_unix_ms, 'UTC'), \
                 fromUnixTimestamp64Milli(updated_unix_ms, 'UTC'), \
                 if(isNull(resolved_at_unix_ms), NULL, \
                 fromUnixTimestamp64Milli(assumeNotNull(resolved_at_unix_ms), 'UTC')), \
                 alert, deleted, seq"
            ),
            copy_v5!(
                "scrape_targets_v6",
                "scrape_targets",
                "url, updated_unix_ms, target, seq",
                "url, fromUnixTimestamp64Milli(updated_unix_ms, 'UTC'), target, seq"
            ),
            copy_v5!(
                "markers_v6",
                "markers",
                "id, kind, model, from_version, to_version, source, at_unix_ms, note, seq",
                "id, kind, model, from_version, to_version, source, \
                 fromUnixTimestamp64Milli(at_unix_ms, 'UTC'), note, seq"
            ),
            copy_v5!(
                "scores_v6",
                "scores",
                "request_id, trace_id, at_unix_ms, name, value, source, seq",
                "request_id, trace_id, fromUnixTimestamp64Milli(at_unix_ms, 'UTC'), name, value, \
                 source, seq"
            ),
        ],
    },
    Migration {
        version: 7,
        name: "drop the version-5 tables (their data is in the version-6 tables)",
        // Only after version 6 is recorded, i.e. every copy finished. A table over the server's
        // `max_table_size_to_drop` (50 GB) is refused: the error names it; see the README.
        statements: &[
            "DROP TABLE IF EXISTS {db}.records",
            "DROP TABLE IF EXISTS {db}.record_text",
            "DROP TABLE IF EXISTS {db}.rollups",
            "DROP TABLE IF EXISTS {db}.rollups_v2",
            "DROP TABLE IF EXISTS {db}.spans",
            "DROP TABLE IF EXISTS {db}.logs",
            "DROP TABLE IF EXISTS {db}.embeddings",
            "DROP TABLE IF EXISTS {db}.annotations",
            "DROP TABLE IF EXISTS {db}.alerts",
            "DROP TABLE IF EXISTS {db}.scrape_targets",
            "DROP TABLE IF EXISTS {db}.markers",
            "DROP TABLE IF EXISTS {db}.scores",
        ],
    },
    Migration {
        version: 8,
        name: "cached input tokens and request cost",
        statements: RECORDS_COST_COLUMNS,
    },
];

/// Migration 8's columns of the records table (the store-insert benchmark adds them to its
/// version-5 table too, so both take the same RowBinary rows).
pub(crate) const RECORDS_COST_COLUMNS: &[&str] = &[
    "ALTER TABLE {db}.records_v6 ADD COLUMN IF NOT EXISTS cached_input_tokens \
     Nullable(UInt64) CODEC(T64, ZSTD(1))",
    "ALTER TABLE {db}.records_v6 ADD COLUMN IF NOT EXISTS cost_usd Nullable(Float64) \
     CODEC(ZSTD(1))",
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
    client.ddl(
        "creating the database",
        &format!("CREATE DATABASE IF NOT EXISTS {db}"),
        false,
    )?;
    client.ddl(
        "creating schema_migrations",
        &schema_migrations_table(db),
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
        for st in m
            .statements
            .iter()
            .filter(|st| runs_in(client.layout(), m.version, st))
        {
            client
                .ddl("migration", &st.replace("{db}", db), true)
                .map_err(fail)?;
        }
        let mut w = Writer::default();
        w.u32(m.version);
        w.str(m.name);
        w.i64(super::now_unix_ms());
        client
            .insert_once(
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

/// The table recording applied migrations.
pub(crate) fn schema_migrations_table(db: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {db}.schema_migrations \
         (version UInt32, name String, applied_unix_ms Int64) ENGINE = MergeTree ORDER BY version"
    )
}

/// The first version a cluster's database runs: the tables before it never existed on a
/// cluster (tokenwatch created replicated tables from version 6 on), so version 6's copies from
/// them and version 7's drops of them are recorded without running.
const FIRST_CLUSTER_VERSION: u32 = 6;
const DROPS_OLD_TABLES: u32 = 7;

/// Whether statement `st` of migration `version` runs in `layout`.
pub(crate) fn runs_in(layout: &super::cluster::Layout, version: u32, st: &str) -> bool {
    layout.cluster().is_none()
        || (version >= FIRST_CLUSTER_VERSION
            && version != DROPS_OLD_TABLES
            && !(version == FIRST_CLUSTER_VERSION && st.starts_with("INSERT INTO")))
}

/// The `TTL` each version-6 table should carry for these retentions, as the server prints it
/// back in `system.tables` (so an unchanged TTL is recognised and left alone); `None` for
/// alerts, whose retention is a tombstone written by `apply_retention`.
pub(crate) fn ttl_clauses(opts: &StoreOptions) -> Vec<(&'static str, String)> {
    let secs = |d: Duration| d.as_secs().max(1);
    let expire =
        |t: &Timed, keep: Duration| format!("{} + toIntervalSecond({})", t.column, secs(keep));
    let mut out = vec![
        (RECORDS, expire(&RECORDS_TIME, opts.raw_retention)),
        (ROLLUPS, expire(&ROLLUPS_TIME, opts.rollup_retention)),
        (MARKERS, expire(&MARKERS_TIME, opts.rollup_retention)),
    ];
    for t in RAW_TIER_TIME {
        out.push((t.table, expire(t, opts.raw_retention)));
    }
    // Captured text: the raw retention, and each region's own when shorter (spec §10); regions
    // not listed take `default`'s.
    let raw = opts.raw_retention;
    let regions = &opts.text_retention;
    let listed: Vec<&str> = regions
        .keys()
        .map(String::as_str)
        .filter(|r| *r != DEFAULT_REGION)
        .collect();
    let mut rules = vec![expire(&TEXT_TIME, raw)];
    for region in &listed {
        let keep = regions[*region];
        if keep < raw {
            rules.push(format!(
                "{} WHERE region = {}",
                expire(&TEXT_TIME, keep),
                quote(region)
            ));
        }
    }
    if let Some(keep) = regions.get(DEFAULT_REGION).filter(|k| **k < raw) {
        let rule = if listed.is_empty() {
            expire(&TEXT_TIME, *keep)
        } else {
            format!(
                "{} WHERE region NOT IN ({})",
                expire(&TEXT_TIME, *keep),
                quote_list(listed.iter().copied())
            )
        };
        rules.push(rule);
    }
    out.push((TEXT, rules.join(", ")));
    out
}

/// The TTL text of a `CREATE TABLE` statement as `system.tables` shows it ("" when none).
fn current_ttl(create: &str) -> &str {
    let Some(start) = create.find(" TTL ") else {
        return "";
    };
    let rest = &create[start + 5..];
    rest.find(" SETTINGS ").map_or(rest, |end| &rest[..end])
}

/// Gives every version-6 table the TTL of `ttl_clauses` (`ttl` true) or none (`ttl` false,
/// retention by `apply_retention`'s partition drops); a table already so is left alone, so
/// opening the store does not rewrite TTLs. A changed TTL applies to the stored parts too
/// (`materialize_ttl_after_modify`, a background mutation).
pub(crate) fn apply_ttl(client: &Client, opts: &StoreOptions, ttl: bool) -> Result<(), StoreError> {
    let db = client.database();
    let mut params = Params::default();
    let layout = client.layout();
    let sql = format!(
        "SELECT name, create_table_query FROM {} WHERE database = {} \
         FORMAT RowBinary",
        layout.system("tables"),
        params.str(db)
    );
    let body = client.query_with("reading the tables' TTL", &sql, &params, false)?;
    let mut r = Reader::new(&body);
    let mut current = std::collections::HashMap::new();
    while !r.is_empty() {
        let row = r
            .string()
            .and_then(|name| Ok((name, r.string()?)))
            .map_err(|detail| StoreError::CorruptRow {
                database: client.label().to_string(),
                table: "system.tables",
                row: format!("after {} tables", current.len()),
                detail,
            })?;
        current.insert(row.0, row.1);
    }
    for (table, want) in ttl_clauses(opts) {
        let have = current
            .get(&layout.local(table))
            .map_or("", |c| current_ttl(c));
        let sql = if ttl && have != want {
            format!("ALTER TABLE {db}.{table} MODIFY TTL {want}")
        } else if !ttl && !have.is_empty() {
            format!("ALTER TABLE {db}.{table} REMOVE TTL")
        } else {
            continue;
        };
        client.ddl("setting the tables' TTL", &sql, true)?;
        tracing::info!(database = %client.label(), table, ttl = %want, enabled = ttl, "changed table TTL");
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
        // Every version-6 table the code names is created by version 6 and dropped by none.
        let v6 = &MIGRATIONS[5];
        assert_eq!(v6.version, 6);
        for t in [
            RECORDS,
            TEXT,
            ROLLUPS,
            SPANS,
            LOGS,
            EMBEDDINGS,
            ANNOTATIONS,
            ALERTS,
            SCRAPE_TARGETS,
            MARKERS,
            SCORES,
        ] {
            let create = format!("CREATE TABLE IF NOT EXISTS {{db}}.{t} (");
            assert!(v6.statements.iter().any(|s| s.starts_with(&create)), "{t}");
            let drop = format!("DROP TABLE IF EXISTS {{db}}.{t}");
            assert!(
                MIGRATIONS
                    .iter()
                    .flat_map(|m| m.statements)
                    .all(|s| *s != drop),
                "{t}"
            );
        }
        for m in MIGRATIONS {
            for st in m.statements {
                // Copies are idempotent through their target's replace semantics (version 4)
                // or by copying only the rows not there yet (version 6).
                let copy = st.starts_with("INSERT INTO {db}.rollups_v2 ")
                    || (st.starts_with("INSERT INTO {db}.") && st.contains(" WHERE seq NOT IN "));
                let drop = st.starts_with("DROP TABLE IF EXISTS {db}.");
                let add_column = st.starts_with("ALTER TABLE {db}.")
                    && st.contains(" ADD COLUMN IF NOT EXISTS ");
                assert!(
                    copy || drop || add_column || st.contains("IF NOT EXISTS {db}."),
                    "not idempotent: {st}"
                );
            }
        }
    }
}
