// Alert persistence: the alerts whose state changed go to the store in order, on a writer thread
// of their own (off evaluation), so pending, firing and resolved alerts survive a restart.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;
use tokenwatch_core::alert::{Alert, AlertState};
use tokenwatch_store::Store;

/// An alert whose only change is its evidence (latest event, rendered text) is rewritten at most
/// this often; a state, incident, snapshot or inhibition change is written at once.
pub const EVIDENCE_EVERY_MS: i64 = 10_000;

enum Op {
    Upsert(Vec<Alert>),
    Delete(Vec<String>),
}

/// What decides "changed now" for an alert.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Key {
    state: AlertState,
    fired_at: Option<i64>,
    resolved_at: Option<i64>,
    incident: Option<String>,
    snapshot: Option<String>,
    inhibited_by: Option<String>,
    causes: usize,
}

impl Key {
    /// Whether `a` has this key (compared in place: called for every listed alert on every
    /// publish).
    fn matches(&self, a: &Alert) -> bool {
        self.state == a.state
            && self.fired_at == a.fired_at_unix_ms
            && self.resolved_at == a.resolved_at_unix_ms
            && self.incident == a.incident_id
            && self.snapshot == a.snapshot
            && self.inhibited_by.as_ref() == a.annotations.get("inhibited_by")
            && self.causes == a.root_cause.len()
    }

    fn of(a: &Alert) -> Key {
        Key {
            state: a.state,
            fired_at: a.fired_at_unix_ms,
            resolved_at: a.resolved_at_unix_ms,
            incident: a.incident_id.clone(),
            snapshot: a.snapshot.clone(),
            inhibited_by: a.annotations.get("inhibited_by").cloned(),
            causes: a.root_cause.len(),
        }
    }
}

struct Written {
    key: Key,
    at_ms: i64,
    alert: Alert,
}

/// The engine's record of what it has written, and the writer thread.
pub struct Persist {
    written: HashMap<String, Written>,
    tx: Option<mpsc::Sender<Op>>,
    thread: Option<JoinHandle<()>>,
}

impl Persist {
    /// Start the writer thread (it ends once the `Persist` is finished or dropped and its queue
    /// is written).
    pub fn start(store: Arc<dyn Store>) -> Persist {
        let (tx, rx) = mpsc::channel::<Op>();
        let thread = std::thread::Builder::new()
            .name("tokenwatch-alert-store".into())
            .spawn(move || {
                for op in rx {
                    match op {
                        Op::Upsert(alerts) => {
                            if let Err(e) = store.upsert_alerts(&alerts) {
                                tracing::warn!(error = %e, alerts = alerts.len(), "storing alerts failed");
                            }
                        }
                        Op::Delete(ids) => {
                            if let Err(e) = store.delete_alerts(&ids) {
                                tracing::warn!(error = %e, alerts = ids.len(), "deleting alerts failed");
                            }
                        }
                    }
                }
            });
        match thread {
            Ok(h) => Persist {
                written: HashMap::new(),
                tx: Some(tx),
                thread: Some(h),
            },
            Err(e) => {
                tracing::error!(error = %e, "alert store writer did not start: alerts will not survive a restart");
                Persist {
                    written: HashMap::new(),
                    tx: None,
                    thread: None,
                }
            }
        }
    }

    /// Alerts read back from the store at start: already written as they are.
    pub fn seed<'a>(&mut self, alerts: impl Iterator<Item = &'a Alert>, now: i64) {
        for a in alerts {
            self.written.insert(
                a.id.clone(),
                Written {
                    key: Key::of(a),
                    at_ms: now,
                    alert: a.clone(),
                },
            );
        }
    }

    /// Write the alerts that changed since they were last written: any new alert or key change
    /// at once, an evidence-only change of an active alert at most every [`EVIDENCE_EVERY_MS`].
    /// Returns how many were queued.
    pub fn sync<'a>(
        &mut self,
        active: impl Iterator<Item = &'a Alert>,
        resolved: impl Iterator<Item = &'a Alert>,
        now: i64,
    ) -> usize {
        let mut out = Vec::new();
        let mut seen: HashSet<&str> = HashSet::new();
        for (a, is_active) in active
            .map(|a| (a, true))
            .chain(resolved.map(|a| (a, false)))
        {
            seen.insert(a.id.as_str());
            let due = match self.written.get(&a.id) {
                None => true,
                Some(w) if !w.key.matches(a) => true,
                Some(w) => is_active && now - w.at_ms >= EVIDENCE_EVERY_MS && w.alert != *a,
            };
            if due {
                self.written.insert(
                    a.id.clone(),
                    Written {
                        key: Key::of(a),
                        at_ms: now,
                        alert: a.clone(),
                    },
                );
                out.push(a.clone());
            }
        }
        // Alerts no longer listed (resolved ones past `keep_resolved`) stay in the store until
        // its retention; only the bookkeeping goes.
        self.written.retain(|id, _| seen.contains(id.as_str()));
        let n = out.len();
        if !out.is_empty() {
            self.send(Op::Upsert(out));
        }
        n
    }

    /// A pending alert forgotten before it fired: removed from the store.
    pub fn forget(&mut self, id: &str) {
        if self.written.remove(id).is_some() {
            self.send(Op::Delete(vec![id.to_string()]));
        }
    }

    fn send(&mut self, op: Op) {
        if let Some(tx) = &self.tx
            && tx.send(op).is_err()
        {
            tracing::warn!("alert store writer stopped: alerts are no longer stored");
            self.tx = None;
        }
    }

    /// Close the queue; the returned thread ends once everything queued is written.
    pub fn finish(&mut self) -> Option<JoinHandle<()>> {
        self.tx = None;
        self.thread.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use tokenwatch_core::alert::{AnomalyEvent, Severity};
    use tokenwatch_store::{SqliteStore, StoreOptions};

    fn alert(id: &str, state: AlertState, event_at: i64) -> Alert {
        Alert {
            id: id.into(),
            fingerprint: format!("fp-{id}"),
            rule: "r".into(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            severity: Severity::Warning,
            grade: None,
            state,
            active_at_unix_ms: 0,
            fired_at_unix_ms: (state != AlertState::Pending).then_some(1),
            resolved_at_unix_ms: (state == AlertState::Resolved).then_some(2),
            last_event: Some(AnomalyEvent {
                detector: "d".into(),
                signal: "s".into(),
                labels: BTreeMap::new(),
                score: 1.0,
                at_unix_ms: event_at,
                evidence: BTreeMap::new(),
                summary: "x".into(),
            }),
            root_cause: Vec::new(),
            incident_id: None,
            snapshot: None,
        }
    }

    #[test]
    fn writes_changes_throttles_evidence_and_deletes_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(SqliteStore::open(dir.path(), StoreOptions::default()).unwrap());
        let mut p = Persist::start(store.clone());
        let a = alert("a", AlertState::Pending, 0);
        let b = alert("b", AlertState::Pending, 0);
        assert_eq!(p.sync([&a, &b].into_iter(), std::iter::empty(), 0), 2);
        // Nothing changed: nothing written.
        assert_eq!(p.sync([&a, &b].into_iter(), std::iter::empty(), 1), 0);
        // Evidence only: not before EVIDENCE_EVERY_MS, then once.
        let a2 = alert("a", AlertState::Pending, 5);
        assert_eq!(p.sync([&a2, &b].into_iter(), std::iter::empty(), 100), 0);
        assert_eq!(
            p.sync([&a2, &b].into_iter(), std::iter::empty(), EVIDENCE_EVERY_MS),
            1
        );
        // A state change goes out at once.
        let a3 = alert("a", AlertState::Firing, 5);
        assert_eq!(
            p.sync(
                [&a3, &b].into_iter(),
                std::iter::empty(),
                EVIDENCE_EVERY_MS + 1
            ),
            1
        );
        p.forget("b");
        let a4 = alert("a", AlertState::Resolved, 5);
        assert_eq!(
            p.sync(std::iter::empty(), [&a4].into_iter(), EVIDENCE_EVERY_MS + 2),
            1
        );
        p.finish().unwrap().join().unwrap();
        let stored = store.load_alerts(0).unwrap();
        assert_eq!(stored, vec![a4]);
    }
}
