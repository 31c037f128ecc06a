// Alert delivery to Alertmanager (API v2) and plain webhooks: the configuration, and the
// `Notifier` the engine calls on every state change — never blocking, never failing evaluation.

//! # Alertmanager
//! `POST {base}/api/v2/alerts` with a JSON array of `{labels, annotations, startsAt, endsAt,
//! generatorURL}`. Labels: the alert's labels (names sanitised to `[a-zA-Z_][a-zA-Z0-9_]*`,
//! empty values left out) plus `alertname` (the rule), `severity`, `grade` when graded, and
//! `incident_id` — the grouping key: with `group_by: ['incident_id']` in the Alertmanager route,
//! every alert of one incident (a GPU leak and the latency it causes) is one notification group.
//! Annotations: the alert's annotations (`summary`, `description`, `runbook_url` when its rule
//! has one …) plus `tokenwatch_alert_id`, `tokenwatch_url` (the alert's page in the UI),
//! `root_cause` (the top-ranked cause as one line) and `snapshot` (URL of the snapshot archive)
//! when present. A firing alert is
//! sent with `endsAt` = now + 4 × `resend_interval` and re-sent every `resend_interval`, so
//! Alertmanager expires it by itself if tokenwatch stops; a resolved alert is sent once (with
//! retries) with `endsAt` = its resolution time. Pending alerts are not sent to Alertmanager.
//!
//! # Webhooks
//! `POST {url}` with `Content-Type: application/json`, the configured headers, and this body, one
//! alert per request, on each change of the alert's state (and when its snapshot link appears):
//!
//! ```json
//! {
//!   "version": "1",
//!   "status": "pending" | "firing" | "resolved",
//!   "alert": { ...the Alert as served by GET /api/v1/alerts/{id}: id, fingerprint, rule, labels,
//!              annotations, severity, grade, state, active_at_unix_ms, fired_at_unix_ms,
//!              resolved_at_unix_ms, last_event, root_cause, incident_id, snapshot... },
//!   "url": "http://tokenwatch.example:9464/#/alerts/…",   // the alert's page in the UI
//!   "sent_at": "2026-01-01T12:00:00.000Z"
//! }
//! ```
//! Any 2xx answer is success; connection errors, timeouts, 429 and 5xx are retried with
//! exponential backoff (`initial_backoff`, doubling, at most 10 s, `max_retries` retries); other
//! answers are not retried. Each receiver has its own task and bounded queue: a full queue drops
//! the notification (counted in `tokenwatch_alert_notifications{outcome="dropped"}`). At
//! shutdown, what is queued gets one short attempt each (until one fails).
//!
//! # TLS
//! `https://` receivers are reached with rustls, trusting the system's roots plus the CA file of
//! `alertmanager_tls` (every Alertmanager) or of the webhook's own `tls`; `server_name`
//! overrides the name checked against the certificate.

mod chat;
mod metrics;
mod payload;
mod worker;

pub use chat::WebhookFormat;

use crate::kernel::delivery::{self, HttpClient, RetryPolicy};
use crate::kernel::duration::HumanDuration;
use crate::kernel::telemetry::Metrics;
use crate::kernel::tls::{UpstreamTls, UpstreamTlsConfig};
use metrics::DeliveryMetrics;
use payload::RenderOptions;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokenwatch_core::alert::{Alert, AlertState};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use worker::{Job, Kind, Worker};

/// One webhook receiver.
#[derive(
    Debug, Clone, PartialEq, Eq, Deserialize, Default, schemars::JsonSchema, serde::Serialize,
)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// `http://` or `https://` URL the body is POSTed to.
    pub url: String,
    /// Extra request headers, e.g. `Authorization`.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// TLS to an `https://` URL: a CA file trusted besides the system's roots, a server name.
    #[serde(default)]
    pub tls: Option<UpstreamTlsConfig>,
    /// The body: `tokenwatch` (documented above, every state change), `slack`, `teams` or
    /// `pagerduty` (firing and resolved only; see `chat`).
    #[serde(default)]
    pub format: WebhookFormat,
    /// PagerDuty's integration (routing) key, required with `format: pagerduty` (write
    /// `${PAGERDUTY_ROUTING_KEY}` to keep it out of the file).
    #[serde(default)]
    pub routing_key: Option<String>,
}

/// Where and how alerts are delivered.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeliveryConfig {
    /// Alertmanager base URLs, e.g. `http://127.0.0.1:9093` or `https://am.example:9093` (the
    /// API path is appended).
    pub alertmanagers: Vec<String>,
    /// TLS to `https://` Alertmanagers: a CA file trusted besides the system's roots, a server
    /// name.
    pub alertmanager_tls: Option<UpstreamTlsConfig>,
    pub webhooks: Vec<WebhookConfig>,
    /// Firing alerts are re-sent to Alertmanager this often.
    pub resend_interval: HumanDuration,
    /// Notifications waiting per receiver; beyond it new ones are dropped and counted.
    pub queue_capacity: usize,
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// Wait before the first retry; doubles each retry, at most 10 s.
    pub initial_backoff: HumanDuration,
    /// Per-attempt limit (connect, send and answer).
    pub timeout: HumanDuration,
    /// Base URL of tokenwatch's API as receivers should reach it (`generatorURL`, snapshot
    /// links). Empty: `http://<listen address>` (see [`DeliveryConfig::resolve_external_url`]).
    pub external_url: String,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            alertmanagers: Vec::new(),
            alertmanager_tls: None,
            webhooks: Vec::new(),
            resend_interval: HumanDuration(Duration::from_secs(30)),
            queue_capacity: 1024,
            max_retries: 5,
            initial_backoff: HumanDuration(Duration::from_millis(200)),
            timeout: HumanDuration(Duration::from_secs(5)),
            external_url: String::new(),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DeliveryConfigError {
    #[error("{what}: invalid URL {url:?}: {reason}")]
    Url {
        what: String,
        url: String,
        reason: String,
    },
    #[error("{what}: invalid header {name:?}: {reason}")]
    Header {
        what: String,
        name: String,
        reason: String,
    },
    #[error("{field} must be greater than zero")]
    Zero { field: &'static str },
    #[error("{what}: {reason}")]
    Tls { what: String, reason: String },
    #[error("{what}: {reason}")]
    Format { what: String, reason: String },
}

fn parse_http_url(what: &str, url: &str) -> Result<http::Uri, DeliveryConfigError> {
    let err = |reason: &str| DeliveryConfigError::Url {
        what: what.into(),
        url: url.into(),
        reason: reason.into(),
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| err(&e.to_string()))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(err("expected an http:// or https:// URL"));
    }
    if uri.authority().is_none() {
        return Err(err("no host"));
    }
    Ok(uri)
}

/// The client for a receiver at `uri`: plain for http://, TLS (system roots plus `tls`'s CA
/// file) for https://. `tls` on an http:// URL is a mistake worth refusing.
fn client_for(
    what: &str,
    uri: &http::Uri,
    tls: Option<&UpstreamTlsConfig>,
    connect_timeout: Duration,
) -> Result<HttpClient, DeliveryConfigError> {
    let tls_err = |key: &str, reason: String| DeliveryConfigError::Tls {
        what: if key.is_empty() {
            format!("{what}.tls")
        } else {
            format!("{what}.tls.{key}")
        },
        reason,
    };
    if uri.scheme_str() != Some("https") {
        if tls.is_some() {
            return Err(tls_err("", "tls applies to https:// URLs only".into()));
        }
        return Ok(HttpClient::new(None, connect_timeout));
    }
    let setup = UpstreamTls::new(tls).map_err(|e| tls_err(e.key(), e.to_string()))?;
    Ok(HttpClient::new(Some(&setup), connect_timeout))
}

fn parse_headers(
    what: &str,
    h: &BTreeMap<String, String>,
) -> Result<Vec<(http::HeaderName, http::HeaderValue)>, DeliveryConfigError> {
    h.iter()
        .map(|(k, v)| {
            let err = |reason: String| DeliveryConfigError::Header {
                what: what.into(),
                name: k.clone(),
                reason,
            };
            let name =
                http::HeaderName::from_bytes(k.as_bytes()).map_err(|e| err(e.to_string()))?;
            let value = http::HeaderValue::from_str(v).map_err(|e| err(e.to_string()))?;
            Ok((name, value))
        })
        .collect()
}

impl DeliveryConfig {
    /// Check every URL and header; errors name the receiver (`alertmanagers[0]`, `webhooks[1]`).
    pub fn validate(&self) -> Result<(), DeliveryConfigError> {
        self.receivers().map(|_| ())?;
        if self.resend_interval.0.is_zero() {
            return Err(DeliveryConfigError::Zero {
                field: "resend_interval",
            });
        }
        if self.queue_capacity == 0 {
            return Err(DeliveryConfigError::Zero {
                field: "queue_capacity",
            });
        }
        if self.timeout.0.is_zero() {
            return Err(DeliveryConfigError::Zero { field: "timeout" });
        }
        Ok(())
    }

    /// Each attempt's limit (the default where the configured one is zero).
    fn attempt_timeout(&self) -> Duration {
        if self.timeout.0.is_zero() {
            Duration::from_secs(5)
        } else {
            self.timeout.0
        }
    }

    /// Fill an empty `external_url` with `http://<listen>` and drop a trailing slash.
    pub fn resolve_external_url(&mut self, listen: SocketAddr) {
        if self.external_url.trim().is_empty() {
            self.external_url = format!("http://{listen}");
        }
        while self.external_url.ends_with('/') {
            self.external_url.pop();
        }
    }

    /// (metrics name, kind, endpoint, client) of each receiver, in configuration order; each
    /// attempt (connect included) is limited to `timeout`.
    fn receivers(&self) -> Result<Vec<(String, Kind, http::Uri, HttpClient)>, DeliveryConfigError> {
        let timeout = self.attempt_timeout();
        let mut out = Vec::new();
        let mut names: HashMap<String, usize> = HashMap::new();
        let mut name_of = |kind: &str, uri: &http::Uri| {
            // Only scheme-less authority: webhook paths often carry secrets.
            let base = format!(
                "{kind}:{}",
                uri.authority().map(|a| a.as_str()).unwrap_or("")
            );
            let n = names.entry(base.clone()).or_insert(0);
            *n += 1;
            if *n == 1 { base } else { format!("{base}#{n}") }
        };
        for (i, base) in self.alertmanagers.iter().enumerate() {
            let what = format!("alertmanagers[{i}]");
            let endpoint = format!("{}/api/v2/alerts", base.trim_end_matches('/'));
            let uri = parse_http_url(&what, &endpoint).map_err(|e| match e {
                DeliveryConfigError::Url { what, reason, .. } => DeliveryConfigError::Url {
                    what,
                    url: base.clone(),
                    reason,
                },
                other => other,
            })?;
            let client =
                client_for(&what, &uri, self.alertmanager_tls.as_ref(), timeout).map_err(|e| {
                    match e {
                        DeliveryConfigError::Tls { reason, what: w } => DeliveryConfigError::Tls {
                            what: w.replace(&format!("{what}.tls"), "alertmanager_tls"),
                            reason: format!("{what}: {reason}"),
                        },
                        other => other,
                    }
                })?;
            out.push((
                name_of("alertmanager", &uri),
                Kind::Alertmanager,
                uri,
                client,
            ));
        }
        for (i, w) in self.webhooks.iter().enumerate() {
            let what = format!("webhooks[{i}]");
            let uri = parse_http_url(&what, &w.url)?;
            let headers = parse_headers(&what, &w.headers)?;
            let routing_key = w.routing_key.clone().unwrap_or_default();
            match (w.format, routing_key.trim().is_empty()) {
                (WebhookFormat::Pagerduty, true) => {
                    return Err(DeliveryConfigError::Format {
                        what: format!("{what}.routing_key"),
                        reason: "format: pagerduty needs the integration's routing key".into(),
                    });
                }
                (WebhookFormat::Pagerduty, false) | (_, true) => {}
                (_, false) => {
                    return Err(DeliveryConfigError::Format {
                        what: format!("{what}.routing_key"),
                        reason: "only format: pagerduty takes a routing key".into(),
                    });
                }
            }
            let client = client_for(&what, &uri, w.tls.as_ref(), timeout)?;
            out.push((
                name_of("webhook", &uri),
                Kind::Webhook {
                    headers,
                    format: w.format,
                    routing_key,
                },
                uri,
                client,
            ));
        }
        Ok(out)
    }
}

struct Receiver {
    name: String,
    is_alertmanager: bool,
    /// A webhook of a chat or paging format: told of state changes only (not of a snapshot
    /// link appearing, which would repeat the message).
    states_only: bool,
    tx: mpsc::Sender<Job>,
}

/// What was last sent to webhooks for one alert: its state and whether it had a snapshot link.
type WebhookKey = (AlertState, bool);

struct Inner {
    receivers: Vec<Receiver>,
    /// Firing alerts by id, re-sent to Alertmanager every `resend_interval`.
    firing: Mutex<HashMap<String, Arc<Alert>>>,
    /// Last webhook notification per alert id, so repeated `notify` calls do not repeat it.
    webhook_sent: Mutex<HashMap<String, WebhookKey>>,
    metrics: DeliveryMetrics,
}

/// Delivers alerts to every configured receiver. Cheap to clone.
#[derive(Clone)]
pub struct Notifier {
    inner: Arc<Inner>,
}

impl Notifier {
    /// Start one task per receiver (and one re-send task when Alertmanagers are configured).
    /// Receivers whose URL or headers are invalid are logged and left out: call
    /// [`DeliveryConfig::validate`] first to refuse such a configuration.
    pub fn start(
        cfg: DeliveryConfig,
        metrics: Arc<Metrics>,
        shutdown: watch::Receiver<bool>,
    ) -> (Notifier, Vec<JoinHandle<()>>) {
        let dm = DeliveryMetrics::register(&metrics);
        let mut cfg = cfg;
        if cfg.external_url.trim().is_empty() {
            cfg.resolve_external_url(SocketAddr::from(([127, 0, 0, 1], 9464)));
        }
        let resend = if cfg.resend_interval.0.is_zero() {
            Duration::from_secs(30)
        } else {
            cfg.resend_interval.0
        };
        let timeout = cfg.attempt_timeout();
        let render = RenderOptions {
            external_url: cfg.external_url.trim_end_matches('/').to_string(),
            firing_ttl_ms: 4 * resend.as_millis() as i64,
        };
        let receivers = match cfg.receivers() {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "alert delivery disabled: invalid receiver configuration");
                Vec::new()
            }
        };
        let policy = RetryPolicy {
            min_backoff: cfg.initial_backoff.0,
            max_backoff: worker::MAX_BACKOFF,
            max_retries: Some(cfg.max_retries),
        };
        let mut tasks = Vec::new();
        let mut handles = Vec::new();
        for (name, kind, endpoint, client) in receivers {
            dm.init_receiver(&name);
            let (tx, rx) = mpsc::channel(cfg.queue_capacity.max(1));
            let is_alertmanager = matches!(kind, Kind::Alertmanager);
            let states_only = matches!(&kind, Kind::Webhook { format, .. } if *format != WebhookFormat::Tokenwatch);
            let w = Worker {
                name: name.clone(),
                kind,
                endpoint,
                client,
                render: render.clone(),
                metrics: dm.clone(),
                timeout,
                delivery: delivery::Endpoint::new(
                    "alert notification",
                    name.clone(),
                    "tokenwatch_alert_notifications_total{outcome=\"failed\"}",
                )
                .with_policy(policy),
            };
            tasks.push(tokio::spawn(w.run(rx, shutdown.clone())));
            handles.push(Receiver {
                name,
                is_alertmanager,
                states_only,
                tx,
            });
        }
        let has_am = handles.iter().any(|r| r.is_alertmanager);
        let notifier = Notifier {
            inner: Arc::new(Inner {
                receivers: handles,
                firing: Mutex::new(HashMap::new()),
                webhook_sent: Mutex::new(HashMap::new()),
                metrics: dm,
            }),
        };
        if has_am {
            tasks.push(tokio::spawn(notifier.clone().resend_loop(resend, shutdown)));
        }
        (notifier, tasks)
    }

    /// Called by the engine on every state change and whenever it wants a re-send; never
    /// blocks, never fails evaluation: when the bounded queue is full the notification is
    /// dropped and counted.
    pub fn notify(&self, alert: &Alert) {
        let inner = &self.inner;
        if inner.receivers.is_empty() {
            return;
        }
        let shared = Arc::new(alert.clone());
        // Alertmanager: every firing change goes out at once; an unchanged firing alert is left
        // to the re-send loop; resolved goes out once if the alert ever fired.
        let to_am = {
            let mut firing = inner.firing.lock().unwrap_or_else(|p| p.into_inner());
            match alert.state {
                AlertState::Firing => {
                    let changed = firing
                        .get(&alert.id)
                        .is_none_or(|old| am_view_changed(old, alert));
                    firing.insert(alert.id.clone(), shared.clone());
                    changed
                }
                AlertState::Resolved => {
                    let was_firing = firing.remove(&alert.id).is_some();
                    was_firing || alert.fired_at_unix_ms.is_some()
                }
                AlertState::Pending => {
                    firing.remove(&alert.id);
                    false
                }
            }
        };
        let (to_webhooks, state_changed) = {
            let mut sent = inner.webhook_sent.lock().unwrap_or_else(|p| p.into_inner());
            let key = (alert.state, alert.snapshot.is_some());
            let before = sent.get(&alert.id).copied();
            if alert.state == AlertState::Resolved {
                sent.remove(&alert.id);
            } else {
                sent.insert(alert.id.clone(), key);
            }
            (
                before != Some(key),
                before.map(|k| k.0) != Some(alert.state),
            )
        };
        for r in &inner.receivers {
            let send = if r.is_alertmanager {
                to_am
            } else if r.states_only {
                state_changed
            } else {
                to_webhooks
            };
            if send {
                self.enqueue(r, vec![shared.clone()]);
            }
        }
    }

    /// An alert restored after a restart: remembered as already announced (Alertmanager's
    /// re-send loop keeps sending a firing one with its original `startsAt`), sending nothing now,
    /// so a restored firing alert is not announced again as new.
    pub fn restore(&self, alert: &Alert) {
        let inner = &self.inner;
        if alert.state == AlertState::Firing {
            let mut firing = inner.firing.lock().unwrap_or_else(|p| p.into_inner());
            firing.insert(alert.id.clone(), Arc::new(alert.clone()));
        }
        if alert.state != AlertState::Resolved {
            let mut sent = inner.webhook_sent.lock().unwrap_or_else(|p| p.into_inner());
            sent.insert(alert.id.clone(), (alert.state, alert.snapshot.is_some()));
        }
    }

    /// Names of the receivers as they appear in the `receiver` label of the metrics.
    pub fn receiver_names(&self) -> Vec<String> {
        self.inner
            .receivers
            .iter()
            .map(|r| r.name.clone())
            .collect()
    }

    fn enqueue(&self, r: &Receiver, alerts: Vec<Arc<Alert>>) {
        let n = alerts.len() as u64;
        // Counted before sending, so the worker's decrement can never come first.
        let depth = self.inner.metrics.depth(&r.name);
        depth.inc();
        if let Err(e) = r.tx.try_send(Job {
            alerts,
            enqueued: Instant::now(),
        }) {
            depth.dec();
            self.inner.metrics.outcome(&r.name, "dropped").inc_by(n);
            tracing::warn!(receiver = %r.name, reason = %e, "alert notification dropped");
        }
    }

    async fn resend_loop(self, every: Duration, mut shutdown: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = delivery::stopped(&mut shutdown) => return,
            }
            let alerts: Vec<Arc<Alert>> = {
                let firing = self.inner.firing.lock().unwrap_or_else(|p| p.into_inner());
                firing.values().cloned().collect()
            };
            if alerts.is_empty() {
                continue;
            }
            for r in self.inner.receivers.iter().filter(|r| r.is_alertmanager) {
                for chunk in alerts.chunks(500) {
                    self.enqueue(r, chunk.to_vec());
                }
            }
        }
    }
}

/// Whether Alertmanager's view of a firing alert differs (labels, annotations, links).
fn am_view_changed(old: &Alert, new: &Alert) -> bool {
    old.labels != new.labels
        || old.annotations != new.annotations
        || old.severity != new.severity
        || old.grade != new.grade
        || old.snapshot != new.snapshot
        || old.fired_at_unix_ms != new.fired_at_unix_ms
        || old.root_cause.first().map(|c| (&c.path, &c.summary))
            != new.root_cause.first().map(|c| (&c.path, &c.summary))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_and_yaml() {
        let d = DeliveryConfig::default();
        assert_eq!(d.resend_interval.0, Duration::from_secs(30));
        assert_eq!(d.queue_capacity, 1024);
        assert_eq!(d.max_retries, 5);
        let c: DeliveryConfig = serde_saphyr::from_str(
            "alertmanagers: [\"http://127.0.0.1:9093/\"]\nwebhooks:\n  - url: http://127.0.0.1:1/hook\n    headers: {Authorization: Bearer x}\nresend_interval: 10s\n",
        )
        .unwrap();
        assert_eq!(c.resend_interval.0, Duration::from_secs(10));
        c.validate().unwrap();
        let r = c.receivers().unwrap();
        assert_eq!(r[0].0, "alertmanager:127.0.0.1:9093");
        assert_eq!(r[0].2.to_string(), "http://127.0.0.1:9093/api/v2/alerts");
        assert_eq!(r[1].0, "webhook:127.0.0.1:1");
        assert!(serde_saphyr::from_str::<DeliveryConfig>("bogus: 1\n").is_err());
    }

    #[test]
    fn invalid_receivers_are_named() {
        let c = DeliveryConfig {
            alertmanagers: vec!["ftp://am".into()],
            ..Default::default()
        };
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("alertmanagers[0]") && e.contains("https://"),
            "{e}"
        );
        // https is reached with TLS; a CA file that cannot be read is named by its key.
        let missing = Some(UpstreamTlsConfig {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..Default::default()
        });
        let c = DeliveryConfig {
            alertmanagers: vec!["https://am:9093".into()],
            alertmanager_tls: missing.clone(),
            ..Default::default()
        };
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.starts_with("alertmanager_tls.ca_file: alertmanagers[0]: cannot read the CA file"),
            "{e}"
        );
        let c = DeliveryConfig {
            webhooks: vec![WebhookConfig {
                url: "https://hooks.example/x".into(),
                tls: missing,
                ..Default::default()
            }],
            ..Default::default()
        };
        let e = c.validate().unwrap_err().to_string();
        assert!(e.starts_with("webhooks[0].tls.ca_file: cannot read"), "{e}");
        // tls on an http:// receiver is a mistake, not ignored.
        let c = DeliveryConfig {
            webhooks: vec![WebhookConfig {
                url: "http://hooks.example/x".into(),
                tls: Some(UpstreamTlsConfig::default()),
                ..Default::default()
            }],
            ..Default::default()
        };
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.starts_with("webhooks[0].tls: tls applies to https://"),
            "{e}"
        );
        // With the system's roots alone, https receivers are valid.
        let c = DeliveryConfig {
            alertmanagers: vec!["https://am:9093".into()],
            webhooks: vec![WebhookConfig {
                url: "https://hooks.example/x".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        c.validate().unwrap();
        let c = DeliveryConfig {
            webhooks: vec![WebhookConfig {
                url: "http://h/x".into(),
                headers: [("bad header".into(), "v".into())].into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("webhooks[0]")
        );
        // PagerDuty needs its routing key, and only PagerDuty takes one.
        for (format, key, want) in [
            (
                WebhookFormat::Pagerduty,
                None,
                Some("needs the integration's routing key"),
            ),
            (
                WebhookFormat::Slack,
                Some("k"),
                Some("only format: pagerduty"),
            ),
            (WebhookFormat::Pagerduty, Some("k"), None),
            (WebhookFormat::Teams, None, None),
        ] {
            let c = DeliveryConfig {
                webhooks: vec![WebhookConfig {
                    url: "https://events.example/v2/enqueue".into(),
                    format,
                    routing_key: key.map(str::to_string),
                    ..Default::default()
                }],
                ..Default::default()
            };
            match (c.validate(), want) {
                (Ok(()), None) => {}
                (Err(e), Some(w)) => {
                    let e = e.to_string();
                    assert!(
                        e.starts_with("webhooks[0].routing_key: ") && e.contains(w),
                        "{e}"
                    );
                }
                (got, want) => panic!("{format:?} {key:?}: {got:?}, want {want:?}"),
            }
        }
        let c = DeliveryConfig {
            webhooks: vec![WebhookConfig {
                url: "nope".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(c.validate().is_err());
    }

    #[test]
    fn duplicate_receivers_get_distinct_names() {
        let c = DeliveryConfig {
            webhooks: vec![
                WebhookConfig {
                    url: "http://h:1/a".into(),
                    ..Default::default()
                },
                WebhookConfig {
                    url: "http://h:1/b".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let names: Vec<String> = c.receivers().unwrap().into_iter().map(|r| r.0).collect();
        assert_eq!(names, vec!["webhook:h:1", "webhook:h:1#2"]);
    }

    #[test]
    fn external_url_resolution() {
        let mut c = DeliveryConfig::default();
        c.resolve_external_url("127.0.0.1:9464".parse().unwrap());
        assert_eq!(c.external_url, "http://127.0.0.1:9464");
        let mut c = DeliveryConfig {
            external_url: "https://tw.example/".into(),
            ..Default::default()
        };
        c.resolve_external_url("127.0.0.1:9464".parse().unwrap());
        assert_eq!(c.external_url, "https://tw.example");
    }
}
