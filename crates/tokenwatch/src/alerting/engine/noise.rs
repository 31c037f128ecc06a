// Noise reduction around the lifecycle: inhibition (a firing cause marks its symptoms, which are
// kept but not delivered) and topology convergence (a firing PCIe-switch alert absorbs its GPUs'
// own alerts), incidents (alerts of one model close in time), and alert metrics.

use crate::alerting::rules::InhibitRule;
use crate::kernel::telemetry::Metrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use std::collections::{BTreeMap, HashMap, HashSet};
use tokenwatch_core::alert::{Alert, AlertState};

/// A firing alert as inhibition sees it.
pub struct Firing<'a> {
    pub rule: &'a str,
    pub detector: &'a str,
    pub alert: &'a Alert,
}

/// Detector whose alerts stand for every GPU behind one PCIe switch.
pub const TOPOLOGY_DETECTOR: &str = "topology_convergence";

/// The first firing alert that inhibits an alert of `rule`/`detector` with `labels`: a cause
/// named by an inhibit rule, or a topology-convergence alert listing this alert's GPU.
pub fn inhibitor<'a>(
    rules: &[InhibitRule],
    rule: &str,
    detector: &str,
    labels: &BTreeMap<String, String>,
    firing: &[Firing<'a>],
) -> Option<&'a Alert> {
    inhibited_by_rule(rules, rule, detector, labels, firing)
        .or_else(|| converged_into(detector, labels, firing))
}

/// A firing topology-convergence alert whose evidence lists the GPU of a per-device alert (the
/// same `device_id`, on the same instance when both say): that alert converges into it.
pub fn converged_into<'a>(
    detector: &str,
    labels: &BTreeMap<String, String>,
    firing: &[Firing<'a>],
) -> Option<&'a Alert> {
    let device = labels.get("device_id").filter(|d| !d.is_empty())?;
    if detector == TOPOLOGY_DETECTOR {
        return None;
    }
    firing
        .iter()
        .filter(|f| f.detector == TOPOLOGY_DETECTOR && f.alert.state == AlertState::Firing)
        .find(|f| {
            let Some(ev) = f.alert.last_event.as_ref() else {
                return false;
            };
            let listed = ev
                .evidence
                .get("devices")
                .and_then(|d| d.as_array())
                .is_some_and(|d| d.iter().any(|x| x.as_str() == Some(device.as_str())));
            let switch_instance = f
                .alert
                .labels
                .get("pci_switch")
                .and_then(|s| s.rsplit_once('/'))
                .map(|(i, _)| i);
            let same_host = match (labels.get("instance"), switch_instance) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            };
            listed && same_host
        })
        .map(|f| f.alert)
}

fn inhibited_by_rule<'a>(
    rules: &[InhibitRule],
    rule: &str,
    detector: &str,
    labels: &BTreeMap<String, String>,
    firing: &[Firing<'a>],
) -> Option<&'a Alert> {
    let names = |list: &[String], r: &str, d: &str| list.iter().any(|n| n == r || n == d);
    for ir in rules.iter().filter(|ir| names(&ir.target, rule, detector)) {
        for f in firing {
            if f.alert.state != AlertState::Firing
                || !names(&ir.source, f.rule, f.detector)
                || f.rule == rule
            {
                continue;
            }
            if ir
                .equal
                .iter()
                .all(|k| labels.get(k) == f.alert.labels.get(k))
            {
                return Some(f.alert);
            }
        }
    }
    None
}

struct Incident {
    /// The model (`model_id` label; "" for alerts without one) the incident started on.
    model: String,
    last_activity_ms: i64,
    alerts: HashSet<String>,
}

/// Incidents: one fault and everything it causes. A newly firing alert joins, in this order,
/// the open incident of an alert its root-cause chain names (a leak and the latency it causes are
/// one incident, whatever labels each carries), else the open incident of its model when that
/// saw activity within `window_ms`, else it opens a new one. The incident id is the
/// Alertmanager grouping key (`incident_id` label), so one incident is one notification group.
pub struct Incidents {
    /// By incident id.
    open: HashMap<String, Incident>,
    window_ms: i64,
    seq: u64,
}

impl Incidents {
    pub fn new(window_ms: i64) -> Incidents {
        Incidents {
            open: HashMap::new(),
            window_ms,
            seq: 0,
        }
    }

    fn model(labels: &BTreeMap<String, String>) -> String {
        labels.get("model_id").cloned().unwrap_or_default()
    }

    /// The incident id for a newly firing alert; `cause_incident` is the incident of the alert
    /// its top-ranked root cause points at, when that one is known.
    pub fn assign(&mut self, alert: &Alert, cause_incident: Option<&str>, now: i64) -> String {
        let window = self.window_ms;
        let model = Self::model(&alert.labels);
        let joined = cause_incident
            .filter(|id| self.open.contains_key(*id))
            .map(str::to_string)
            .or_else(|| {
                self.open
                    .iter()
                    .filter(|(_, i)| i.model == model && now - i.last_activity_ms <= window)
                    .max_by_key(|(_, i)| i.last_activity_ms)
                    .map(|(id, _)| id.clone())
            });
        if let Some(id) = joined
            && let Some(inc) = self.open.get_mut(&id)
        {
            inc.alerts.insert(alert.fingerprint.clone());
            inc.last_activity_ms = inc.last_activity_ms.max(now);
            return id;
        }
        // Named by what opened it (the alert's rule + labels fingerprint) and the incident window
        // it opened in, not by this process: instances sharing Alertmanager and a store that
        // fire the same alert name the same incident (Alertmanager dedups by label set, and
        // `incident_id` is a label). Firings straddling a window boundary still make two.
        let start = if window > 0 {
            now.div_euclid(window) * window
        } else {
            now
        };
        let mut id = format!("inc-{start}-{}", alert.fingerprint);
        if self.open.contains_key(&id) {
            self.seq += 1;
            id = format!("{id}-{}", self.seq);
        }
        self.open.insert(
            id.clone(),
            Incident {
                model,
                last_activity_ms: now,
                alerts: HashSet::from([alert.fingerprint.clone()]),
            },
        );
        id
    }

    /// Re-open the incident of an alert restored after a restart (its id is kept), so alerts
    /// that fire next can still join it.
    pub fn restore(&mut self, alert: &Alert, now: i64) {
        let Some(id) = alert.incident_id.clone() else {
            return;
        };
        let inc = self.open.entry(id).or_insert_with(|| Incident {
            model: Self::model(&alert.labels),
            last_activity_ms: now,
            alerts: HashSet::new(),
        });
        inc.alerts.insert(alert.fingerprint.clone());
        inc.last_activity_ms = inc.last_activity_ms.max(now);
    }

    /// Keep an incident open while one of its alerts is still active.
    pub fn touch(&mut self, alert: &Alert, now: i64) {
        if let Some(inc) = alert
            .incident_id
            .as_deref()
            .and_then(|id| self.open.get_mut(id))
        {
            inc.last_activity_ms = inc.last_activity_ms.max(now);
        }
    }

    /// Close incidents idle for longer than the window; returns each closed one's alert count.
    pub fn close_idle(&mut self, now: i64) -> Vec<usize> {
        let window = self.window_ms;
        let mut closed = Vec::new();
        self.open.retain(|_, i| {
            let keep = now - i.last_activity_ms <= window;
            if !keep {
                closed.push(i.alerts.len());
            }
            keep
        });
        closed
    }

    pub fn open_count(&self) -> usize {
        self.open.len()
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AlertLabels {
    pub rule: String,
    pub severity: String,
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLabels {
    pub rule: String,
}

/// The engine's metrics in `/metrics`.
pub struct AlertMetrics {
    pub alerts: Family<AlertLabels, Gauge>,
    /// Label sets folded into a rule's `__other__` alert (`alerting.max_alerts_per_rule`).
    pub folded: Family<RuleLabels, Counter>,
    pub per_incident: Histogram,
    pub open_incidents: Gauge,
    pub evaluations: Counter,
    pub dropped_records: Counter,
}

impl AlertMetrics {
    pub fn register(m: &Metrics) -> AlertMetrics {
        let a = AlertMetrics {
            alerts: Family::default(),
            folded: Family::default(),
            per_incident: Histogram::new([1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0]),
            open_incidents: Gauge::default(),
            evaluations: Counter::default(),
            dropped_records: Counter::default(),
        };
        m.register(
            "tokenwatch_alerts",
            "Alerts by rule, severity and state (pending, firing, recently resolved)",
            a.alerts.clone(),
        );
        m.register(
            "tokenwatch_alerts_folded",
            "New alert label sets folded into their rule's __other__ alert because the rule had alerting.max_alerts_per_rule active alerts, by rule",
            a.folded.clone(),
        );
        m.register(
            "tokenwatch_alerts_per_incident",
            "Alerts raised per closed incident",
            a.per_incident.clone(),
        );
        m.register(
            "tokenwatch_alert_incidents_open",
            "Incidents with recent alert activity",
            a.open_incidents.clone(),
        );
        m.register(
            "tokenwatch_alert_evaluations",
            "Rule-set evaluations run",
            a.evaluations.clone(),
        );
        m.register(
            "tokenwatch_alerting_dropped_records",
            "Request records the alert engine could not take (its queue was full)",
            a.dropped_records.clone(),
        );
        a
    }

    /// Set the gauge family from the current alerts.
    pub fn set_alerts<'a>(&self, alerts: impl Iterator<Item = &'a Alert>) {
        let mut counts: HashMap<AlertLabels, i64> = HashMap::new();
        for a in alerts {
            let l = AlertLabels {
                rule: a.rule.clone(),
                severity: a.severity.name().into(),
                state: a.state.name().into(),
            };
            *counts.entry(l).or_default() += 1;
        }
        self.alerts.clear();
        for (l, n) in counts {
            self.alerts.get_or_create(&l).set(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alerting::engine::lifecycle::Tracked;
    use tokenwatch_core::alert::{AnomalyEvent, Severity};

    fn alert(rule: &str, model: &str, state: AlertState) -> Alert {
        let e = AnomalyEvent {
            detector: rule.into(),
            signal: "s".into(),
            labels: BTreeMap::new(),
            score: 1.0,
            at_unix_ms: 0,
            evidence: BTreeMap::new(),
            summary: String::new(),
        };
        let labels = BTreeMap::from([("model_id".to_string(), model.to_string())]);
        let mut t = Tracked::new(rule, 0, Severity::Warning, None, labels, &e, 0);
        t.alert.state = state;
        t.alert
    }

    #[test]
    fn cause_inhibits_symptom_on_same_model_only() {
        let rules = crate::alerting::rules::default_inhibit_rules();
        let leak = alert("gpu_memory_leak", "m", AlertState::Firing);
        let firing = [Firing {
            rule: "gpu_memory_leak",
            detector: "gpu_memory_leak",
            alert: &leak,
        }];
        let same = BTreeMap::from([("model_id".to_string(), "m".to_string())]);
        let other = BTreeMap::from([("model_id".to_string(), "x".to_string())]);
        assert!(inhibitor(&rules, "latency_spike", "latency_spike", &same, &firing).is_some());
        assert!(inhibitor(&rules, "latency_spike", "latency_spike", &other, &firing).is_none());
        assert!(inhibitor(&rules, "slo_burn", "slo_burn", &same, &firing).is_none());
        let resolved = alert("gpu_memory_leak", "m", AlertState::Resolved);
        let firing = [Firing {
            rule: "gpu_memory_leak",
            detector: "gpu_memory_leak",
            alert: &resolved,
        }];
        assert!(inhibitor(&rules, "latency_spike", "latency_spike", &same, &firing).is_none());
    }

    #[test]
    fn switch_alert_absorbs_the_alerts_of_its_gpus_only() {
        let mut switch = alert("gpu_switch_saturation", "", AlertState::Firing);
        switch
            .labels
            .insert("pci_switch".into(), "node-a/0000:00-1f".into());
        if let Some(e) = switch.last_event.as_mut() {
            e.evidence.insert(
                "devices".into(),
                serde_json::json!(["GPU-0", "GPU-1", "GPU-2"]),
            );
        }
        let firing = [Firing {
            rule: "gpu_switch_saturation",
            detector: TOPOLOGY_DETECTOR,
            alert: &switch,
        }];
        let leak = |device: &str, instance: &str| {
            BTreeMap::from([
                ("model_id".to_string(), "m".to_string()),
                ("device_id".to_string(), device.to_string()),
                ("instance".to_string(), instance.to_string()),
            ])
        };
        let rules = crate::alerting::rules::default_inhibit_rules();
        let by = |labels: &BTreeMap<String, String>| {
            inhibitor(
                &rules,
                "gpu_memory_leak",
                "gpu_memory_leak",
                labels,
                &firing,
            )
            .map(|a| a.rule.clone())
        };
        assert_eq!(
            by(&leak("GPU-1", "node-a")).as_deref(),
            Some("gpu_switch_saturation")
        );
        assert_eq!(by(&leak("GPU-7", "node-a")), None, "another GPU");
        assert_eq!(by(&leak("GPU-1", "node-b")), None, "another host");
        let model_level = BTreeMap::from([("model_id".to_string(), "m".to_string())]);
        assert_eq!(by(&model_level), None, "not a per-device alert");
        // A pending switch alert absorbs nothing yet.
        let mut pending = switch.clone();
        pending.state = AlertState::Pending;
        let firing = [Firing {
            rule: "gpu_switch_saturation",
            detector: TOPOLOGY_DETECTOR,
            alert: &pending,
        }];
        assert!(converged_into("gpu_memory_leak", &leak("GPU-1", "node-a"), &firing).is_none());
    }

    #[test]
    fn incidents_group_by_model_and_close_when_idle() {
        let mut inc = Incidents::new(1000);
        let a = alert("r1", "m", AlertState::Firing);
        let b = alert("r2", "m", AlertState::Firing);
        let c = alert("r1", "x", AlertState::Firing);
        let ia = inc.assign(&a, None, 0);
        assert_eq!(inc.assign(&b, None, 500), ia);
        assert_ne!(inc.assign(&c, None, 600), ia);
        assert_eq!(inc.open_count(), 2);
        let mut closed = inc.close_idle(1550);
        closed.sort();
        assert_eq!(closed, vec![2]);
        assert_ne!(inc.assign(&a, None, 5000), ia);
    }

    #[test]
    fn a_symptom_joins_the_incident_of_its_cause_whatever_its_labels() {
        let mut inc = Incidents::new(1000);
        // The leak is labelled by device only (dcgm without a model label); the latency symptom
        // by model. Labels alone would make two incidents; the root-cause chain makes one.
        let mut leak = alert("gpu_memory_leak", "", AlertState::Firing);
        leak.labels.insert("device_id".into(), "GPU-0".into());
        let latency = alert("latency_spike", "m", AlertState::Firing);
        let il = inc.assign(&leak, None, 0);
        assert_eq!(inc.assign(&latency, Some(&il), 900), il);
        assert_eq!(inc.open_count(), 1);
        // A cause whose incident has closed does not hold the symptom: it opens its own.
        assert_eq!(inc.close_idle(5000), vec![2]);
        assert_ne!(inc.assign(&latency, Some(&il), 5000), il);
    }

    #[test]
    fn instances_firing_the_same_alert_name_the_same_incident() {
        // Two processes, each with its own incidents, see the same alert fire 40 ms apart.
        let (mut a, mut b) = (Incidents::new(60_000), Incidents::new(60_000));
        let spike = alert("latency_spike", "m", AlertState::Firing);
        let (ia, ib) = (
            a.assign(&spike, None, 120_010),
            b.assign(&spike, None, 120_050),
        );
        assert_eq!(ia, ib);
        assert_eq!(ia, format!("inc-120000-{}", spike.fingerprint));
        // Another alert name, or another window, is another incident.
        let other = alert("latency_spike", "n", AlertState::Firing);
        assert_ne!(b.assign(&other, None, 120_060), ib);
        assert_ne!(Incidents::new(60_000).assign(&spike, None, 180_000), ia);
    }

    #[test]
    fn a_touched_incident_stays_open_past_its_window() {
        let mut inc = Incidents::new(1000);
        let mut a = alert("r1", "m", AlertState::Firing);
        let id = inc.assign(&a, None, 0);
        a.incident_id = Some(id.clone());
        for t in (500..=5000).step_by(500) {
            inc.touch(&a, t);
        }
        assert!(inc.close_idle(5500).is_empty());
        let b = alert("r2", "m", AlertState::Firing);
        assert_eq!(inc.assign(&b, None, 5600), id);
    }
}
