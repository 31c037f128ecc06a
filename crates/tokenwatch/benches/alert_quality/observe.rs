// What the fleet reported while a scenario ran: every alert tokenwatch fired (polled from its
// API) and the Alertmanager groups each one was delivered into (polled from Alertmanager).

use super::fleet::SERVICE_PREFIX;
use super::procs::{client, get_json, now_ms};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// One alert that reached `firing`, as last seen.
#[derive(Debug, Clone, Default)]
pub struct SeenAlert {
    pub id: String,
    pub rule: String,
    pub detector: String,
    pub severity: String,
    pub labels: BTreeMap<String, String>,
    pub active_at_ms: i64,
    pub fired_at_ms: i64,
    pub resolved_at_ms: Option<i64>,
    pub incident_id: Option<String>,
    /// Detector of the top-ranked root cause, and that cause's labels.
    pub root_cause: Option<(String, BTreeMap<String, String>)>,
}

impl SeenAlert {
    pub fn model(&self) -> Option<&str> {
        self.labels
            .get("model_id")
            .map(String::as_str)
            .filter(|m| !m.is_empty())
    }

    /// The replica the alert names; None for model-level alerts (no instance, or a Service
    /// that stands for all of the model's replicas).
    pub fn instance(&self) -> Option<&str> {
        self.labels
            .get("instance")
            .map(String::as_str)
            .filter(|i| !i.is_empty() && !i.starts_with(SERVICE_PREFIX))
    }

    fn from_json(a: &serde_json::Value) -> Option<SeenAlert> {
        let fired_at_ms = a["fired_at_unix_ms"].as_i64()?;
        let strings = |v: &serde_json::Value| -> BTreeMap<String, String> {
            v.as_object()
                .map(|o| {
                    o.iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                        .collect()
                })
                .unwrap_or_default()
        };
        let top = &a["root_cause"][0];
        Some(SeenAlert {
            id: a["id"].as_str()?.to_string(),
            rule: a["rule"].as_str().unwrap_or_default().to_string(),
            detector: a["last_event"]["detector"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            severity: a["severity"].as_str().unwrap_or_default().to_string(),
            labels: strings(&a["labels"]),
            active_at_ms: a["active_at_unix_ms"].as_i64().unwrap_or(fired_at_ms),
            fired_at_ms,
            resolved_at_ms: a["resolved_at_unix_ms"].as_i64(),
            incident_id: a["incident_id"].as_str().map(str::to_string),
            root_cause: top["detector"]
                .as_str()
                .map(|d| (d.to_string(), strings(&top["labels"]))),
        })
    }
}

#[derive(Debug, Default)]
pub struct Observed {
    /// By alert id.
    pub alerts: BTreeMap<String, SeenAlert>,
    /// Alert id → the Alertmanager group keys (rendered group labels) it was seen in.
    pub groups_of: BTreeMap<String, BTreeSet<String>>,
    /// Every group key Alertmanager showed.
    pub groups: BTreeSet<String>,
    /// Polls that failed (tokenwatch or Alertmanager not answering).
    pub failed_polls: u64,
}

pub type Shared = Arc<Mutex<Observed>>;

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, Observed> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

/// One poll of both; also used for the final look after the load stopped.
pub async fn poll_once(api: SocketAddr, am: SocketAddr, into: &Shared) {
    let c = client();
    let v = get_json(&c, &format!("http://{api}/api/v1/alerts")).await;
    let alerts: Vec<SeenAlert> = v["alerts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(SeenAlert::from_json)
        .collect();
    let g = get_json(&c, &format!("http://{am}/api/v2/alerts/groups")).await;
    let mut o = lock(into);
    if v.is_null() {
        o.failed_polls += 1;
    }
    for a in alerts {
        match o.alerts.get_mut(&a.id) {
            // Keep the first firing time; take the rest (cause, incident, resolution) as updated.
            Some(old) => {
                let fired = old.fired_at_ms.min(a.fired_at_ms);
                *old = SeenAlert {
                    fired_at_ms: fired,
                    ..a
                };
            }
            None => {
                o.alerts.insert(a.id.clone(), a);
            }
        }
    }
    let Some(groups) = g.as_array() else {
        o.failed_polls += 1;
        return;
    };
    for group in groups {
        let key = group["labels"]
            .as_object()
            .map(|l| {
                let parts: Vec<String> = l
                    .iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                    .collect();
                format!("{{{}}}", parts.join(","))
            })
            .unwrap_or_else(|| "{}".into());
        o.groups.insert(key.clone());
        for a in group["alerts"].as_array().into_iter().flatten() {
            if let Some(id) = a["annotations"]["tokenwatch_alert_id"].as_str() {
                o.groups_of
                    .entry(id.to_string())
                    .or_default()
                    .insert(key.clone());
            }
        }
    }
}

/// Poll every `every` until `stop`.
pub fn spawn(
    api: SocketAddr,
    am: SocketAddr,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) -> Shared {
    let shared: Shared = Default::default();
    let s = shared.clone();
    tokio::spawn(async move {
        loop {
            poll_once(api, am, &s).await;
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.wait_for(|v| *v) => return,
            }
        }
    });
    shared
}

/// A copy of what was observed so far.
pub fn snapshot(s: &Shared) -> Observed {
    let o = lock(s);
    Observed {
        alerts: o.alerts.clone(),
        groups_of: o.groups_of.clone(),
        groups: o.groups.clone(),
        failed_polls: o.failed_polls,
    }
}

/// Firing alerts right now (for a test's failure message).
pub fn firing_now(s: &Shared) -> Vec<SeenAlert> {
    let now = now_ms();
    lock(s)
        .alerts
        .values()
        .filter(|a| a.resolved_at_ms.is_none_or(|r| r > now))
        .cloned()
        .collect()
}
