// The set of currently active faults (shared by the admin API and the engines)
// and the per-model view of their combined effects.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use super::{FaultKind, FaultSpec};

/// One enabled fault with its activation time.
#[derive(Debug, Clone)]
pub struct ActiveFault {
    pub spec: FaultSpec,
    pub since: Instant,
    pub since_unix: f64,
}

impl ActiveFault {
    fn expired(&self, now: Instant) -> bool {
        self.spec.duration_s > 0.0
            && now >= self.since + Duration::from_secs_f64(self.spec.duration_s)
    }

    /// Seconds left before expiry (None when it lasts until disabled).
    pub fn remaining_s(&self, now: Instant) -> Option<f64> {
        (self.spec.duration_s > 0.0).then(|| {
            (self.spec.duration_s - now.saturating_duration_since(self.since).as_secs_f64())
                .max(0.0)
        })
    }

    fn applies_to(&self, model: &str) -> bool {
        self.spec.model.as_deref().is_none_or(|m| m == model)
    }
}

/// Combined effect of the active faults on one model at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Effects {
    pub leak_blocks: u32,
    /// GPU memory leaked per second of engine work (bytes/s), from `kv_leak`'s `mib_per_s`.
    pub leak_bytes_per_s: f64,
    /// (factor, share)
    pub latency_spike: Option<(f64, f64)>,
    pub length_blowup: Option<f64>,
    /// (rate, status)
    pub error_burst: Option<(f64, u16)>,
    /// (seconds, rate)
    pub stall: Option<(f64, f64)>,
    pub drift: Option<f64>,
}

/// Active faults; at most one per (name, target model).
#[derive(Debug, Default)]
pub struct FaultBoard {
    active: Mutex<Vec<ActiveFault>>,
}

impl FaultBoard {
    fn lock(&self) -> MutexGuard<'_, Vec<ActiveFault>> {
        // A panic while holding this lock cannot leave the Vec inconsistent.
        self.active.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Enable (or replace) a fault.
    pub fn enable(&self, spec: FaultSpec) -> ActiveFault {
        let now = Instant::now();
        let since_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let entry = ActiveFault {
            spec,
            since: now,
            since_unix,
        };
        let mut active = self.lock();
        active
            .retain(|a| !(a.spec.name() == entry.spec.name() && a.spec.model == entry.spec.model));
        active.push(entry.clone());
        entry
    }

    /// Disable faults called `name` (all targets, or only `model`); returns how many.
    pub fn disable(&self, name: &str, model: Option<&str>) -> usize {
        let mut active = self.lock();
        let before = active.len();
        active.retain(|a| {
            !(a.spec.name() == name && model.is_none_or(|m| a.spec.model.as_deref() == Some(m)))
        });
        before - active.len()
    }

    /// Active (non-expired) faults; expired ones are dropped.
    pub fn list(&self) -> Vec<ActiveFault> {
        let now = Instant::now();
        let mut active = self.lock();
        active.retain(|a| !a.expired(now));
        active.clone()
    }

    /// Effects on `model` now. A model-specific fault overrides a global one of the same name.
    pub fn effects(&self, model: &str, now: Instant) -> Effects {
        let active = self.lock();
        let mut applicable: Vec<&ActiveFault> = active
            .iter()
            .filter(|a| a.applies_to(model) && !a.expired(now))
            .collect();
        applicable.sort_by_key(|a| a.spec.model.is_some());
        let mut fx = Effects::default();
        for a in applicable {
            match a.spec.kind {
                FaultKind::KvLeak { blocks, mib_per_s } => {
                    fx.leak_blocks = blocks;
                    fx.leak_bytes_per_s = mib_per_s * 1024.0 * 1024.0;
                }
                FaultKind::LatencySpike { factor, share } => {
                    fx.latency_spike = Some((factor, share))
                }
                FaultKind::LengthBlowup { factor } => fx.length_blowup = Some(factor),
                FaultKind::ErrorBurst { rate, status } => fx.error_burst = Some((rate, status)),
                FaultKind::Stall { seconds, rate } => fx.stall = Some((seconds, rate)),
                FaultKind::Drift { share } => fx.drift = Some(share),
            }
        }
        fx
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::parse_fault;

    #[test]
    fn model_specific_overrides_global_and_disable() {
        let b = FaultBoard::default();
        b.enable(parse_fault("kv_leak:blocks=10").unwrap());
        b.enable(parse_fault("kv_leak:blocks=20,model=a").unwrap());
        let now = Instant::now();
        assert_eq!(b.effects("a", now).leak_blocks, 20);
        assert_eq!(b.effects("b", now).leak_blocks, 10);
        assert_eq!(b.disable("kv_leak", Some("a")), 1);
        assert_eq!(b.effects("a", now).leak_blocks, 10);
        assert_eq!(b.disable("kv_leak", None), 1);
        assert_eq!(b.effects("a", now), Effects::default());
    }

    #[test]
    fn duration_expires() {
        let b = FaultBoard::default();
        b.enable(parse_fault("stall:duration_s=1").unwrap());
        let now = Instant::now();
        assert!(b.effects("m", now).stall.is_some());
        assert!(b.effects("m", now + Duration::from_secs(2)).stall.is_none());
    }
}
