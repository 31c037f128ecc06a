// Pipeline CPU benchmark: the same proxied-request records through the production sinks (store,
// proxy spans, /metrics, alert engine with the default rules and SLOs) and, as baseline, the store alone.

//! CPU time of the whole process (every thread: the feeding thread, the store writer, the alert
//! engine's runtime) per record, read from `/proc/self/task/*/stat` once everything queued has
//! been written and evaluated, so that numbers stay comparable on a machine busy with other
//! work (wall time would not). Reports µs per record for both runs, their ratio, the split by
//! thread.
//!
//! Run: `cargo bench -p tokenwatch --bench pipeline` (release), or quickly in a debug build with
//! `cargo test -p tokenwatch --bench pipeline`. Knobs: TW_BENCH_RECORDS [20000] records per run,
//! TW_BENCH_BATCH [64] records per batch (the pipeline's `telemetry.batch_max`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokenwatch::export::prometheus::{Metrics, MetricsSink};
use tokenwatch::pipeline::{
    ProxySpanBuilder, ProxySpanSink, RecordSink, StoreSink, StoreWriter, StoreWriterConfig,
};
use tokenwatch_core::model::{ProxySpan, RequestRecord, SeriesLabels};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// Clock ticks of CPU (user + system) per thread name, from /proc.
fn thread_ticks() -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for t in dir.flatten() {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ... ; fields after the closing parenthesis, utime and stime are
        // the 12th and 13th of those.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = stat[open + 1..close].to_string();
        let f: Vec<&str> = stat[close + 2..].split(' ').collect();
        let ticks = f.get(11).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0)
            + f.get(12).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
        *out.entry(comm).or_insert(0) += ticks;
    }
    out
}

fn total(t: &BTreeMap<String, u64>) -> u64 {
    t.values().sum()
}

fn ticks_per_s() -> f64 {
    // USER_HZ: 100 on Linux in practice; getconf says when present.
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

fn records(n: usize, batch: usize) -> Vec<Arc<Vec<RequestRecord>>> {
    let now = chrono::Utc::now().timestamp_millis();
    let all: Vec<RequestRecord> = (0..n)
        .map(|i| RequestRecord {
            request_id: format!("req-{i:08}"),
            trace_id: format!("{:032x}", 0x4bf9_2f35_77b3_4da6_u128 << 64 | i as u128),
            labels: SeriesLabels {
                model_id: ["llama-3.1-8b", "qwen-2.5-7b"][i % 2].into(),
                runtime: "vllm".into(),
                instance: "127.0.0.1:8000".into(),
                tenant: ["acme", "globex", "initech"][i % 3].into(),
                ..Default::default()
            },
            endpoint: "/v1/chat/completions".into(),
            stream: true,
            arrival_unix_ms: now - (n - i) as i64,
            first_token_s: Some(0.05 + (i % 17) as f64 * 0.002),
            end_s: 0.8 + (i % 13) as f64 * 0.01,
            prompt_tokens: Some(200 + (i % 50) as u64),
            output_tokens: Some(120 + (i % 40) as u64),
            finish_reason: "stop".into(),
            status: 200,
            span: ProxySpan {
                span_id: format!("{:016x}", 0x00f0_67aa_0000_0000_u64 | i as u64),
                parent_span_id: String::new(),
                response_model: "llama-3.1-8b".into(),
            },
            ..Default::default()
        })
        .collect();
    all.chunks(batch).map(|c| Arc::new(c.to_vec())).collect()
}

/// Waits until no thread of this process used CPU for a while (everything queued is done).
fn settle(before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    let mut last = thread_ticks();
    let mut quiet = 0;
    while quiet < 3 {
        std::thread::sleep(Duration::from_millis(400));
        let now = thread_ticks();
        // The engine evaluates now and then even when idle: a tick or two is quiet.
        if total(&now).saturating_sub(total(&last)) <= 2 {
            quiet += 1;
        } else {
            quiet = 0;
        }
        last = now;
    }
    let mut delta = BTreeMap::new();
    for (k, v) in &last {
        let d = v.saturating_sub(before.get(k).copied().unwrap_or(0));
        if d > 0 {
            delta.insert(k.clone(), d);
        }
    }
    delta
}

struct Run {
    ticks: BTreeMap<String, u64>,
}

/// Each batch is handed over as the pipeline does (`consume_shared`, then dropped).
fn run(full: bool, batches: Vec<Arc<Vec<RequestRecord>>>, batch_max: usize) -> Run {
    let dir = tempfile::tempdir().expect("temp dir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("bench-engine")
        .enable_all()
        .build()
        .expect("runtime");
    let _enter = rt.enter();
    let store: Arc<dyn tokenwatch_store::Store> = Arc::new(
        tokenwatch_store::SqliteStore::open(dir.path(), Default::default()).expect("store"),
    );
    let metrics = Arc::new(Metrics::new());
    let cfg = StoreWriterConfig {
        queue_rows: 1_000_000,
        batch_max,
        priority: Default::default(),
        flush_interval: Duration::ZERO,
    };
    let (writer, thread) = StoreWriter::start(store.clone(), cfg, metrics.clone()).expect("writer");
    let mut sinks: Vec<Box<dyn RecordSink>> = vec![Box::new(StoreSink::new(writer.clone()))];
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);
    let mut alerting = None;
    if full {
        let config = tokenwatch::config::Config {
            data_dir: dir.path().to_path_buf(),
            ..Default::default()
        };
        let upstreams: Vec<tokenwatch::config::UpstreamConfig> =
            serde_json::from_str(r#"[{"url": "http://127.0.0.1:8000", "runtime": "vllm"}]"#)
                .expect("upstreams");
        sinks.push(Box::new(ProxySpanSink::new(
            ProxySpanBuilder::new(&upstreams),
            writer.clone(),
            None,
        )));
        sinks.push(Box::new(MetricsSink(metrics.clone())));
        let signals = Arc::new(std::sync::RwLock::new(
            tokenwatch_core::signals::SignalBoard::new(
                config.signals.history_points,
                config.signals.max_series,
            ),
        ));
        let aggregator = Arc::new(std::sync::Mutex::new(
            tokenwatch_core::aggregate::Aggregator::new(Default::default()),
        ));
        let handle = tokenwatch::alerting::engine::start_from_config(
            config.engine_sections(),
            signals,
            store.clone(),
            aggregator,
            metrics.clone(),
            Default::default(),
            &Default::default(),
            stop,
        )
        .expect("alerting");
        if let Some(sink) = handle.sink {
            sinks.push(Box::new(sink));
        }
        alerting = Some((handle.tasks, handle.control));
    }
    // Held until everything is done: the writer thread ends (and leaves /proc) when the last
    // handle is dropped.
    let keep_writer = writer;
    let before = thread_ticks();
    for b in batches {
        for s in &mut sinks {
            s.consume_shared(&b).expect("consume");
        }
    }
    drop(sinks);
    let ticks = settle(&before);
    drop(keep_writer);
    assert!(
        thread.finish(Duration::from_secs(600)),
        "the writer drained"
    );
    drop(alerting);
    rt.shutdown_timeout(Duration::from_secs(5));
    Run { ticks }
}

fn main() {
    let n = env_or("TW_BENCH_RECORDS", 20_000);
    let batch = env_or("TW_BENCH_BATCH", 64).max(1);
    let hz = ticks_per_s();
    let per_record = |t: u64| t as f64 / hz * 1e6 / n as f64;
    let base = run(false, records(n, batch), batch);
    let full = run(true, records(n, batch), batch);
    let (b, f) = (total(&base.ticks), total(&full.ticks));
    println!("pipeline bench: {n} records in batches of {batch}");
    println!("store only:      {:8.1} µs CPU per record", per_record(b));
    println!(
        "all sinks:       {:8.1} µs CPU per record  ({:.2}x store only)",
        per_record(f),
        f as f64 / b.max(1) as f64
    );
    for (name, r) in [("store only", &base), ("all sinks", &full)] {
        let split: Vec<String> = r
            .ticks
            .iter()
            .map(|(k, v)| format!("{k} {:.1}", per_record(*v)))
            .collect();
        println!("  {name} by thread (µs/record): {}", split.join(", "));
    }
}
