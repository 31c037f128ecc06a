// HTTP client of `tokenwatch top`: GETs `/api/v1/fleet` and `/api/v1/alerts` from a running
// tokenwatch, over plain HTTP or HTTPS (system roots plus `--ca-file`), with connect and
// response timeouts, and turns every failure into a one-line error.

use super::model::{AlertItem, AlertList, Fleet};
use crate::kernel::delivery::HttpClient;
use crate::kernel::tls::{UpstreamTls, UpstreamTlsConfig};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use serde::de::DeserializeOwned;
use std::path::Path;
use std::time::Duration;
use tokenwatch_core::window::Window;

/// Largest API answer accepted (a 1,000-model fleet with sparklines is a few MiB).
const MAX_BODY_BYTES: usize = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid --url {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("cannot reach {url}: {detail}")]
    Unreachable { url: String, detail: String },
    #[error("{url}: no answer within {secs:.1} s")]
    Timeout { url: String, secs: f64 },
    #[error("{url}: HTTP {status}: {message}")]
    Status {
        url: String,
        status: u16,
        message: String,
    },
    #[error("{url}: reading the answer: {detail}")]
    Body { url: String, detail: String },
    #[error("{url}: unexpected answer: {detail}")]
    Json { url: String, detail: String },
    #[error("token (--token-file / TOKENWATCH_TOKEN): {0}")]
    BadToken(String),
    #[error("--ca-file: {0}")]
    Tls(String),
}

/// Reads the API of one tokenwatch (`--url`); cheap to clone into fetch tasks.
#[derive(Clone)]
pub struct ApiClient {
    base: String,
    timeout: Duration,
    /// `Authorization` value (`Bearer …`) when the API needs a `read` token.
    authorization: Option<http::HeaderValue>,
    client: HttpClient,
}

/// An error and the errors that caused it, on one line ("client error (Connect): tcp connect error: …").
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        src = s.source();
    }
    out
}

impl ApiClient {
    /// `url` is the API address of tokenwatch, e.g. `http://127.0.0.1:9464` or
    /// `https://tokenwatch.internal:9464` (a path prefix is kept); an https address is trusted
    /// by the system's roots and the certificates of `ca_file` (PEM).
    pub fn new(
        url: &str,
        timeout: Duration,
        ca_file: Option<&Path>,
    ) -> Result<ApiClient, ClientError> {
        let bad = |reason: &str| ClientError::BadUrl {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let uri: http::Uri = url
            .trim()
            .parse()
            .map_err(|e: http::uri::InvalidUri| bad(&e.to_string()))?;
        let tls = match uri.scheme_str() {
            Some("http") if ca_file.is_some() => {
                return Err(bad("--ca-file is for an https:// address"));
            }
            Some("http") => None,
            Some("https") => Some(
                UpstreamTls::new(Some(&UpstreamTlsConfig {
                    ca_file: ca_file.map(Path::to_path_buf),
                    ..Default::default()
                }))
                .map_err(|e| ClientError::Tls(e.to_string()))?,
            ),
            _ => return Err(bad("expected an address such as http://127.0.0.1:9464")),
        };
        if uri.authority().is_none() {
            return Err(bad("expected an address such as http://127.0.0.1:9464"));
        }
        if uri.query().is_some() {
            return Err(bad("leave out the query string"));
        }
        let client = HttpClient::new(tls.as_ref(), timeout);
        let base = uri.to_string().trim_end_matches('/').to_string();
        Ok(ApiClient {
            base,
            timeout,
            authorization: None,
            client,
        })
    }

    /// Send `token` (a `read` token of the API's `auth.tokens_file`) with every request.
    pub fn with_token(mut self, token: &str) -> Result<ApiClient, ClientError> {
        let mut value =
            http::HeaderValue::from_str(&format!("Bearer {}", token.trim())).map_err(|_| {
                ClientError::BadToken("the token holds characters a header cannot carry".into())
            })?;
        value.set_sensitive(true);
        self.authorization = Some(value);
        Ok(self)
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    pub async fn fleet(&self, window: Window) -> Result<Fleet, ClientError> {
        self.get_json(&format!("/api/v1/fleet?window={}", window.name()))
            .await
    }

    /// Alerts of one model, firing first, then pending, then resolved.
    pub async fn alerts(&self, model: &str) -> Result<Vec<AlertItem>, ClientError> {
        let query = serde_urlencoded::to_string([("model", model)]).unwrap_or_default();
        let mut list: AlertList = self.get_json(&format!("/api/v1/alerts?{query}")).await?;
        list.alerts
            .sort_by_key(|a| (a.order_key(), std::cmp::Reverse(a.active_at_unix_ms)));
        Ok(list.alerts)
    }

    async fn get_json<T: DeserializeOwned>(&self, path_and_query: &str) -> Result<T, ClientError> {
        let url = format!("{}{path_and_query}", self.base);
        let mut req = http::Request::get(&url).header(http::header::ACCEPT, "application/json");
        if let Some(auth) = &self.authorization {
            req = req.header(http::header::AUTHORIZATION, auth.clone());
        }
        let req = req
            .body(Full::new(Bytes::new()))
            .map_err(|e| ClientError::BadUrl {
                url: url.clone(),
                reason: e.to_string(),
            })?;
        let secs = self.timeout.as_secs_f64();
        let work = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| ClientError::Unreachable {
                    url: url.clone(),
                    detail: chain(&e),
                })?;
            let status = resp.status();
            let body = Limited::new(resp.into_body(), MAX_BODY_BYTES)
                .collect()
                .await
                .map_err(|e| ClientError::Body {
                    url: url.clone(),
                    detail: chain(&*e),
                })?
                .to_bytes();
            Ok::<_, ClientError>((status, body))
        };
        let (status, body) = tokio::time::timeout(self.timeout, work)
            .await
            .map_err(|_| ClientError::Timeout {
                url: url.clone(),
                secs,
            })??;
        if !status.is_success() {
            let message = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_string))
                .unwrap_or_else(|| String::from_utf8_lossy(&body).chars().take(200).collect());
            return Err(ClientError::Status {
                url,
                status: status.as_u16(),
                message,
            });
        }
        serde_json::from_slice(&body).map_err(|e| ClientError::Json {
            url,
            detail: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;

    async fn serve(router: axum::Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        format!("http://{addr}")
    }

    #[test]
    fn rejects_urls_it_cannot_use() {
        for bad in [
            "127.0.0.1:9464",
            "ftp://x:1",
            "http://",
            "http://x:1/?a=b",
            "not a url",
        ] {
            let err = ApiClient::new(bad, Duration::from_secs(1), None)
                .err()
                .map(|e| e.to_string());
            assert!(
                err.as_deref()
                    .is_some_and(|e| e.starts_with("invalid --url")),
                "{bad}: {err:?}"
            );
        }
        let ca = std::path::Path::new("/nonexistent/ca.pem");
        let err = ApiClient::new("http://127.0.0.1:9464", Duration::from_secs(1), Some(ca))
            .err()
            .map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("--ca-file is for an https")),
            "{err:?}"
        );
        let err = ApiClient::new("https://127.0.0.1:9464", Duration::from_secs(1), Some(ca))
            .err()
            .map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.starts_with("--ca-file") && e.contains("/nonexistent/ca.pem")),
            "{err:?}"
        );
        assert!(ApiClient::new("https://127.0.0.1:9464", Duration::from_secs(1), None).is_ok());
        let c =
            ApiClient::new("http://127.0.0.1:9464/", Duration::from_secs(1), None).expect("valid");
        assert_eq!(c.base_url(), "http://127.0.0.1:9464");
    }

    #[tokio::test]
    async fn fetches_fleet_and_alerts_and_reports_http_errors() {
        let router = axum::Router::new()
            .route(
                "/api/v1/fleet",
                get(|q: axum::extract::RawQuery| async move {
                    let q = q.0.unwrap_or_default();
                    let w = q.strip_prefix("window=").unwrap_or("?");
                    format!(r#"{{"window":"{w}","models":[{{"model_id":"m","requests_per_s":2.5}}]}}"#)
                }),
            )
            .route(
                "/api/v1/alerts",
                get(|q: axum::extract::RawQuery| async move {
                    assert_eq!(q.0.as_deref(), Some("model=a+b%2Fc"));
                    r#"{"alerts":[{"rule":"r1","state":"resolved","severity":"critical"},{"rule":"r2","state":"firing","severity":"warning"}]}"#
                }),
            )
            .fallback(|| async { (http::StatusCode::NOT_FOUND, r#"{"error":"no such endpoint"}"#) });
        let base = serve(router).await;
        let c = ApiClient::new(&base, Duration::from_secs(5), None).expect("client");
        let fleet = c.fleet(Window::M5).await.expect("fleet");
        assert_eq!(fleet.window, "5m");
        assert_eq!(fleet.models[0].requests_per_s, Some(2.5));
        let alerts = c.alerts("a b/c").await.expect("alerts");
        assert_eq!(
            alerts.iter().map(|a| a.rule.as_str()).collect::<Vec<_>>(),
            ["r2", "r1"],
            "firing first"
        );

        let c404 = ApiClient::new(&format!("{base}/prefix"), Duration::from_secs(5), None)
            .expect("client");
        let err = c404.fleet(Window::M1).await.expect_err("404");
        assert!(
            matches!(err, ClientError::Status { status: 404, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("no such endpoint"), "{err}");
    }

    #[tokio::test]
    async fn sends_the_token_when_given_one() {
        let router = axum::Router::new().route(
            "/api/v1/fleet",
            get(|h: http::HeaderMap| async move {
                match h
                    .get(http::header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                {
                    Some("Bearer s3cret-token-0123456789") => {
                        (http::StatusCode::OK, r#"{"window":"1m","models":[]}"#)
                    }
                    _ => (
                        http::StatusCode::UNAUTHORIZED,
                        r#"{"error":{"type":"unauthorized"}}"#,
                    ),
                }
            }),
        );
        let base = serve(router).await;
        let plain = ApiClient::new(&base, Duration::from_secs(5), None).expect("client");
        let err = plain
            .fleet(Window::M1)
            .await
            .expect_err("401 without a token");
        assert!(
            matches!(err, ClientError::Status { status: 401, .. }),
            "{err}"
        );
        let with = plain
            .with_token(" s3cret-token-0123456789\n")
            .expect("token");
        assert_eq!(with.fleet(Window::M1).await.expect("fleet").window, "1m");
        assert!(
            ApiClient::new(&base, Duration::from_secs(5), None)
                .unwrap()
                .with_token("bad\u{7f}")
                .is_err()
        );
    }

    #[tokio::test]
    async fn connection_refused_and_timeouts_are_errors_not_hangs() {
        let free = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = free.local_addr().expect("addr");
        drop(free);
        let c = ApiClient::new(&format!("http://{addr}"), Duration::from_secs(2), None)
            .expect("client");
        let err = c.fleet(Window::M1).await.expect_err("refused");
        assert!(matches!(err, ClientError::Unreachable { .. }), "{err}");
        assert!(err.to_string().to_lowercase().contains("refused"), "{err}");

        // A server that accepts but never answers.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = silent.local_addr().expect("addr");
        let c = ApiClient::new(&format!("http://{addr}"), Duration::from_millis(300), None)
            .expect("client");
        let err = c.fleet(Window::M1).await.expect_err("timeout");
        assert!(matches!(err, ClientError::Timeout { .. }), "{err}");
        drop(silent);

        let garbage =
            serve(axum::Router::new().route("/api/v1/fleet", get(|| async { "[1,2" }))).await;
        let c = ApiClient::new(&garbage, Duration::from_secs(5), None).expect("client");
        assert!(matches!(
            c.fleet(Window::M1).await,
            Err(ClientError::Json { .. })
        ));
    }
}
