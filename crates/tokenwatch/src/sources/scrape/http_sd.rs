// HTTP-based target discovery as Prometheus `http_sd` does it: an endpoint answering 200 with a
// JSON list of `{targets: [host:port], labels: {...}}` groups, polled every refresh interval;
// an endpoint that fails keeps the targets it gave last, and says why in `GET /api/v1/targets`.

use super::file_sd::{self, Defaults, TargetGroup};
use super::target::{HttpClient, ScrapeError, TargetSpec, fetch_accepting};
use std::time::{Duration, Instant};

/// What an http_sd endpoint is asked for (Prometheus sends the same).
const ACCEPT_JSON: &str = "application/json";

/// One polled endpoint: where it is, when it is next due, and what it gave last.
#[derive(Debug)]
pub struct PolledEndpoint {
    pub url: String,
    uri: http::Uri,
    due: Option<Instant>,
    pub targets: Vec<TargetSpec>,
    pub last_error: Option<String>,
    pub loaded_at: Option<chrono::DateTime<chrono::Utc>>,
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
        let uri: http::Uri = url.trim().parse().map_err(|e| format!("{url:?}: {e}"))?;
        if uri.scheme_str() != Some("http") || uri.authority().is_none() {
            return Err(format!(
                "{url:?} is not an http:// URL with a host (https is not supported for discovery yet)"
            ));
        }
        Ok(PolledEndpoint {
            url: url.trim().to_string(),
            uri,
            due: None,
            targets: Vec::new(),
            last_error: None,
            loaded_at: None,
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
        match self.poll(client, defaults, timeout, max_body).await {
            Ok(targets) => {
                if self.last_error.take().is_some() {
                    tracing::info!(url = %self.url, "http_sd: the endpoint answers again");
                }
                self.loaded_at = Some(chrono::Utc::now());
                let changed = targets != self.targets;
                self.targets = targets;
                changed
            }
            Err(e) => {
                let msg = e.to_string();
                if self.last_error.as_deref() != Some(msg.as_str()) {
                    tracing::warn!(error = %msg, "http_sd: keeping the previous targets");
                }
                self.last_error = Some(msg);
                false
            }
        }
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
        let groups: Vec<TargetGroup> =
            serde_json::from_slice(&body).map_err(|e| HttpSdError::Parse {
                url: url.clone(),
                message: e.to_string(),
            })?;
        file_sd::targets_of(groups, &url, "http_sd", defaults).map_err(HttpSdError::Target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
