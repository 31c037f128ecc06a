// Prometheus remote write (protocol 1.0) of what `/metrics` serves: the `export.remote_write`
// configuration, its checks, and the tasks that snapshot, queue and send, per endpoint.

//! Every `interval` the text `/metrics` would serve ([`Metrics::encode`]) is parsed into samples
//! (a histogram's `_bucket`, `_sum` and `_count` are series of their own), stamped with the
//! snapshot's time, given the endpoint's external labels (`job="tokenwatch"` unless configured)
//! and split into `WriteRequest`s: each series always goes to the same of `queue.max_shards`
//! shards, each request holds at most `queue.max_samples_per_send` samples. A request is POSTed
//! protobuf-encoded and snappy-compressed with `Content-Encoding: snappy`, `Content-Type:
//! application/x-protobuf`, `X-Prometheus-Remote-Write-Version: 0.1.0`, `User-Agent:
//! tokenwatch/<version>` and the configured headers. Each shard sends its requests one at a
//! time, in order, retrying connection errors, timeouts, 429 and 5xx with backoff (100 ms
//! doubling to 30 s) for as long as it takes; a 4xx other than 429 drops the request (logged
//! once, with the server's answer). Queues are in memory (no WAL) and bounded: a full queue
//! drops its oldest request. Counters: `tokenwatch_remote_write_samples_total{url}`,
//! `tokenwatch_remote_write_failures_total{url}` and
//! `tokenwatch_remote_write_dropped_total{url,reason}`. The tasks run on the runtime they are
//! started from (the analysis runtime), never on the proxy's.

mod convert;
mod proto;
mod sender;
#[cfg(test)]
mod tests;

pub use convert::{series_from_exposition, sort_labels, split};
pub use proto::{Label, Sample, TimeSeries, WriteRequest};
pub use sender::{MAX_BACKOFF, MIN_BACKOFF, RemoteWriteMetrics};

use crate::kernel::duration::HumanDuration;
use crate::kernel::telemetry::Metrics;
use crate::kernel::tls::UpstreamTls;
use crate::kernel::tls::UpstreamTlsConfig;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Most shards one endpoint may have.
const MAX_SHARDS: usize = 64;
/// Headers tokenwatch sets itself; the protocol depends on them.
const PROTOCOL_HEADERS: [&str; 5] = [
    "content-encoding",
    "content-type",
    "x-prometheus-remote-write-version",
    "content-length",
    "host",
];

/// One `export.remote_write` endpoint.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteWriteConfig {
    /// `http://` or `https://` URL of the receiver, e.g. `http://prometheus:9090/api/v1/write`.
    pub url: String,
    /// Extra request headers, e.g. `Authorization`.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// How often a snapshot of `/metrics` is sent.
    #[serde(default = "default_interval")]
    pub interval: HumanDuration,
    /// Per-attempt limit (connect, send and answer).
    #[serde(default = "default_timeout")]
    pub timeout: HumanDuration,
    /// Labels added to every series that lacks them. `job: tokenwatch` unless `job` is given
    /// here (an empty value leaves the label out).
    #[serde(default)]
    pub external_labels: BTreeMap<String, String>,
    #[serde(default)]
    pub queue: QueueConfig,
    /// For an `https://` URL: CA file trusted besides the system's roots, and the name checked.
    #[serde(default)]
    pub tls: Option<UpstreamTlsConfig>,
}

/// `export.remote_write[].queue`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueConfig {
    /// Requests waiting per shard; when full the oldest is dropped and counted.
    pub capacity: usize,
    /// Requests in flight at once to the endpoint (each series always goes by the same shard).
    pub max_shards: usize,
    /// Most samples in one request.
    pub max_samples_per_send: usize,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            capacity: 256,
            max_shards: 1,
            max_samples_per_send: 2000,
        }
    }
}

fn default_interval() -> HumanDuration {
    HumanDuration(Duration::from_secs(15))
}

fn default_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(30))
}

impl RemoteWriteConfig {
    /// An endpoint with every default (what `--remote-write URL` adds).
    pub fn new(url: impl Into<String>) -> RemoteWriteConfig {
        RemoteWriteConfig {
            url: url.into(),
            headers: BTreeMap::new(),
            interval: default_interval(),
            timeout: default_timeout(),
            external_labels: BTreeMap::new(),
            queue: QueueConfig::default(),
            tls: None,
        }
    }
}

/// A configuration error with the key it is about, e.g. `export.remote_write[0].url`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct RemoteWriteConfigError {
    pub key: String,
    pub message: String,
}

/// An endpoint's configuration, checked and turned into what sending needs.
struct Prepared {
    label: String,
    uri: http::Uri,
    headers: http::HeaderMap,
    external: Vec<Label>,
    tls: Option<UpstreamTls>,
}

fn prepare(i: usize, cfg: &RemoteWriteConfig) -> Result<Prepared, RemoteWriteConfigError> {
    let key = |k: &str| format!("export.remote_write[{i}].{k}");
    let err = |k: String, message: String| RemoteWriteConfigError { key: k, message };
    let url = cfg.url.trim();
    let uri: http::Uri = url
        .parse()
        .map_err(|e| err(key("url"), format!("{url:?} is not a URL: {e}")))?;
    let https = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => {
            return Err(err(
                key("url"),
                format!("{url:?}: expected an http:// or https:// URL"),
            ));
        }
    };
    let authority = uri
        .authority()
        .ok_or_else(|| err(key("url"), format!("{url:?}: missing host")))?;
    if authority.host().is_empty() || authority.as_str().contains('@') {
        return Err(err(
            key("url"),
            format!(
                "{url:?}: expected a host[:port] without user info (put credentials in headers)"
            ),
        ));
    }
    let label = format!(
        "{}://{}{}",
        uri.scheme_str().unwrap_or("http"),
        authority,
        uri.path()
    );

    let mut headers = http::HeaderMap::new();
    let fixed = [
        (http::header::CONTENT_ENCODING, "snappy"),
        (http::header::CONTENT_TYPE, "application/x-protobuf"),
        (
            http::HeaderName::from_static("x-prometheus-remote-write-version"),
            "0.1.0",
        ),
        (
            http::header::USER_AGENT,
            concat!("tokenwatch/", env!("CARGO_PKG_VERSION")),
        ),
    ];
    for (name, value) in fixed {
        headers.insert(name, http::HeaderValue::from_static(value));
    }
    for (name, value) in &cfg.headers {
        let at = key(&format!("headers.{name}"));
        let n = http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|e| err(at.clone(), format!("invalid header name: {e}")))?;
        if PROTOCOL_HEADERS.contains(&n.as_str()) {
            return Err(err(
                at,
                "set by tokenwatch (remote-write protocol); cannot be configured".into(),
            ));
        }
        let v = http::HeaderValue::from_str(value)
            .map_err(|e| err(at, format!("invalid header value: {e}")))?;
        headers.insert(n, v);
    }

    if cfg.interval.0.is_zero() {
        return Err(err(key("interval"), "must be greater than zero".into()));
    }
    if cfg.timeout.0.is_zero() {
        return Err(err(key("timeout"), "must be greater than zero".into()));
    }
    if cfg.queue.capacity == 0 {
        return Err(err(key("queue.capacity"), "must be at least 1".into()));
    }
    if !(1..=MAX_SHARDS).contains(&cfg.queue.max_shards) {
        return Err(err(
            key("queue.max_shards"),
            format!("must be 1–{MAX_SHARDS}, got {}", cfg.queue.max_shards),
        ));
    }
    if cfg.queue.max_samples_per_send == 0 {
        return Err(err(
            key("queue.max_samples_per_send"),
            "must be at least 1".into(),
        ));
    }

    let mut external = Vec::new();
    if !cfg.external_labels.contains_key("job") {
        external.push(Label {
            name: "job".into(),
            value: "tokenwatch".into(),
        });
    }
    for (name, value) in &cfg.external_labels {
        let valid = name
            .chars()
            .enumerate()
            .all(|(i, c)| c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit()));
        if name.is_empty() || !valid || name.starts_with("__") {
            let m = format!(
                "{name:?} is not a label name ([a-zA-Z_][a-zA-Z0-9_]*, not starting with __)"
            );
            return Err(err(key(&format!("external_labels.{name}")), m));
        }
        external.push(Label {
            name: name.clone(),
            value: value.clone(),
        });
    }
    convert::sort_labels(&mut external);

    let tls = match (&cfg.tls, https) {
        (Some(_), false) => {
            return Err(err(
                key("tls"),
                format!("{url:?} is plain http: tls applies to https:// URLs only"),
            ));
        }
        (tls, true) => Some(UpstreamTls::new(tls.as_ref()).map_err(|e| {
            let k = match e.key() {
                "" => key("tls"),
                sub => key(&format!("tls.{sub}")),
            };
            err(k, e.to_string())
        })?),
        (None, false) => None,
    };
    Ok(Prepared {
        label,
        uri,
        headers,
        external,
        tls,
    })
}

/// Check every endpoint (URL, headers, labels, queue, TLS); names the key at fault.
pub fn validate(endpoints: &[RemoteWriteConfig]) -> Result<(), RemoteWriteConfigError> {
    let mut seen: Vec<String> = Vec::new();
    for (i, cfg) in endpoints.iter().enumerate() {
        let p = prepare(i, cfg)?;
        if let Some(j) = seen.iter().position(|l| *l == p.label) {
            return Err(RemoteWriteConfigError {
                key: format!("export.remote_write[{i}].url"),
                message: format!("{:?} is already export.remote_write[{j}]", cfg.url),
            });
        }
        seen.push(p.label);
    }
    Ok(())
}

/// Start, on the current runtime, one snapshot task and `max_shards` sending tasks per
/// endpoint; they stop when `stop` turns true. Registers the `tokenwatch_remote_write_*`
/// counters when there is an endpoint (call once per `Metrics`).
pub fn start(
    endpoints: &[RemoteWriteConfig],
    metrics: Arc<Metrics>,
    stop: watch::Receiver<bool>,
) -> Result<Vec<JoinHandle<()>>, RemoteWriteConfigError> {
    validate(endpoints)?;
    if endpoints.is_empty() {
        return Ok(Vec::new());
    }
    let counters = RemoteWriteMetrics::register(&metrics);
    let mut tasks = Vec::new();
    for (i, cfg) in endpoints.iter().enumerate() {
        let p = prepare(i, cfg)?;
        let timeout = cfg.timeout.0;
        let client = sender::HttpClient::new(p.tls.as_ref(), timeout);
        tracing::info!(url = %p.label, interval = ?cfg.interval.0, shards = cfg.queue.max_shards, "remote write");
        let endpoint = Arc::new(sender::Endpoint::new(
            p.label,
            p.uri,
            p.headers,
            client,
            timeout,
            counters.clone(),
        ));
        let shards: Vec<Arc<sender::ShardQueue>> = (0..cfg.queue.max_shards)
            .map(|_| Arc::new(sender::ShardQueue::new(cfg.queue.capacity)))
            .collect();
        for q in &shards {
            tasks.push(tokio::spawn(
                endpoint.clone().run_shard(q.clone(), stop.clone()),
            ));
        }
        tasks.push(tokio::spawn(endpoint.run_snapshots(
            metrics.clone(),
            cfg.interval.0,
            p.external,
            cfg.queue.max_samples_per_send,
            shards,
            stop.clone(),
        )));
    }
    Ok(tasks)
}
