// Store insert benchmark (issues 11, 32): request records per second into ClickHouse (the test
// harness's server: ClickHouse 26.9 through the chDB stand-in, RowBinary over HTTP) against the
// embedded SQLite store, by batch size; then the records table of ClickHouse schema version 5
// against the current one on the same rows: insert rate, bytes on disk per record, rows read by
// a lookup by request id (EXPLAIN ESTIMATE).
//
// Run: `cargo bench -p tokenwatch --bench store_insert`. Needs the README's test command's
// .venv-chdb (chdb). Knobs (environment variables, defaults in brackets):
//   TW_BENCH_BATCHES [1,10,100,1000,5000]  records per `insert_records` call
//   TW_BENCH_SECS [2]                       measured seconds per backend, batch size and round
//   TW_BENCH_ROUNDS [3]                     rounds, the backends interleaved; the median is shown
//   TW_BENCH_SCHEMA_RECORDS [200000]        records of the schema comparison (batches of 5000)
//   TW_BENCH_OUT [<workspace>/target/bench-store-insert.md]
//
// Each record looks like a streamed chat completion: 64 chunk offsets, usage tokens, labels
// spread over 8 models × 8 instances × 16 tenants. SQLite runs with its defaults (WAL,
// synchronous=NORMAL): a batch is durable against a process crash when the call returns.
// ClickHouse: one INSERT per batch; a batch is in the server when the call returns.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;
use tokenwatch_core::model::{GapSummary, RequestRecord, SeriesLabels};
use tokenwatch_store::testing::ClickHouseServer;
use tokenwatch_store::{ClickHouseStore, SqliteStore, Store, StoreOptions};

#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a valid value")),
        Err(_) => default,
    }
}

fn record(i: u64) -> RequestRecord {
    let offsets: Vec<u32> = (0..64)
        .map(|k| 150_000 + k * 12_000 + (i % 97) as u32)
        .collect();
    RequestRecord {
        request_id: format!("req-{i:012}"),
        trace_id: format!("{:032x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        labels: SeriesLabels {
            model_id: format!("model-{}", i % 8),
            runtime: "vllm".into(),
            instance: format!("gpu-{}:8000", (i / 8) % 8),
            tenant: format!("tenant-{:08x}", (i / 64) % 16),
            ab_group: String::new(),
            model_version: String::new(),
        },
        prompt_version: String::new(),
        endpoint: "/v1/chat/completions".into(),
        stream: true,
        arrival_unix_ms: 1_800_000_000_000 + i as i64,
        upstream_headers_s: Some(0.01),
        first_token_s: Some(0.15),
        end_s: 0.15 + 63.0 * 0.012,
        queue_s: Some(0.002),
        chunk_offsets_us: offsets,
        gaps: GapSummary {
            count: 63,
            mean_s: 0.012,
            max_s: 0.02,
        },
        prompt_tokens: Some(900 + i % 300),
        output_tokens: Some(64),
        reasoning_tokens: None,
        tokens_from_usage: true,
        finish_reason: "stop".into(),
        status: 200,
        ..Default::default()
    }
}

/// Records per second into `store` in batches of `batch` for about `secs` seconds.
fn measure(store: &dyn Store, batch: usize, secs: f64, next: &mut u64) -> f64 {
    let mut n = 0u64;
    let started = Instant::now();
    while started.elapsed().as_secs_f64() < secs {
        let rows: Vec<RequestRecord> = (0..batch as u64).map(|k| record(*next + k)).collect();
        *next += batch as u64;
        store.insert_records(&rows).expect("insert_records");
        n += batch as u64;
    }
    n as f64 / started.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let batches: Vec<usize> = env_or("TW_BENCH_BATCHES", "1,10,100,1000,5000".to_string())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("TW_BENCH_BATCHES: comma-separated sizes")
        })
        .collect();
    let secs: f64 = env_or("TW_BENCH_SECS", 2.0);
    let rounds: usize = env_or("TW_BENCH_ROUNDS", 3).max(1);
    let out = env_or(
        "TW_BENCH_OUT",
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../target/bench-store-insert.md"
        )
        .to_string(),
    );

    let server = ClickHouseServer::start();
    let version = server.query("SELECT version()");
    let dir = tempfile::tempdir().expect("temporary directory");
    let sqlite: Arc<dyn Store> =
        Arc::new(SqliteStore::open(dir.path(), StoreOptions::default()).expect("SQLite store"));
    let clickhouse: Arc<dyn Store> = Arc::new(
        ClickHouseStore::open(&server.config("bench"), StoreOptions::default())
            .expect("ClickHouse store"),
    );

    let mut report = String::new();
    let _ = writeln!(report, "# Store insert throughput (records/s)\n");
    let _ = writeln!(
        report,
        "ClickHouse {} (local, loopback HTTP, RowBinary) vs SQLite (WAL, synchronous=NORMAL); \
         {secs} s per case, median of {rounds} rounds, interleaved.\n",
        version.trim()
    );
    let _ = writeln!(
        report,
        "| batch | SQLite rec/s | ClickHouse rec/s | ClickHouse / SQLite |"
    );
    let _ = writeln!(report, "|---:|---:|---:|---:|");
    println!("{report}");
    let mut next = 0u64;
    for &batch in &batches {
        let (mut s, mut c) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            s.push(measure(sqlite.as_ref(), batch, secs, &mut next));
            c.push(measure(clickhouse.as_ref(), batch, secs, &mut next));
        }
        let (s, c) = (median(s), median(c));
        let line = format!("| {batch} | {s:.0} | {c:.0} | {:.2} |", c / s);
        println!("{line}");
        let _ = writeln!(report, "{line}");
    }
    let n: u64 = env_or("TW_BENCH_SCHEMA_RECORDS", 200_000);
    let rows: Vec<RequestRecord> = (0..n).map(record).collect();
    let lookup = rows[rows.len() / 2].request_id.clone();
    let figures = tokenwatch_store::testing::compare_record_schemas(
        &server,
        "bench_schemas",
        &rows,
        5000,
        &lookup,
    )
    .expect("schema comparison");
    let _ = writeln!(
        report,
        "
## Records table: schema version 5 vs 6 ({n} records, batches of 5000, same rows)
"
    );
    let _ = writeln!(
        report,
        "| table | rec/s | RowBinary encoding share | bytes on disk / record | rows to read for a lookup by request_id (EXPLAIN ESTIMATE) |"
    );
    let _ = writeln!(report, "|---|---:|---:|---:|---:|");
    for f in &figures {
        let _ = writeln!(
            report,
            "| {} | {:.0} | {:.1} % | {:.1} | {} of {} |",
            f.table,
            f.records_per_s,
            f.encode_share * 100.0,
            f.bytes_per_record,
            f.lookup_read_rows,
            f.records
        );
    }
    println!("{}", &report[report.find("\n## Records").unwrap_or(0)..]);
    let stats = clickhouse.stats().expect("ClickHouse stats");
    let _ = writeln!(
        report,
        "\nClickHouse held {} records in {:.1} MiB on disk; SQLite {} records in {:.1} MiB.",
        stats.records,
        stats.file_bytes as f64 / 1048576.0,
        sqlite.stats().map(|s| s.records).unwrap_or(0),
        sqlite.stats().map(|s| s.file_bytes).unwrap_or(0) as f64 / 1048576.0,
    );
    std::fs::write(&out, &report).unwrap_or_else(|e| panic!("writing {out}: {e}"));
    println!("\nwritten to {out}");
    drop(server);
}
