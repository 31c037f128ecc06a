// Request bodies sent to receivers: the Alertmanager API v2 alert list and the documented
// webhook body, rendered from `Alert`s at send time (so `endsAt`/`sent_at` are fresh).

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use std::collections::BTreeMap;
use tokenwatch_core::alert::{Alert, AlertState};

/// Settings shared by every rendering.
#[derive(Debug, Clone)]
pub(crate) struct RenderOptions {
    /// Base of `generatorURL` and snapshot links, without a trailing slash.
    pub external_url: String,
    /// `endsAt` of a firing alert is now + this (4 × resend interval), so Alertmanager expires
    /// the alert by itself if tokenwatch stops re-sending it.
    pub firing_ttl_ms: i64,
}

/// One element of the `POST /api/v2/alerts` array (Alertmanager's `postableAlert`).
#[derive(Debug, Serialize)]
pub(crate) struct AmAlert {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    #[serde(rename = "startsAt")]
    pub starts_at: String,
    #[serde(rename = "endsAt")]
    pub ends_at: String,
    #[serde(rename = "generatorURL")]
    pub generator_url: String,
}

/// The webhook body (see the `deliver` module documentation for the contract).
#[derive(Debug, Serialize)]
struct WebhookBody<'a> {
    version: &'static str,
    status: &'static str,
    alert: &'a Alert,
    /// The alert's page in tokenwatch's UI.
    url: String,
    sent_at: String,
}

pub(crate) fn rfc3339(unix_ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(unix_ms)
        .unwrap_or_default()
        .to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Alertmanager label and annotation names must match `[a-zA-Z_][a-zA-Z0-9_]*`; one bad name
/// makes it refuse the whole batch, so anything else becomes `_`.
pub(crate) fn sanitize_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

pub(crate) fn alert_url(external_url: &str, id: &str) -> String {
    format!(
        "{external_url}/api/v1/alerts/{}",
        crate::kernel::url::component(id)
    )
}

/// The alert's page in the UI (its hash route), for people following a notification.
pub(crate) fn ui_url(external_url: &str, id: &str) -> String {
    format!(
        "{external_url}/#/alerts/{}",
        crate::kernel::url::component(id)
    )
}

/// One line naming the top-ranked cause: `a → b → c (rank 0.72): summary`.
pub(crate) fn root_cause_line(alert: &Alert) -> Option<String> {
    let top = alert.root_cause.first()?;
    let chain = if top.path.is_empty() {
        top.detector.clone()
    } else {
        top.path.join(" → ")
    };
    let mut line = format!("{chain} (rank {:.2})", top.rank);
    if !top.summary.is_empty() {
        line.push_str(": ");
        line.push_str(&top.summary.replace('\n', " "));
    }
    Some(line)
}

/// The Alertmanager view of one alert, or None when Alertmanager should not hear of it
/// (pending, or resolved without ever having fired).
/// Whether Alertmanager is told about `alert`: not while pending, and a resolved one only if
/// it ever fired.
pub(crate) fn am_sends(alert: &Alert) -> bool {
    match alert.state {
        AlertState::Pending => false,
        AlertState::Firing => true,
        AlertState::Resolved => alert.fired_at_unix_ms.is_some(),
    }
}

pub(crate) fn am_alert(alert: &Alert, opts: &RenderOptions, now_ms: i64) -> Option<AmAlert> {
    if !am_sends(alert) {
        return None;
    }
    let ends_ms = match alert.state {
        AlertState::Firing => now_ms + opts.firing_ttl_ms,
        _ => alert.resolved_at_unix_ms.unwrap_or(now_ms),
    };
    let mut labels: BTreeMap<String, String> = alert
        .labels
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (sanitize_name(k), v.clone()))
        .collect();
    labels.insert("alertname".into(), alert.rule.clone());
    labels.insert("severity".into(), alert.severity.name().into());
    if let Some(g) = alert.grade.as_ref().filter(|g| !g.is_empty()) {
        labels.insert("grade".into(), g.clone());
    }
    // The grouping key: route with `group_by: ['incident_id']` and one incident (a leak and the
    // latency it causes) is one notification group.
    if let Some(i) = alert.incident_id.as_ref().filter(|i| !i.is_empty()) {
        labels.insert("incident_id".into(), i.clone());
    }
    let mut annotations: BTreeMap<String, String> = alert
        .annotations
        .iter()
        .map(|(k, v)| (sanitize_name(k), v.clone()))
        .collect();
    annotations.insert("tokenwatch_alert_id".into(), alert.id.clone());
    annotations.insert(
        "tokenwatch_url".into(),
        ui_url(&opts.external_url, &alert.id),
    );
    if let Some(line) = root_cause_line(alert) {
        annotations.insert("root_cause".into(), line);
    }
    if alert.snapshot.is_some() {
        annotations.insert(
            "snapshot".into(),
            format!("{}/snapshot", alert_url(&opts.external_url, &alert.id)),
        );
    }
    let starts_ms = alert.fired_at_unix_ms.unwrap_or(alert.active_at_unix_ms);
    Some(AmAlert {
        labels,
        annotations,
        starts_at: rfc3339(starts_ms),
        // Alertmanager rejects endsAt before startsAt.
        ends_at: rfc3339(ends_ms.max(starts_ms)),
        generator_url: alert_url(&opts.external_url, &alert.id),
    })
}

/// JSON body of one Alertmanager POST; None when no alert of the batch is for Alertmanager.
pub(crate) fn am_body(
    alerts: &[std::sync::Arc<Alert>],
    opts: &RenderOptions,
    now_ms: i64,
) -> Option<Vec<u8>> {
    let list: Vec<AmAlert> = alerts
        .iter()
        .filter_map(|a| am_alert(a, opts, now_ms))
        .collect();
    if list.is_empty() {
        return None;
    }
    serde_json::to_vec(&list).ok()
}

/// JSON body of one webhook POST (one alert per request).
pub(crate) fn webhook_body(alert: &Alert, opts: &RenderOptions, now_ms: i64) -> Vec<u8> {
    let body = WebhookBody {
        version: "1",
        status: alert.state.name(),
        alert,
        url: ui_url(&opts.external_url, &alert.id),
        sent_at: rfc3339(now_ms),
    };
    serde_json::to_vec(&body).unwrap_or_default()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tokenwatch_core::alert::{CauseCandidate, Severity};

    pub(crate) fn alert(state: AlertState) -> Alert {
        Alert {
            id: "a/1".into(),
            fingerprint: "fp".into(),
            rule: "ttft_p99_spike".into(),
            labels: [
                ("model_id".to_string(), "m1".to_string()),
                ("gen_ai.system".into(), "x".into()),
                ("empty".into(), String::new()),
            ]
            .into_iter()
            .collect(),
            annotations: [("summary".to_string(), "TTFT P99 tripled".to_string())]
                .into_iter()
                .collect(),
            severity: Severity::Critical,
            grade: Some("L2".into()),
            state,
            active_at_unix_ms: 1_700_000_000_000,
            fired_at_unix_ms: Some(1_700_000_060_000),
            resolved_at_unix_ms: (state == AlertState::Resolved).then_some(1_700_000_120_000),
            last_event: None,
            root_cause: vec![CauseCandidate {
                detector: "gpu_memory_leak".into(),
                signal: "gpu_memory_used_bytes".into(),
                labels: BTreeMap::new(),
                confidence: 0.8,
                expected_delay_ms: 1000,
                observed_delay_ms: 1200,
                alignment: 0.9,
                rank: 0.72,
                path: vec![
                    "gpu_memory_leak".into(),
                    "kv_cache_pressure".into(),
                    "latency_spike".into(),
                ],
                summary: "GPU 0 grows 512 MiB/min".into(),
            }],
            incident_id: None,
            snapshot: Some("/data/snapshots/a.json.gz".into()),
        }
    }

    fn opts() -> RenderOptions {
        RenderOptions {
            external_url: "http://127.0.0.1:9464".into(),
            firing_ttl_ms: 120_000,
        }
    }

    #[test]
    fn firing_alert_for_alertmanager() {
        let a = am_alert(&alert(AlertState::Firing), &opts(), 1_700_000_100_000).unwrap();
        assert_eq!(a.labels["alertname"], "ttft_p99_spike");
        assert_eq!(a.labels["severity"], "critical");
        assert_eq!(a.labels["grade"], "L2");
        assert_eq!(a.labels["model_id"], "m1");
        assert!(!a.labels.contains_key("incident_id"), "no incident yet");
        let mut joined = alert(AlertState::Firing);
        joined.incident_id = Some("inc-1-1".into());
        let j = am_alert(&joined, &opts(), 1_700_000_100_000).unwrap();
        assert_eq!(j.labels["incident_id"], "inc-1-1");
        assert_eq!(a.labels["gen_ai_system"], "x");
        assert!(!a.labels.contains_key("empty"));
        assert_eq!(a.annotations["tokenwatch_alert_id"], "a/1");
        assert_eq!(
            a.annotations["tokenwatch_url"],
            "http://127.0.0.1:9464/#/alerts/a%2F1"
        );
        assert_eq!(
            a.annotations["root_cause"],
            "gpu_memory_leak → kv_cache_pressure → latency_spike (rank 0.72): GPU 0 grows 512 MiB/min"
        );
        assert_eq!(
            a.annotations["snapshot"],
            "http://127.0.0.1:9464/api/v1/alerts/a%2F1/snapshot"
        );
        assert_eq!(a.generator_url, "http://127.0.0.1:9464/api/v1/alerts/a%2F1");
        assert_eq!(a.starts_at, "2023-11-14T22:14:20.000Z");
        assert_eq!(a.ends_at, rfc3339(1_700_000_220_000));
    }

    #[test]
    fn resolved_and_pending() {
        let r = am_alert(&alert(AlertState::Resolved), &opts(), 1_700_000_500_000).unwrap();
        assert_eq!(r.ends_at, rfc3339(1_700_000_120_000));
        assert!(am_alert(&alert(AlertState::Pending), &opts(), 0).is_none());
        let mut never_fired = alert(AlertState::Resolved);
        never_fired.fired_at_unix_ms = None;
        assert!(am_alert(&never_fired, &opts(), 0).is_none());
    }

    #[test]
    fn webhook_body_is_documented_shape() {
        let v: serde_json::Value =
            serde_json::from_slice(&webhook_body(&alert(AlertState::Firing), &opts(), 0)).unwrap();
        assert_eq!(v["version"], "1");
        assert_eq!(v["url"], "http://127.0.0.1:9464/#/alerts/a%2F1");
        assert_eq!(v["status"], "firing");
        assert_eq!(v["alert"]["id"], "a/1");
        assert_eq!(v["sent_at"], "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn names_are_sanitized() {
        assert_eq!(sanitize_name("a.b-c"), "a_b_c");
        assert_eq!(sanitize_name("9x"), "_9x");
        assert_eq!(sanitize_name(""), "_");
    }
}
