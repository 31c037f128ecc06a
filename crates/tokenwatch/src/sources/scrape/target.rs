// One scrape target: its resolved spec, the HTTP fetch (timeout, Accept header, body limit)
// and the task that scrapes it every interval, maps what it read and records its health.

use super::identity::TargetIdentity;
use super::mapping::Mapper;
use super::rules::RuleSet;
use super::status::{Health, Outcome, Registry, TargetStatus};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokenwatch_core::alert::EventInbox;
use tokenwatch_core::exposition::{self, Format};
use tokenwatch_core::signals::SharedSignals;
use tokio::sync::watch;

pub const ACCEPT: &str =
    "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3";
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    #[error("{0:?} is not a URL: {1}")]
    Url(String, String),
    #[error("{0:?}: https scrape targets are not supported yet; use http://")]
    Https(String),
    #[error("{0:?}: expected http://host:port/path")]
    Scheme(String),
    #[error("interval {0:?} is too short: scrape intervals must be at least 1s")]
    Interval(Duration),
    #[error("timeout must be more than 0")]
    Timeout,
    #[error("{0}")]
    Duration(String),
}

/// A target ready to scrape.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetSpec {
    pub url: String,
    pub uri: http::Uri,
    pub runtime: Option<String>,
    pub interval: Duration,
    /// Never more than the interval.
    pub timeout: Duration,
    pub labels: BTreeMap<String, String>,
    /// `static` or `file_sd:<path>`.
    pub origin: String,
}

impl TargetSpec {
    pub fn new(
        url: &str,
        runtime: Option<String>,
        interval: Duration,
        timeout: Duration,
        labels: BTreeMap<String, String>,
        origin: String,
    ) -> Result<TargetSpec, SpecError> {
        let uri: http::Uri = url
            .trim()
            .parse()
            .map_err(|e: http::uri::InvalidUri| SpecError::Url(url.into(), e.to_string()))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => return Err(SpecError::Https(url.into())),
            _ => return Err(SpecError::Scheme(url.into())),
        }
        if uri.authority().is_none() {
            return Err(SpecError::Scheme(url.into()));
        }
        if interval < MIN_INTERVAL {
            return Err(SpecError::Interval(interval));
        }
        if timeout.is_zero() {
            return Err(SpecError::Timeout);
        }
        let runtime = runtime.filter(|r| !r.trim().is_empty());
        Ok(TargetSpec {
            url: url.trim().into(),
            uri,
            runtime,
            interval,
            timeout: timeout.min(interval),
            labels,
            origin,
        })
    }

    /// What `GET /api/v1/targets` lists for this target before its first scrape.
    pub fn first_status(&self) -> TargetStatus {
        TargetStatus {
            url: self.url.clone(),
            instance: self.instance(),
            runtime_from: if self.runtime.is_some() {
                "configured"
            } else {
                "unknown"
            },
            runtime: self.runtime.clone().unwrap_or_default(),
            labels: self.labels.clone(),
            origin: self.origin.clone(),
            health: "unknown",
            last_error: None,
            last_scrape: None,
            last_scrape_duration_s: None,
            samples: 0,
            interval_s: self.interval.as_secs_f64(),
            timeout_s: self.timeout.as_secs_f64(),
        }
    }

    /// The `instance` label when set, else the URL's `host:port`.
    pub fn instance(&self) -> String {
        if let Some(i) = self.labels.get("instance") {
            return i.clone();
        }
        self.uri
            .authority()
            .map(|a| a.to_string())
            .unwrap_or_default()
    }
}

/// Why a scrape failed; `reason()` is the `reason` label of `tokenwatch_scrape_failures_total`.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error("connection failed: {0}")]
    Connect(String),
    #[error("no complete answer within {0:?}")]
    Timeout(Duration),
    #[error("HTTP status {0}")]
    Status(u16),
    #[error("body larger than {0} bytes")]
    TooLarge(usize),
    #[error("reading the body failed: {0}")]
    Body(String),
    #[error("body is not UTF-8 text")]
    NotUtf8,
    #[error("not Prometheus/OpenMetrics exposition: {0}")]
    Parse(#[from] exposition::ParseError),
}

impl ScrapeError {
    pub fn reason(&self) -> &'static str {
        match self {
            ScrapeError::Connect(_) => "connect",
            ScrapeError::Timeout(_) => "timeout",
            ScrapeError::Status(_) => "http_status",
            ScrapeError::TooLarge(_) => "body_too_large",
            ScrapeError::Body(_) => "body",
            ScrapeError::NotUtf8 | ScrapeError::Parse(_) => "parse",
        }
    }
}

pub type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// GET the target's body and content type.
pub async fn fetch(
    client: &HttpClient,
    uri: &http::Uri,
    max_body: usize,
) -> Result<(Bytes, String), ScrapeError> {
    fetch_accepting(client, uri, max_body, ACCEPT).await
}

/// GET `uri`'s body (at most `max_body` bytes) and content type, asking for `accept`.
pub async fn fetch_accepting(
    client: &HttpClient,
    uri: &http::Uri,
    max_body: usize,
    accept: &str,
) -> Result<(Bytes, String), ScrapeError> {
    let req = http::Request::get(uri.clone())
        .header(http::header::ACCEPT, accept)
        .header(
            http::header::USER_AGENT,
            concat!("tokenwatch/", env!("CARGO_PKG_VERSION")),
        )
        .body(Empty::<Bytes>::new())
        .map_err(|e| ScrapeError::Connect(e.to_string()))?;
    let resp = client.request(req).await.map_err(|e| {
        let mut msg = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            msg = format!("{msg}: {s}");
            src = s.source();
        }
        ScrapeError::Connect(msg)
    })?;
    if !resp.status().is_success() {
        return Err(ScrapeError::Status(resp.status().as_u16()));
    }
    let declared = resp
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if declared.is_some_and(|len| len > max_body) {
        return Err(ScrapeError::TooLarge(max_body));
    }
    let content_type = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = Limited::new(resp.into_body(), max_body)
        .collect()
        .await
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                ScrapeError::TooLarge(max_body)
            } else {
                ScrapeError::Body(e.to_string())
            }
        })?;
    Ok((body.to_bytes(), content_type))
}

/// What every target task shares.
#[derive(Clone)]
pub struct Shared {
    pub client: HttpClient,
    pub rules: Arc<RuleSet>,
    pub registry: Registry,
    pub health: Health,
    pub signals: SharedSignals,
    /// GPU XID errors go to the alert engine's root-cause history.
    pub events: EventInbox,
    /// Other ids of a model (`models.aliases`): series naming one go under the model's id.
    pub aliases: crate::kernel::models::SharedAliases,
    /// Scraped model versions become version markers.
    pub versions: super::versions::ScrapedMarkers,
    pub window: Duration,
    pub max_body: usize,
    pub shutdown: watch::Receiver<bool>,
}

/// Renames the model of every point, count, placement and version of a scrape that names an
/// alias (`models.aliases`) to the model's id.
fn resolve_aliases(
    out: &mut super::mapping::MapOutput,
    aliases: &crate::kernel::models::ModelAliases,
) {
    for p in &mut out.points {
        aliases.apply(&mut p.model_id);
    }
    for c in &mut out.counts {
        aliases.apply(&mut c.model_id);
    }
    for p in &mut out.placed {
        aliases.apply(&mut p.model_id);
    }
    for (model, _) in &mut out.versions {
        aliases.apply(model);
    }
}

/// Scrape `spec` every interval until shutdown (or until the task is aborted).
pub async fn run(spec: TargetSpec, shared: Shared) {
    let identity = TargetIdentity {
        instance: spec.instance(),
        runtime: spec.runtime.clone(),
        labels: spec.labels.clone(),
        url: spec.url.clone(),
    };
    let mut mapper = Mapper::new(shared.rules.clone(), identity, shared.window);
    let mut tick = tokio::time::interval(spec.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut shutdown = shared.shutdown.clone();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        if *shutdown.borrow() {
            return;
        }
        tokio::select! {
            _ = scrape_once(&spec, &shared, &mut mapper) => {}
            _ = shutdown.changed() => return,
        }
    }
}

async fn scrape_once(spec: &TargetSpec, shared: &Shared, mapper: &mut Mapper) {
    let started = Instant::now();
    let fetched = match tokio::time::timeout(
        spec.timeout,
        fetch(&shared.client, &spec.uri, shared.max_body),
    )
    .await
    {
        Ok(r) => r,
        Err(_) => Err(ScrapeError::Timeout(spec.timeout)),
    };
    let result = fetched.and_then(|(body, content_type)| {
        let text = std::str::from_utf8(&body).map_err(|_| ScrapeError::NotUtf8)?;
        let families = exposition::parse(text, Format::from_content_type(&content_type))?;
        let now_ms = chrono::Utc::now().timestamp_millis();
        Ok((mapper.map(&families, Instant::now(), now_ms), now_ms))
    });
    let duration = started.elapsed();
    let outcome = match result {
        Ok((mut out, now_ms)) => {
            if !shared.aliases.is_empty() {
                resolve_aliases(&mut out, &shared.aliases);
            }
            shared
                .versions
                .observe(&spec.instance(), &out.versions, now_ms);
            if !out.points.is_empty() || !out.counts.is_empty() || !out.placed.is_empty() {
                let mut board = shared.signals.write().unwrap_or_else(|p| p.into_inner());
                for p in out.points {
                    board.update(p);
                }
                for c in out.counts {
                    board.record_counts(c);
                }
                for p in out.placed {
                    board.record_placement(p, now_ms);
                }
            }
            for e in out.events {
                tracing::warn!(target_url = %spec.url, labels = ?e.labels, summary = %e.summary, "GPU XID error");
                shared.events.push(e);
            }
            Outcome::Up {
                runtime: out.runtime,
                detected: out.detected,
                samples: out.samples,
            }
        }
        Err(e) => {
            tracing::debug!(target_url = %spec.url, error = %e, "scrape failed");
            Outcome::Down {
                reason: e.reason(),
                error: e.to_string(),
            }
        }
    };
    shared
        .registry
        .record(&spec.url, &shared.health, outcome, duration);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(url: &str, interval: u64) -> Result<TargetSpec, SpecError> {
        TargetSpec::new(
            url,
            None,
            Duration::from_secs(interval),
            Duration::from_secs(3),
            BTreeMap::new(),
            "static".into(),
        )
    }

    /// Serve one raw HTTP answer to every connection.
    async fn serve(answer: &'static [u8]) -> http::Uri {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(answer).await;
                let _ = s.shutdown().await;
            }
        });
        format!("http://{addr}/metrics").parse().unwrap()
    }

    fn client() -> HttpClient {
        Client::builder(hyper_util::rt::TokioExecutor::new()).build_http()
    }

    #[tokio::test]
    async fn fetch_limits_the_body_and_reports_status() {
        let body = b"HTTP/1.1 200 OK\r\nContent-Type: application/openmetrics-text; version=1.0.0\r\nContent-Length: 10\r\n\r\nx_total 1\n";
        let (b, ct) = fetch(&client(), &serve(body).await, 10).await.unwrap();
        assert_eq!(
            (b.as_ref(), Format::from_content_type(&ct)),
            (&b"x_total 1\n"[..], Format::OpenMetrics)
        );
        let e = fetch(&client(), &serve(body).await, 5).await.unwrap_err();
        assert_eq!(e.reason(), "body_too_large");
        // No Content-Length: the limit applies while reading.
        let e = fetch(
            &client(),
            &serve(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n0123456789").await,
            5,
        )
        .await
        .unwrap_err();
        assert_eq!(e.reason(), "body_too_large", "{e}");
        let e = fetch(
            &client(),
            &serve(b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n").await,
            5,
        )
        .await
        .unwrap_err();
        assert_eq!(
            (e.reason(), e.to_string()),
            ("http_status", "HTTP status 503".to_string())
        );
    }

    #[test]
    fn specs_are_checked() {
        let s = spec("http://127.0.0.1:8000/metrics", 1).unwrap();
        assert_eq!(s.instance(), "127.0.0.1:8000");
        assert_eq!(
            s.timeout,
            Duration::from_secs(1),
            "timeout is capped at the interval"
        );
        assert!(matches!(
            spec("https://h:1/metrics", 5),
            Err(SpecError::Https(_))
        ));
        assert!(matches!(
            spec("ftp://h:1/metrics", 5),
            Err(SpecError::Scheme(_))
        ));
        assert!(spec("h:1/metrics", 5).is_err());
        assert!(
            spec("http://h:1/metrics", 0)
                .unwrap_err()
                .to_string()
                .contains("at least 1s")
        );
        assert!(matches!(
            spec("http://bad host/", 5),
            Err(SpecError::Url(..))
        ));
    }
}
