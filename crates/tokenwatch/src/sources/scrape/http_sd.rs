// Target discovery over HTTP, polled every refresh interval: an endpoint answering as Prometheus
// `http_sd` does (a JSON list of `{targets: [host:port], labels: {...}}` groups), or a running
// Prometheus's own discovered targets (`/api/v1/targets`, one job and labels picked). An endpoint
// that fails keeps the targets it gave last, and says why in `GET /api/v1/targets`.

use super::file_sd::{self, Defaults, TargetGroup};
use super::target::{HttpClient, ScrapeError, TargetSpec, fetch_accepting};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// What an http_sd endpoint is asked for (Prometheus sends the same).
const ACCEPT_JSON: &str = "application/json";

/// `scrape.prometheus_targets[]`: a Prometheus that already discovers the fleet; its active
/// targets of `job` (and carrying every one of `labels`) are scraped here too.
#[derive(Debug, Clone, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PrometheusTargetsConfig {
    /// The Prometheus server, e.g. `http://prometheus:9090`.
    pub url: String,
    /// Only targets of this scrape job (its `job` label); all active targets when absent.
    #[serde(default)]
    pub job: Option<String>,
    /// Only targets whose labels (after Prometheus's relabelling) hold these values.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// What an endpoint answers.
#[derive(Debug, Clone)]
enum Answer {
    /// A JSON list of target groups.
    HttpSd,
    /// Prometheus's `/api/v1/targets?state=active`, filtered.
    Prometheus {
        job: Option<String>,
        labels: BTreeMap<String, String>,
    },
}

/// Prometheus's `GET /api/v1/targets` answer, the fields read here.
#[derive(Deserialize)]
struct TargetsAnswer {
    data: TargetsData,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TargetsData {
    active_targets: Vec<ActiveTarget>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ActiveTarget {
    labels: BTreeMap<String, String>,
    scrape_url: String,
}

/// One polled endpoint: where it is, what it answers, when it is next due, and what it gave last.
#[derive(Debug)]
pub struct PolledEndpoint {
    pub url: String,
    uri: http::Uri,
    answer: Answer,
    due: Option<Instant>,
    pub found: file_sd::Found,
}

#[derive(Debug, thiserror::Error)]
pub enum HttpSdError {
    #[error("{url}: {source}")]
    Fetch { url: String, source: ScrapeError },
    #[error("{url}: took longer than {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    #[error("{url}: answered Content-Type {content_type:?}; http_sd needs application/json")]
    ContentType { url: String, content_type: String },
    #[error("{url}: not a JSON list of {{targets, labels}} groups: {message}")]
    Parse { url: String, message: String },
    #[error("{0}")]
    Target(file_sd::FileSdError),
}

impl PolledEndpoint {
    /// An endpoint of `scrape.http_sd`; the URL is checked (plain `http://` with a host).
    pub fn new(url: &str) -> Result<PolledEndpoint, String> {
        PolledEndpoint::with_answer(url, url, Answer::HttpSd)
    }

    /// A Prometheus of `scrape.prometheus_targets`: its `/api/v1/targets` is polled.
    pub fn prometheus(cfg: &PrometheusTargetsConfig) -> Result<PolledEndpoint, String> {
        let base = cfg.url.trim().trim_end_matches('/');
        PolledEndpoint::with_answer(
            &cfg.url,
            &format!("{base}/api/v1/targets?state=active"),
            Answer::Prometheus {
                job: cfg.job.clone(),
                labels: cfg.labels.clone(),
            },
        )
    }

    /// Which kind of endpoint: `http_sd` or `prometheus`.
    pub fn kind(&self) -> &'static str {
        match self.answer {
            Answer::HttpSd => "http_sd",
            Answer::Prometheus { .. } => "prometheus",
        }
    }

    fn with_answer(url: &str, poll: &str, answer: Answer) -> Result<PolledEndpoint, String> {
        let uri: http::Uri = poll.trim().parse().map_err(|e| format!("{url:?}: {e}"))?;
        if uri.scheme_str() != Some("http") || uri.authority().is_none() {
            return Err(format!(
                "{url:?} is not an http:// URL with a host (https is not supported for discovery yet)"
            ));
        }
        Ok(PolledEndpoint {
            url: url.trim().to_string(),
            uri,
            answer,
            due: None,
            found: file_sd::Found::default(),
        })
    }

    /// When it is due to be polled again (now, before its first poll).
    pub fn due(&self) -> Option<Instant> {
        self.due
    }

    /// Poll the endpoint when due (then again `refresh` later). Returns true when its targets
    /// changed. A failed poll keeps the previous targets (as Prometheus does) and records why.
    pub async fn refresh(
        &mut self,
        client: &HttpClient,
        defaults: Defaults,
        (refresh, timeout, max_body): (Duration, Duration, usize),
    ) -> bool {
        let now = Instant::now();
        if self.due.is_some_and(|d| d > now) {
            return false;
        }
        self.due = Some(now + refresh);
        let read = self.poll(client, defaults, timeout, max_body).await;
        let source = format!("{}:{}", self.kind(), self.url);
        self.found.take(read.map_err(|e| e.to_string()), &source)
    }

    async fn poll(
        &self,
        client: &HttpClient,
        defaults: Defaults,
        timeout: Duration,
        max_body: usize,
    ) -> Result<Vec<TargetSpec>, HttpSdError> {
        let url = self.url.clone();
        let (body, content_type) = tokio::time::timeout(
            timeout,
            fetch_accepting(client, &self.uri, max_body, ACCEPT_JSON),
        )
        .await
        .map_err(|_| HttpSdError::Timeout {
            url: url.clone(),
            timeout,
        })?
        .map_err(|source| HttpSdError::Fetch {
            url: url.clone(),
            source,
        })?;
        let media = content_type.split(';').next().unwrap_or("").trim();
        if !media.eq_ignore_ascii_case(ACCEPT_JSON) {
            return Err(HttpSdError::ContentType { url, content_type });
        }
        let parse = |e: serde_json::Error| HttpSdError::Parse {
            url: url.clone(),
            message: e.to_string(),
        };
        match &self.answer {
            Answer::HttpSd => {
                let groups: Vec<TargetGroup> = serde_json::from_slice(&body).map_err(parse)?;
                file_sd::targets_of(groups, &url, "http_sd", defaults).map_err(HttpSdError::Target)
            }
            Answer::Prometheus { job, labels } => {
                let answer: TargetsAnswer = serde_json::from_slice(&body).map_err(parse)?;
                Ok(prometheus_targets(
                    answer,
                    job.as_deref(),
                    labels,
                    &url,
                    defaults,
                ))
            }
        }
    }
}

/// The picked active targets of a Prometheus as target specs: its scrape URL, its labels (but
/// `job` and internal `__` ones; `instance` names it here as there). A target tokenwatch cannot
/// scrape (https) is left out, with a warning once per poll.
fn prometheus_targets(
    answer: TargetsAnswer,
    job: Option<&str>,
    wanted: &BTreeMap<String, String>,
    url: &str,
    defaults: Defaults,
) -> Vec<TargetSpec> {
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    for t in answer.data.active_targets {
        if job.is_some_and(|j| t.labels.get("job").map(String::as_str) != Some(j))
            || wanted.iter().any(|(k, v)| t.labels.get(k) != Some(v))
        {
            continue;
        }
        let mut labels = t.labels;
        labels.remove("job");
        labels.retain(|k, _| !k.starts_with("__"));
        match TargetSpec::new(
            &t.scrape_url,
            None,
            defaults.interval,
            defaults.timeout,
            labels,
            format!("prometheus:{url}"),
        ) {
            Ok(spec) => out.push(spec),
            Err(e) => skipped.push(format!("{}: {e}", t.scrape_url)),
        }
    }
    if !skipped.is_empty() {
        tracing::warn!(prometheus = url, skipped = ?skipped, "prometheus_targets: targets left out");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prometheus_answer_gives_its_picked_targets() {
        let body = r#"{"status":"success","data":{"activeTargets":[
            {"discoveredLabels":{"__address__":"10.0.0.1:8000"},"labels":{"instance":"vllm-0","job":"vllm","namespace":"serving"},"scrapePool":"vllm","scrapeUrl":"http://10.0.0.1:8000/metrics","health":"up"},
            {"discoveredLabels":{},"labels":{"instance":"vllm-1","job":"vllm","namespace":"staging"},"scrapePool":"vllm","scrapeUrl":"http://10.0.0.2:8000/metrics","health":"up"},
            {"discoveredLabels":{},"labels":{"instance":"node","job":"node"},"scrapePool":"node","scrapeUrl":"http://10.0.0.3:9100/metrics","health":"up"},
            {"discoveredLabels":{},"labels":{"instance":"tls","job":"vllm","namespace":"serving"},"scrapePool":"vllm","scrapeUrl":"https://10.0.0.4:8443/metrics","health":"up"}
        ],"droppedTargets":[]}}"#;
        let d = Defaults {
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(3),
        };
        let wanted = BTreeMap::from([("namespace".to_string(), "serving".to_string())]);
        let answer: TargetsAnswer = serde_json::from_str(body).unwrap();
        let t = prometheus_targets(answer, Some("vllm"), &wanted, "http://prom:9090", d);
        assert_eq!(t.len(), 1, "{t:?}");
        assert_eq!(t[0].url, "http://10.0.0.1:8000/metrics");
        assert_eq!(t[0].instance(), "vllm-0");
        assert!(!t[0].labels.contains_key("job"));
        assert_eq!(t[0].origin, "prometheus:http://prom:9090");
        let answer: TargetsAnswer = serde_json::from_str(body).unwrap();
        let all = prometheus_targets(answer, None, &BTreeMap::new(), "p", d);
        assert_eq!(all.len(), 3, "the https target is left out: {all:?}");
    }

    #[test]
    fn endpoints_are_plain_http_urls() {
        assert!(PolledEndpoint::new("http://127.0.0.1:9000/sd").is_ok());
        for bad in [
            "https://sd.example/targets",
            "sd.example/targets",
            "http:///x",
            "::",
        ] {
            let e = PolledEndpoint::new(bad).unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
    }
}
