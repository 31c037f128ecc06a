// Alert lifecycle: pending → firing (after `for`) → resolved (condition absent for the resolve
// delay and N clean evaluations), keyed by fingerprint = hash(rule + group labels).

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use tokenwatch_core::alert::{Alert, AlertState, AnomalyEvent, Severity};

/// Fingerprint: hex of SHA-256 over the rule name and the sorted group labels (16 chars).
pub fn fingerprint(rule: &str, labels: &BTreeMap<String, String>) -> String {
    let mut h = Sha256::new();
    h.update(rule.as_bytes());
    for (k, v) in labels {
        h.update([0u8]);
        h.update(k.as_bytes());
        h.update([1u8]);
        h.update(v.as_bytes());
    }
    hex::encode(&h.finalize()[..8])
}

/// Labels every alert carries beside its group labels: the rule's name and its severity.
pub const ALERTNAME_LABEL: &str = "alertname";
pub const SEVERITY_LABEL: &str = "severity";

/// An alert's labels without the two the engine adds: the labels its events were grouped by.
pub fn grouping_labels(alert: &Alert) -> impl Iterator<Item = (&String, &String)> {
    alert
        .labels
        .iter()
        .filter(|(k, _)| k.as_str() != ALERTNAME_LABEL && k.as_str() != SEVERITY_LABEL)
}

/// Group labels of an event: its labels projected on `group_by` (missing ones left out).
pub fn group_labels(event: &AnomalyEvent, group_by: &[String]) -> BTreeMap<String, String> {
    group_by
        .iter()
        .filter_map(|k| event.labels.get(k).map(|v| (k.clone(), v.clone())))
        .collect()
}

/// One tracked alert and its clean-evaluation bookkeeping.
#[derive(Debug, Clone)]
pub struct Tracked {
    pub alert: Alert,
    pub rule_index: usize,
    pub last_true_ms: i64,
    pub clean_evaluations: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Became pending (condition first true, `for` not yet elapsed).
    Pending,
    Fired,
    Resolved,
    /// A pending alert whose condition went away before `for` elapsed: forgotten.
    Dropped,
}

pub struct Timing {
    pub for_ms: i64,
    pub resolve_after_ms: i64,
    pub clean_evaluations: u32,
    /// A pending alert survives gaps in its condition up to this long (evaluation runs on
    /// every batch of data, several times a second: one evaluation that misses must not restart
    /// a 2 min `for`); a longer gap drops it.
    pub pending_grace_ms: i64,
}

impl Tracked {
    pub fn new(
        rule: &str,
        rule_index: usize,
        severity: Severity,
        grade: Option<String>,
        labels: BTreeMap<String, String>,
        event: &AnomalyEvent,
        now: i64,
    ) -> Tracked {
        let fp = fingerprint(rule, &labels);
        let mut all = labels.clone();
        all.insert(ALERTNAME_LABEL.into(), rule.to_string());
        all.insert(SEVERITY_LABEL.into(), severity.name().into());
        Tracked {
            alert: Alert {
                id: format!("{fp}-{now}"),
                fingerprint: fp,
                rule: rule.to_string(),
                labels: all,
                annotations: BTreeMap::new(),
                severity,
                grade,
                state: AlertState::Pending,
                active_at_unix_ms: now,
                fired_at_unix_ms: None,
                resolved_at_unix_ms: None,
                last_event: Some(event.clone()),
                root_cause: Vec::new(),
                incident_id: None,
                snapshot: None,
            },
            rule_index,
            last_true_ms: now,
            clean_evaluations: 0,
        }
    }

    /// Advance with this evaluation's outcome (`Some` = condition holds). A new alert starts
    /// pending; call `step` right after creating it so a zero `for` fires at once.
    pub fn step(
        &mut self,
        event: Option<&AnomalyEvent>,
        now: i64,
        t: &Timing,
    ) -> Option<Transition> {
        match (self.alert.state, event) {
            (AlertState::Resolved, _) => None,
            (state, Some(e)) => {
                self.alert.last_event = Some(e.clone());
                self.last_true_ms = now;
                self.clean_evaluations = 0;
                if state == AlertState::Pending && now - self.alert.active_at_unix_ms >= t.for_ms {
                    self.alert.state = AlertState::Firing;
                    self.alert.fired_at_unix_ms = Some(now);
                    return Some(Transition::Fired);
                }
                None
            }
            (AlertState::Pending, None) if now - self.last_true_ms <= t.pending_grace_ms => None,
            (AlertState::Pending, None) => Some(Transition::Dropped),
            (AlertState::Firing, None) => {
                self.clean_evaluations = self.clean_evaluations.saturating_add(1);
                if now - self.last_true_ms >= t.resolve_after_ms
                    && self.clean_evaluations >= t.clean_evaluations
                {
                    self.alert.state = AlertState::Resolved;
                    self.alert.resolved_at_unix_ms = Some(now);
                    return Some(Transition::Resolved);
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev() -> AnomalyEvent {
        AnomalyEvent {
            detector: "d".into(),
            signal: "s".into(),
            labels: BTreeMap::from([
                ("model_id".to_string(), "m".to_string()),
                ("instance".to_string(), "i".to_string()),
            ]),
            score: 2.0,
            at_unix_ms: 0,
            evidence: BTreeMap::new(),
            summary: "x".into(),
        }
    }

    #[test]
    fn fingerprints_are_stable_and_distinct() {
        let e = ev();
        let g = group_labels(&e, &["model_id".to_string()]);
        assert_eq!(g.len(), 1);
        assert_eq!(fingerprint("r", &g), fingerprint("r", &g.clone()));
        assert_ne!(fingerprint("r", &g), fingerprint("r2", &g));
        assert_eq!(fingerprint("r", &g).len(), 16);
    }

    #[test]
    fn pending_firing_resolved_with_for_and_resolve_delay() {
        let t = Timing {
            for_ms: 1000,
            resolve_after_ms: 2000,
            clean_evaluations: 3,
            pending_grace_ms: 0,
        };
        let e = ev();
        let mut a = Tracked::new("r", 0, Severity::Warning, None, BTreeMap::new(), &e, 0);
        assert_eq!(a.step(Some(&e), 0, &t), None);
        assert_eq!(a.alert.state, AlertState::Pending);
        assert_eq!(a.step(Some(&e), 1000, &t), Some(Transition::Fired));
        assert_eq!(a.alert.fired_at_unix_ms, Some(1000));
        // Clean, but not long enough yet; then true again resets.
        assert_eq!(a.step(None, 1500, &t), None);
        assert_eq!(a.step(Some(&e), 1600, &t), None);
        assert_eq!(a.step(None, 2000, &t), None);
        assert_eq!(a.step(None, 3000, &t), None);
        // 2 s clean but only 3rd clean evaluation now → resolves.
        assert_eq!(a.step(None, 3600, &t), Some(Transition::Resolved));
        assert_eq!(a.alert.resolved_at_unix_ms, Some(3600));
        assert_eq!(a.step(Some(&e), 4000, &t), None);
    }

    #[test]
    fn zero_for_fires_at_once_and_pending_drops() {
        let t = Timing {
            for_ms: 0,
            resolve_after_ms: 0,
            clean_evaluations: 1,
            pending_grace_ms: 0,
        };
        let e = ev();
        let mut a = Tracked::new(
            "r",
            0,
            Severity::Critical,
            Some("L2".into()),
            BTreeMap::new(),
            &e,
            5,
        );
        assert_eq!(a.step(Some(&e), 5, &t), Some(Transition::Fired));
        let t2 = Timing {
            for_ms: 10_000,
            ..t
        };
        let mut b = Tracked::new("r", 0, Severity::Critical, None, BTreeMap::new(), &e, 5);
        assert_eq!(b.step(Some(&e), 5, &t2), None);
        assert_eq!(b.step(None, 6, &t2), Some(Transition::Dropped));
    }

    #[test]
    fn pending_survives_short_gaps_only() {
        let t = Timing {
            for_ms: 10_000,
            resolve_after_ms: 0,
            clean_evaluations: 1,
            pending_grace_ms: 3_000,
        };
        let e = ev();
        let mut a = Tracked::new("r", 0, Severity::Warning, None, BTreeMap::new(), &e, 0);
        assert_eq!(a.step(Some(&e), 0, &t), None);
        // A 2.5 s gap keeps it pending, and `for` counts from the first onset.
        assert_eq!(a.step(None, 2_000, &t), None);
        assert_eq!(a.step(Some(&e), 2_500, &t), None);
        assert_eq!(a.step(Some(&e), 10_000, &t), Some(Transition::Fired));
        // A gap longer than the grace drops a pending alert.
        let mut b = Tracked::new("r", 0, Severity::Warning, None, BTreeMap::new(), &e, 0);
        assert_eq!(b.step(Some(&e), 0, &t), None);
        assert_eq!(b.step(None, 3_000, &t), None);
        assert_eq!(b.step(None, 3_001, &t), Some(Transition::Dropped));
    }
}
