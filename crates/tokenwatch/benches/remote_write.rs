// Prometheus remote-write benchmark (issue 11): CPU per snapshot and samples/s of turning what `/metrics`
// serves into snappy-compressed WriteRequests, against encoding the text alone; then the real sender's CPU.
//
// Run: `cargo bench -p tokenwatch --bench remote_write`. Knobs (environment variables, defaults in brackets):
//   TW_BENCH_SERIES [5000,50000]  series per snapshot: the registry is filled until it holds about this many
//   TW_BENCH_SECS [1]             measured seconds per case and round (after 0.3 s of warm-up)
//   TW_BENCH_ROUNDS [3]           rounds, baseline and remote write interleaved; the median round is shown
//   TW_BENCH_SEND_SECS [10]       seconds the real sender runs against the in-process receiver, per size (0 = skip)
//   TW_BENCH_SEND_INTERVAL_MS [1000]  its snapshot interval
//   TW_BENCH_MAX_SAMPLES [2000]   queue.max_samples_per_send (the default)
//   TW_BENCH_OUT [<workspace>/target/bench-remote-write.md]
//
// The registry is tokenwatch's own `Metrics`, filled through `MetricsSink` (what the pipeline feeds) with
// request records for models × instances (8 instances per model), some with errors. CPU is the measuring
// thread's own time on CPU (`/proc/thread-self/schedstat`), so the in-process receiver is not charged to
// the sender: the sender runs on a current-thread runtime of its own thread, with its HTTP connections.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use prost::Message;
use std::collections::BTreeSet;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokenwatch::config::HumanDuration;
use tokenwatch::export::prometheus::{Metrics, MetricsSink};
use tokenwatch::export::remote_write::{
    self, Label, RemoteWriteConfig, WriteRequest, series_from_exposition, sort_labels, split,
};
use tokenwatch::pipeline::RecordSink;
use tokenwatch_core::model::{ErrorClass, RequestRecord, SeriesLabels};

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

/// Seconds this thread has been on a CPU: `/proc/thread-self/schedstat` (ns), else `stat` (1/100 s ticks).
fn thread_cpu_s() -> f64 {
    let schedstat = std::fs::read_to_string("/proc/thread-self/schedstat").ok();
    if let Some(ns) = schedstat
        .as_deref()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
    {
        return ns as f64 / 1e9;
    }
    let stat = std::fs::read_to_string("/proc/thread-self/stat")
        .expect("/proc/thread-self/stat (Linux only)");
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<u64> = after
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    (f[11] + f[12]) as f64 / 100.0
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

const MODELS: [(&str, &str); 6] = [
    ("llama-3.1-8b-instruct", "vllm"),
    ("llama-3.1-70b-instruct", "vllm"),
    ("qwen2.5-7b-instruct", "vllm"),
    ("mistral-7b-instruct-v0.3", "sglang"),
    ("gemma-2-27b-it", "tgi"),
    ("deepseek-r1-distill-qwen-32b", "vllm"),
];
const INSTANCES_PER_MODEL: usize = 8;
/// Error pattern repeats every this many (model, instance) pairs.
const PERIOD: usize = 15;

/// Deterministic spread in [0, 1).
fn unit(seed: u64) -> f64 {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 31;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 29;
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// Records of (model, instance) pair `k`: streamed successes with varied latencies and tokens, and for
/// every third pair an upstream timeout, every fifth a 5xx.
fn records_of(k: usize) -> Vec<RequestRecord> {
    let m = k / INSTANCES_PER_MODEL;
    let (base, runtime) = MODELS[m % MODELS.len()];
    let model_id = if m < MODELS.len() {
        base.to_string()
    } else {
        format!("{base}-ft{}", m / MODELS.len())
    };
    let labels = SeriesLabels {
        model_id,
        runtime: runtime.into(),
        instance: format!(
            "10.{}.{}.{}:8000",
            16 + m / 250,
            m % 250,
            k % INSTANCES_PER_MODEL + 10
        ),
        tenant: format!("tenant-{}", k % 7),
        ..Default::default()
    };
    let mut out = Vec::new();
    for i in 0..12u64 {
        let seed = (k as u64) << 8 | i;
        let ttft = 0.03 + 0.6 * unit(seed);
        let output = 20 + (unit(seed ^ 1) * 600.0) as u64;
        let end = ttft + output as f64 * (0.01 + 0.05 * unit(seed ^ 2));
        out.push(RequestRecord {
            labels: labels.clone(),
            stream: true,
            first_token_s: Some(ttft),
            end_s: end,
            chunk_offsets_us: vec![(ttft * 1e6) as u32, (end * 1e6) as u32],
            prompt_tokens: Some(100 + (unit(seed ^ 3) * 3000.0) as u64),
            output_tokens: Some(output),
            status: 200,
            finish_reason: "stop".into(),
            ..Default::default()
        });
    }
    let failed = |class: ErrorClass, end_s: f64, status: u16| RequestRecord {
        labels: labels.clone(),
        end_s,
        status,
        error_class: Some(class),
        ..Default::default()
    };
    if k.is_multiple_of(3) {
        out.push(failed(ErrorClass::UpstreamTimeout, 30.0, 504));
    }
    if k.is_multiple_of(5) {
        out.push(failed(ErrorClass::Upstream5xx, 0.4, 502));
    }
    out
}

fn filled(pairs: usize) -> Arc<Metrics> {
    let metrics = Arc::new(Metrics::new());
    let mut sink = MetricsSink(metrics.clone());
    for k in 0..pairs {
        sink.consume(&records_of(k)).expect("metrics sink");
    }
    metrics
}

fn series_count(metrics: &Metrics) -> usize {
    series_from_exposition(&metrics.encode(), 0, &[])
        .expect("tokenwatch's own /metrics parses")
        .len()
}

/// A registry with about `target` series: as many (model, instance) pairs as that takes.
fn registry_for(target: usize) -> (Arc<Metrics>, usize) {
    let base = series_count(&Metrics::new());
    let per_period = series_count(&filled(PERIOD)) - base;
    let pairs = (target.saturating_sub(base) * PERIOD)
        .div_ceil(per_period)
        .max(1);
    (filled(pairs), pairs)
}

/// The external labels `start` adds for `external_labels: {instance: tw-bench-1}` (plus the default job).
fn external_labels() -> Vec<Label> {
    let mut l = vec![
        Label {
            name: "instance".into(),
            value: "tw-bench-1".into(),
        },
        Label {
            name: "job".into(),
            value: "tokenwatch".into(),
        },
    ];
    sort_labels(&mut l);
    l
}

#[derive(Default, Clone, Copy)]
struct Snapshot {
    samples: usize,
    requests: usize,
    wire_bytes: usize,
    raw_bytes: usize,
}

/// One snapshot the way the sender makes it: encode → parse → series → split → protobuf + snappy.
/// Adds each stage's wall time to `stages`.
fn remote_write_snapshot(
    metrics: &Metrics,
    external: &[Label],
    max_samples: usize,
    stages: &mut [Duration; 4],
) -> Snapshot {
    let t0 = Instant::now();
    let text = metrics.encode();
    let t1 = Instant::now();
    let series =
        series_from_exposition(&text, 1_764_000_000_000, external).expect("/metrics parses");
    let t2 = Instant::now();
    let requests = split(series, 1, max_samples);
    let t3 = Instant::now();
    let mut snap = Snapshot::default();
    for req in requests.iter().flatten() {
        let body = req.to_body().expect("snappy");
        snap.samples += req.sample_count();
        snap.requests += 1;
        snap.wire_bytes += black_box(body).len();
    }
    let t4 = Instant::now();
    for (s, d) in stages.iter_mut().zip([t1 - t0, t2 - t1, t3 - t2, t4 - t3]) {
        *s += d;
    }
    snap
}

/// Run `f` (one snapshot) for `secs` after a warm-up; CPU seconds of this thread per snapshot.
fn cpu_per_snapshot(secs: f64, mut f: impl FnMut()) -> (f64, u64) {
    let warm = Instant::now();
    while warm.elapsed() < Duration::from_millis(300) {
        f();
    }
    let (cpu0, start) = (thread_cpu_s(), Instant::now());
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < secs || n == 0 {
        f();
        n += 1;
    }
    ((thread_cpu_s() - cpu0) / n as f64, n)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

struct Micro {
    series: usize,
    pairs: usize,
    text_bytes: usize,
    snap: Snapshot,
    encode_s: f64,
    full_s: f64,
    /// Share of the full path's wall time: encode, parse + series, split, protobuf + snappy.
    stage_share: [f64; 4],
}

fn micro(metrics: &Metrics, pairs: usize, secs: f64, rounds: usize, max_samples: usize) -> Micro {
    let external = external_labels();
    let text_bytes = metrics.encode().len();
    let mut stages = [Duration::ZERO; 4];
    let snap = remote_write_snapshot(metrics, &external, max_samples, &mut stages);
    let raw_bytes = split(
        series_from_exposition(&metrics.encode(), 1_764_000_000_000, &external).expect("parses"),
        1,
        max_samples,
    )
    .iter()
    .flatten()
    .map(WriteRequest::encoded_len)
    .sum();
    let snap = Snapshot { raw_bytes, ..snap };
    let (mut enc, mut full) = (Vec::new(), Vec::new());
    stages = [Duration::ZERO; 4];
    for _ in 0..rounds {
        enc.push(
            cpu_per_snapshot(secs, || {
                black_box(metrics.encode().len());
            })
            .0,
        );
        full.push(
            cpu_per_snapshot(secs, || {
                black_box(remote_write_snapshot(
                    metrics,
                    &external,
                    max_samples,
                    &mut stages,
                ));
            })
            .0,
        );
    }
    let total: f64 = stages.iter().map(Duration::as_secs_f64).sum();
    Micro {
        series: snap.samples,
        pairs,
        text_bytes,
        snap,
        encode_s: median(enc),
        full_s: median(full),
        stage_share: stages.map(|d| d.as_secs_f64() / total),
    }
}

/// What the in-process receiver saw.
#[derive(Default)]
struct Received {
    requests: AtomicU64,
    samples: AtomicU64,
    bytes: AtomicU64,
    bad: AtomicU64,
    /// Distinct sample timestamps: one per snapshot.
    snapshots: Mutex<BTreeSet<i64>>,
}

async fn receive(
    req: http::Request<Incoming>,
    got: Arc<Received>,
) -> Result<http::Response<Full<Bytes>>, Infallible> {
    let body = req
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    got.bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
    let decoded = snap::raw::Decoder::new()
        .decompress_vec(&body)
        .ok()
        .and_then(|raw| WriteRequest::decode(raw.as_slice()).ok());
    let status = match decoded {
        Some(w) => {
            got.requests.fetch_add(1, Ordering::Relaxed);
            got.samples
                .fetch_add(w.sample_count() as u64, Ordering::Relaxed);
            let mut snaps = got.snapshots.lock().unwrap_or_else(|p| p.into_inner());
            snaps.extend(
                w.timeseries
                    .iter()
                    .flat_map(|t| t.samples.iter().map(|s| s.timestamp)),
            );
            http::StatusCode::NO_CONTENT
        }
        None => {
            got.bad.fetch_add(1, Ordering::Relaxed);
            http::StatusCode::BAD_REQUEST
        }
    };
    let mut resp = http::Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = status;
    Ok(resp)
}

/// A remote-write receiver on 127.0.0.1, on its own thread and runtime: decodes every request and counts
/// its samples. Returns its URL; it stops when `stop` turns true.
fn start_receiver(
    got: Arc<Received>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> (String, std::thread::JoinHandle<()>) {
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind receiver");
    std_listener.set_nonblocking(true).expect("nonblocking");
    let addr = std_listener.local_addr().expect("receiver address");
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("receiver runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(std_listener).expect("tokio listener");
            loop {
                let stream = tokio::select! {
                    _ = stop.wait_for(|s| *s) => return,
                    a = listener.accept() => match a { Ok((s, _)) => s, Err(_) => continue },
                };
                let got = got.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| receive(req, got.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
    });
    (format!("http://{addr}/api/v1/write"), thread)
}

struct SendRun {
    wall_s: f64,
    cpu_s: f64,
    requests: u64,
    samples: u64,
    wire_bytes: u64,
    snapshots: usize,
    bad: u64,
}

/// The real sender (`remote_write::start`) on a current-thread runtime of its own thread for `secs`.
fn send(metrics: Arc<Metrics>, secs: f64, interval: Duration, max_samples: usize) -> SendRun {
    let got = Arc::new(Received::default());
    let (recv_stop_tx, recv_stop) = tokio::sync::watch::channel(false);
    let (url, receiver) = start_receiver(got.clone(), recv_stop);
    let mut cfg = RemoteWriteConfig::new(url);
    cfg.interval = HumanDuration(interval);
    cfg.external_labels
        .insert("instance".into(), "tw-bench-1".into());
    cfg.queue.max_samples_per_send = max_samples;
    let sender = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("sender runtime");
        rt.block_on(async move {
            let (stop_tx, stop) = tokio::sync::watch::channel(false);
            let (cpu0, start) = (thread_cpu_s(), Instant::now());
            let tasks = remote_write::start(&[cfg], metrics, stop).expect("remote-write config");
            tokio::time::sleep(Duration::from_secs_f64(secs)).await;
            let _ = stop_tx.send(true);
            for t in tasks {
                let _ = t.await;
            }
            (start.elapsed().as_secs_f64(), thread_cpu_s() - cpu0)
        })
    });
    let (wall_s, cpu_s) = sender.join().expect("sender thread");
    let _ = recv_stop_tx.send(true);
    receiver.join().expect("receiver thread");
    let snapshots = got
        .snapshots
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .len();
    SendRun {
        wall_s,
        cpu_s,
        requests: got.requests.load(Ordering::Relaxed),
        samples: got.samples.load(Ordering::Relaxed),
        wire_bytes: got.bytes.load(Ordering::Relaxed),
        snapshots,
        bad: got.bad.load(Ordering::Relaxed),
    }
}

fn thousands(n: f64) -> String {
    let s = format!("{:.0}", n);
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn main() {
    let sizes: Vec<usize> = std::env::var("TW_BENCH_SERIES")
        .unwrap_or_else(|_| "5000,50000".into())
        .split(',')
        .map(|v| {
            v.trim()
                .parse()
                .unwrap_or_else(|_| panic!("TW_BENCH_SERIES: {v:?} is not a number"))
        })
        .collect();
    let secs: f64 = env_or("TW_BENCH_SECS", 1.0);
    let rounds: usize = env_or("TW_BENCH_ROUNDS", 3usize).max(1);
    let send_secs: f64 = env_or("TW_BENCH_SEND_SECS", 10.0);
    let interval = Duration::from_millis(env_or("TW_BENCH_SEND_INTERVAL_MS", 1000u64).max(1));
    let max_samples: usize = env_or("TW_BENCH_MAX_SAMPLES", 2000usize).max(1);
    let out = std::env::var_os("TW_BENCH_OUT")
        .map(Into::into)
        .unwrap_or_else(|| {
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map(std::path::PathBuf::from)
                .unwrap_or_else(|| {
                    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target")
                });
            target.join("bench-remote-write.md")
        });
    let load_before = loadavg();

    let mut micro_rows = Vec::new();
    let mut send_rows = Vec::new();
    for &target in &sizes {
        let (metrics, pairs) = registry_for(target);
        let m = micro(&metrics, pairs, secs, rounds, max_samples);
        println!(
            "{:>6} series ({} model×instance pairs, {} B text): encode {:.0} µs, remote write {:.0} µs per snapshot ({:.2}×), {:.2} M samples/s/core, {:.2} B/sample on the wire",
            m.series,
            m.pairs,
            m.text_bytes,
            m.encode_s * 1e6,
            m.full_s * 1e6,
            m.full_s / m.encode_s,
            m.series as f64 / m.full_s / 1e6,
            m.snap.wire_bytes as f64 / m.series as f64
        );
        if send_secs > 0.0 {
            let s = send(metrics, send_secs, interval, max_samples);
            println!(
                "{:>6} series sent for {:.1} s every {:?}: {} snapshots, {} requests, {:.0} samples/s, sender CPU {:.1} ms/s ({:.0} µs/snapshot), {} refused",
                m.series,
                s.wall_s,
                interval,
                s.snapshots,
                s.requests,
                s.samples as f64 / s.wall_s,
                s.cpu_s / s.wall_s * 1e3,
                s.cpu_s / s.snapshots.max(1) as f64 * 1e6,
                s.bad
            );
            send_rows.push((m.series, s));
        }
        micro_rows.push(m);
    }

    let mut md = String::new();
    let _ = writeln!(md, "## Prometheus remote write\n");
    let _ = writeln!(
        md,
        "{} CPUs, load average {} before / {} after; TW_BENCH_SECS={secs}, TW_BENCH_ROUNDS={rounds}, max_samples_per_send={max_samples}\n",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        load_before,
        loadavg()
    );
    let _ = writeln!(
        md,
        "| series | `/metrics` text | encode text only (baseline) µs/snapshot | remote write µs/snapshot | ratio | samples/s/core | requests | protobuf B/sample | wire B/sample (snappy) | encode / parse / split / proto+snappy |"
    );
    let _ = writeln!(md, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for m in &micro_rows {
        let sh = m.stage_share.map(|s| format!("{:.0} %", s * 100.0));
        let _ = writeln!(
            md,
            "| {} | {} B | {} | {} | {:.2}× | {} | {} | {:.1} | {:.2} | {} |",
            thousands(m.series as f64),
            thousands(m.text_bytes as f64),
            thousands(m.encode_s * 1e6),
            thousands(m.full_s * 1e6),
            m.full_s / m.encode_s,
            thousands(m.series as f64 / m.full_s),
            m.snap.requests,
            m.snap.raw_bytes as f64 / m.series as f64,
            m.snap.wire_bytes as f64 / m.series as f64,
            sh.join(" / ")
        );
    }
    if !send_rows.is_empty() {
        let _ = writeln!(
            md,
            "\n| series | sent for | interval | snapshots | requests | samples/s delivered | sender CPU ms/s | sender CPU µs/snapshot | wire B/sample | at 15 s: samples/s | at 15 s: share of one core |"
        );
        let _ = writeln!(
            md,
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for (series, s) in &send_rows {
            let per_snap = s.cpu_s / s.snapshots.max(1) as f64;
            let samples_per_snap = s.samples as f64 / s.snapshots.max(1) as f64;
            let _ = writeln!(
                md,
                "| {} | {:.1} s | {:?} | {} | {} | {} | {:.1} | {} | {:.2} | {} | {:.3} % |",
                thousands(*series as f64),
                s.wall_s,
                interval,
                s.snapshots,
                s.requests,
                thousands(s.samples as f64 / s.wall_s),
                s.cpu_s / s.wall_s * 1e3,
                thousands(per_snap * 1e6),
                s.wire_bytes as f64 / s.samples.max(1) as f64,
                thousands(samples_per_snap / 15.0),
                per_snap / 15.0 * 100.0
            );
            assert_eq!(s.bad, 0, "the receiver could not decode {} requests", s.bad);
        }
    }
    println!("\n{md}");
    if let Some(dir) = std::path::Path::new(&out).parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    match std::fs::write(&out, &md) {
        Ok(()) => println!("report: {}", std::path::Path::new(&out).display()),
        Err(e) => eprintln!(
            "could not write {}: {e}",
            std::path::Path::new(&out).display()
        ),
    }
}
