// Remote write against in-test receivers: headers and body as sent, retries, refusals, the
// bounded queue, shutdown; and the configuration's checks with their key paths.

use super::sender::{Batch, ShardQueue};
use super::*;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use prost::Message;
use std::sync::Mutex;
use std::time::Instant;

/// A receiver answering `script[n]` to its n-th request (the last entry afterwards).
#[derive(Clone)]
struct Receiver {
    got: Arc<Mutex<Vec<(HeaderMap, WriteRequest)>>>,
    script: Arc<Vec<(u16, &'static str)>>,
}

async fn receive(
    State(r): State<Receiver>,
    headers: HeaderMap,
    body: bytes::Bytes,
) -> (StatusCode, &'static str) {
    let raw = snap::raw::Decoder::new()
        .decompress_vec(&body)
        .expect("snappy block body");
    let req = WriteRequest::decode(raw.as_slice()).expect("protobuf WriteRequest");
    let mut got = r.got.lock().unwrap();
    got.push((headers, req));
    let (code, text) = r.script[(got.len() - 1).min(r.script.len() - 1)];
    (StatusCode::from_u16(code).unwrap(), text)
}

async fn serve(script: Vec<(u16, &'static str)>) -> (Receiver, String) {
    let r = Receiver {
        got: Arc::default(),
        script: Arc::new(script),
    };
    let app = axum::Router::new()
        .route("/api/v1/write", axum::routing::post(receive))
        .with_state(r.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (r, format!("http://{addr}/api/v1/write"))
}

/// Sum of the series of `name` in `text` whose line contains every one of `having`.
fn counter(text: &str, name: &str, having: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && having.iter().all(|h| l.contains(h)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn endpoint(url: &str, interval: &str) -> RemoteWriteConfig {
    RemoteWriteConfig {
        interval: HumanDuration::parse(interval).unwrap(),
        ..RemoteWriteConfig::new(url)
    }
}

async fn stop_all(stop: watch::Sender<bool>, tasks: Vec<JoinHandle<()>>) {
    stop.send(true).unwrap();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(5), t)
            .await
            .expect("remote-write task stops on shutdown")
            .unwrap();
    }
}

#[tokio::test]
async fn requests_carry_the_protocol_headers_and_are_retried_after_503() {
    let (recv, url) = serve(vec![(503, "busy"), (503, "busy"), (204, "")]).await;
    let mut cfg = endpoint(&url, "1h");
    cfg.headers
        .insert("Authorization".into(), "Bearer s3cret".into());
    cfg.external_labels
        .insert("instance".into(), "tw-test".into());
    let metrics = Arc::new(Metrics::new());
    let (stop_tx, stop) = watch::channel(false);
    let started = Instant::now();
    let tasks = start(&[cfg], metrics.clone(), stop).unwrap();
    wait_until("three attempts", || recv.got.lock().unwrap().len() >= 3).await;
    // Backoff: 100 ms, then 200 ms.
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
    let got = recv.got.lock().unwrap().clone();
    let (headers, req) = &got[2];
    assert_eq!(headers["content-encoding"], "snappy");
    assert_eq!(headers["content-type"], "application/x-protobuf");
    assert_eq!(headers["x-prometheus-remote-write-version"], "0.1.0");
    assert_eq!(
        headers["user-agent"],
        concat!("tokenwatch/", env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(headers["authorization"], "Bearer s3cret");
    assert_eq!(got[0].1, got[2].1, "a retry sends the same request");
    let build = req
        .timeseries
        .iter()
        .find(|t| {
            t.labels
                .iter()
                .any(|l| l.name == "__name__" && l.value == "tokenwatch_build_info")
        })
        .expect("tokenwatch_build_info sent");
    let labels: Vec<(&str, &str)> = build
        .labels
        .iter()
        .map(|l| (l.name.as_str(), l.value.as_str()))
        .collect();
    assert_eq!(
        labels,
        [
            ("__name__", "tokenwatch_build_info"),
            ("instance", "tw-test"),
            ("job", "tokenwatch"),
            ("version", env!("CARGO_PKG_VERSION"))
        ]
    );
    assert_eq!(build.samples.len(), 1);
    assert_eq!(build.samples[0].value, 1.0);
    let age = chrono::Utc::now().timestamp_millis() - build.samples[0].timestamp;
    assert!(
        (0..60_000).contains(&age),
        "stamped with the snapshot time: {age} ms ago"
    );
    let sent = req.sample_count() as f64;
    wait_until("the samples counter", || {
        counter(
            &metrics.encode(),
            "tokenwatch_remote_write_samples_total",
            &[],
        ) == sent
    })
    .await;
    let text = metrics.encode();
    assert_eq!(
        counter(
            &text,
            "tokenwatch_remote_write_failures_total",
            &[&format!("url=\"{url}\"")]
        ),
        2.0,
        "{text}"
    );
    assert_eq!(
        counter(&text, "tokenwatch_remote_write_dropped_total", &[]),
        0.0,
        "{text}"
    );
    assert_eq!(got.len(), 3, "an hour's interval: one snapshot only");
    stop_all(stop_tx, tasks).await;
}

#[tokio::test]
async fn a_4xx_drops_the_request_without_retrying() {
    let (recv, url) = serve(vec![(400, "out of bounds")]).await;
    let metrics = Arc::new(Metrics::new());
    let (stop_tx, stop) = watch::channel(false);
    let tasks = start(&[endpoint(&url, "1h")], metrics.clone(), stop).unwrap();
    wait_until("the refusal counted", || {
        counter(
            &metrics.encode(),
            "tokenwatch_remote_write_dropped_total",
            &["reason=\"rejected\""],
        ) > 0.0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let got = recv.got.lock().unwrap().clone();
    assert_eq!(got.len(), 1, "no retry after a 400");
    let text = metrics.encode();
    let samples = got[0].1.sample_count() as f64;
    assert_eq!(
        counter(
            &text,
            "tokenwatch_remote_write_dropped_total",
            &["reason=\"rejected\""]
        ),
        samples,
        "{text}"
    );
    assert_eq!(
        counter(&text, "tokenwatch_remote_write_failures_total", &[]),
        1.0,
        "{text}"
    );
    assert_eq!(
        counter(&text, "tokenwatch_remote_write_samples_total", &[]),
        0.0,
        "{text}"
    );
    stop_all(stop_tx, tasks).await;
}

#[tokio::test]
async fn a_down_endpoint_fills_the_queue_drops_the_oldest_and_stops_promptly() {
    // A port nothing listens on: bound, then closed.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let url = format!("http://{addr}/api/v1/write");
    let mut cfg = endpoint(&url, "50ms");
    cfg.queue.capacity = 2;
    cfg.queue.max_shards = 2;
    let metrics = Arc::new(Metrics::new());
    let (stop_tx, stop) = watch::channel(false);
    let tasks = start(&[cfg], metrics.clone(), stop).unwrap();
    wait_until("queue_full drops and several failures", || {
        let text = metrics.encode();
        counter(
            &text,
            "tokenwatch_remote_write_dropped_total",
            &["reason=\"queue_full\""],
        ) > 0.0
            && counter(&text, "tokenwatch_remote_write_failures_total", &[]) >= 4.0
    })
    .await;
    let begun = Instant::now();
    stop_all(stop_tx, tasks).await;
    assert!(
        begun.elapsed() < Duration::from_secs(3),
        "{:?}",
        begun.elapsed()
    );
    let text = metrics.encode();
    assert!(
        counter(
            &text,
            "tokenwatch_remote_write_dropped_total",
            &["reason=\"shutdown\""]
        ) > 0.0,
        "{text}"
    );
    assert_eq!(
        counter(&text, "tokenwatch_remote_write_samples_total", &[]),
        0.0,
        "{text}"
    );
}

#[tokio::test]
async fn the_queue_drops_its_oldest_request_when_full() {
    let q = ShardQueue::new(2);
    let b = |n: u64| Batch {
        body: bytes::Bytes::new(),
        samples: n,
    };
    assert!(q.push(b(1)).is_none());
    assert!(q.push(b(2)).is_none());
    assert_eq!(q.push(b(3)).map(|d| d.samples), Some(1));
    assert_eq!(q.pop().await.samples, 2);
    assert_eq!(q.pop().await.samples, 3);
    assert!(q.drain().is_empty());
    let waiter = tokio::time::timeout(Duration::from_millis(50), q.pop()).await;
    assert!(waiter.is_err(), "pop waits on an empty queue");
}

#[test]
fn configuration_parses_with_defaults_and_names_bad_keys() {
    use crate::config::Config;
    let y = "export:\n  remote_write:\n    - url: http://127.0.0.1:9090/api/v1/write\n      headers: {Authorization: Bearer x}\n      interval: 5s\n      external_labels: {cluster: eu1}\n      queue: {capacity: 10, max_shards: 4}\n";
    let c = Config::from_yaml(y, "c.yaml").unwrap();
    let rw = &c.export.remote_write[0];
    assert_eq!(rw.interval.0, Duration::from_secs(5));
    assert_eq!(rw.timeout.0, Duration::from_secs(30));
    assert_eq!(
        rw.queue,
        QueueConfig {
            capacity: 10,
            max_shards: 4,
            max_samples_per_send: 2000
        }
    );
    assert!(
        Config::from_yaml("", "c.yaml")
            .unwrap()
            .export
            .remote_write
            .is_empty()
    );

    for (yaml, key) in [
        ("    - url: ftp://h/x\n", "export.remote_write[0].url"),
        ("    - url: http://u:p@h/x\n", "export.remote_write[0].url"),
        (
            "    - url: http://h/x\n    - url: http://h/x\n",
            "export.remote_write[1].url",
        ),
        (
            "    - url: http://h/x\n      queue: {capacity: 0}\n",
            "export.remote_write[0].queue.capacity",
        ),
        (
            "    - url: http://h/x\n      queue: {max_shards: 0}\n",
            "export.remote_write[0].queue.max_shards",
        ),
        (
            "    - url: http://h/x\n      interval: 0s\n",
            "export.remote_write[0].interval",
        ),
        (
            "    - url: http://h/x\n      headers: {Content-Type: text/plain}\n",
            "export.remote_write[0].headers.Content-Type",
        ),
        (
            "    - url: http://h/x\n      headers: {'bad name': x}\n",
            "export.remote_write[0].headers.bad name",
        ),
        (
            "    - url: http://h/x\n      external_labels: {'9x': y}\n",
            "export.remote_write[0].external_labels.9x",
        ),
        (
            "    - url: http://h/x\n      external_labels: {__name__: y}\n",
            "export.remote_write[0].external_labels.__name__",
        ),
        (
            "    - url: http://h/x\n      tls: {server_name: h}\n",
            "export.remote_write[0].tls",
        ),
        (
            "    - url: https://h/x\n      tls: {ca_file: /nonexistent/ca.pem}\n",
            "export.remote_write[0].tls.ca_file",
        ),
    ] {
        let err = Config::from_yaml(&format!("export:\n  remote_write:\n{yaml}"), "c.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains(&format!("c.yaml: {key}: ")), "{yaml} -> {err}");
    }
    let err = Config::from_yaml(
        "export:\n  remote_write:\n    - url: http://h/x\n      queue: {capasity: 1}\n",
        "c.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("key export.remote_write[0].queue") && err.contains("capasity"),
        "{err}"
    );
    let err = Config::from_yaml("export:\n  remote_write:\n    - headers: {}\n", "c.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("url"), "{err}");
}

#[test]
fn job_is_tokenwatch_unless_configured() {
    let p = prepare(0, &RemoteWriteConfig::new("https://h/api/v1/write")).unwrap();
    assert_eq!(
        p.external,
        vec![Label {
            name: "job".into(),
            value: "tokenwatch".into()
        }]
    );
    assert_eq!(p.label, "https://h/api/v1/write");
    let mut cfg = RemoteWriteConfig::new("http://h:9090/w?tenant=a");
    cfg.external_labels.insert("job".into(), String::new());
    cfg.external_labels.insert("env".into(), "prod".into());
    let p = prepare(0, &cfg).unwrap();
    assert_eq!(
        p.label, "http://h:9090/w",
        "the query string stays out of the url label"
    );
    let names: Vec<_> = p
        .external
        .iter()
        .map(|l| (l.name.as_str(), l.value.as_str()))
        .collect();
    assert_eq!(names, [("env", "prod"), ("job", "")]);
}
