// Noise reduction of spec section 5: topology convergence (GPUs behind one PCIe switch all busy),
// call-chain convergence (many CUDA OOM spans in one trace) and per-key suppression windows.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

use crate::{ParamError, Validate, check};

/// Defaults of the convergence rules, for the engine's configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NoiseParams {
    pub topology_min_gpus: usize,
    pub topology_util_threshold: f64,
    pub topology_suppress_ms: i64,
    pub call_chain_min_spans: usize,
    pub call_chain_suppress_ms: i64,
}

impl Default for NoiseParams {
    fn default() -> Self {
        NoiseParams {
            topology_min_gpus: 3,
            topology_util_threshold: 0.85,
            topology_suppress_ms: 120_000,
            call_chain_min_spans: 5,
            call_chain_suppress_ms: 30_000,
        }
    }
}

impl Validate for NoiseParams {
    fn validate(&self) -> Result<(), ParamError> {
        check(
            self.topology_min_gpus >= 1,
            "topology_min_gpus",
            "must be ≥ 1",
        )?;
        check(
            (0.0..=1.0).contains(&self.topology_util_threshold),
            "topology_util_threshold",
            "must be a fraction in [0, 1]",
        )?;
        check(
            self.call_chain_min_spans >= 1,
            "call_chain_min_spans",
            "must be ≥ 1",
        )?;
        check(
            self.topology_suppress_ms >= 0 && self.call_chain_suppress_ms >= 0,
            "topology_suppress_ms",
            "suppression windows must be ≥ 0",
        )
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuUtilReading {
    pub device_id: String,
    pub pci_switch: String,
    /// SM utilisation as a fraction 0..1.
    pub sm_utilization: f64,
}

/// Switches with at least `min_gpus` distinct devices over `util_threshold` (NaN readings
/// ignored): (switch, sorted device ids), sorted by switch.
pub fn topology_convergence(
    gpus: &[GpuUtilReading],
    min_gpus: usize,
    util_threshold: f64,
) -> Vec<(String, Vec<String>)> {
    let mut by_switch: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for g in gpus
        .iter()
        .filter(|g| g.sm_utilization.is_finite() && g.sm_utilization > util_threshold)
    {
        by_switch
            .entry(g.pci_switch.as_str())
            .or_default()
            .insert(g.device_id.as_str());
    }
    by_switch
        .into_iter()
        .filter(|(_, d)| d.len() >= min_gpus.max(1))
        .map(|(s, d)| (s.to_string(), d.into_iter().map(str::to_string).collect()))
        .collect()
}

/// Switch key from a PCI bus id `[domain:]bus:device.function` (`00000000:18:00.0`, `0000:3b:00.0`).
/// Heuristic: GPUs behind one PCIe switch get bus numbers from the same block handed out below
/// that switch's port, so the key is the domain plus the 32-bus block — `0000:00-1f`, `0000:40-5f`.
/// (Bus 07/0f, 47/4e, 87/90, b7/bd pair up as on an 8-GPU HGX board.) Configure explicit
/// switches when the board differs. An unparseable id is its own switch (never converges).
pub fn pci_switch_of(pci_bus_id: &str) -> String {
    let id = pci_bus_id.trim();
    let parts: Vec<&str> = id.split(':').collect();
    let (domain, bus) = match parts.as_slice() {
        [d, b, _] => (
            u32::from_str_radix(d, 16).ok(),
            u32::from_str_radix(b, 16).ok(),
        ),
        [b, _] => (Some(0), u32::from_str_radix(b, 16).ok()),
        _ => (None, None),
    };
    match (domain, bus) {
        (Some(d), Some(b)) if b <= 0xff => {
            let start = b & 0xe0;
            format!("{d:04x}:{start:02x}-{:02x}", start + 0x1f)
        }
        _ => id.to_string(),
    }
}

/// Root traces with at least `min_spans` spans reporting CUDA out-of-memory, sorted.
pub fn call_chain_convergence(spans: &[(String, bool)], min_spans: usize) -> Vec<String> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for (trace, oom) in spans {
        if *oom {
            *counts.entry(trace.as_str()).or_default() += 1;
        }
    }
    counts
        .into_iter()
        .filter(|(_, n)| *n >= min_spans.max(1))
        .map(|(t, _)| t.to_string())
        .collect()
}

/// Remembers when each key (switch, trace id, fingerprint…) last raised an alert and suppresses
/// repeats inside the window.
#[derive(Debug, Clone, Default)]
pub struct Suppressor {
    last: BTreeMap<String, i64>,
}

impl Suppressor {
    /// True (and remembered) when `key` has not been emitted within `window_ms` before `now`.
    pub fn should_emit(&mut self, key: &str, now_unix_ms: i64, window_ms: i64) -> bool {
        match self.last.get(key) {
            Some(t) if now_unix_ms.saturating_sub(*t) < window_ms && now_unix_ms >= *t => false,
            _ => {
                self.last.insert(key.to_string(), now_unix_ms);
                true
            }
        }
    }

    /// Forgets keys last emitted more than `older_than_ms` before `now` (bounded memory).
    pub fn prune(&mut self, now_unix_ms: i64, older_than_ms: i64) {
        self.last
            .retain(|_, t| now_unix_ms.saturating_sub(*t) <= older_than_ms);
    }

    pub fn len(&self) -> usize {
        self.last.len()
    }

    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(id: &str, bus: &str, util: f64) -> GpuUtilReading {
        GpuUtilReading {
            device_id: id.to_string(),
            pci_switch: pci_switch_of(bus),
            sm_utilization: util,
        }
    }

    #[test]
    fn three_busy_gpus_on_one_switch_converge() {
        let gpus = vec![
            gpu("g0", "00000000:18:00.0", 0.95),
            gpu("g1", "00000000:19:00.0", 0.9),
            gpu("g2", "00000000:1A:00.0", 0.99),
            gpu("g2", "00000000:1A:00.0", 0.99), // duplicate reading
            gpu("g3", "00000000:3B:00.0", 0.97), // other switch
            gpu("g4", "00000000:1B:00.0", 0.5),  // not busy
            gpu("g5", "00000000:1C:00.0", f64::NAN),
        ];
        let c = topology_convergence(&gpus, 3, 0.85);
        assert_eq!(
            c,
            vec![(
                "0000:00-1f".to_string(),
                vec!["g0".to_string(), "g1".to_string(), "g2".to_string()]
            )]
        );
        assert!(topology_convergence(&gpus[..2], 3, 0.85).is_empty());
        assert!(topology_convergence(&[], 3, 0.85).is_empty());
    }

    #[test]
    fn switch_keys() {
        assert_eq!(pci_switch_of("00000000:18:00.0"), "0000:00-1f");
        assert_eq!(pci_switch_of("0000:4e:00.0"), pci_switch_of("0000:47:00.0"));
        assert_eq!(pci_switch_of("0000:87:00.0"), pci_switch_of("0000:90:00.0"));
        assert_ne!(pci_switch_of("0000:47:00.0"), pci_switch_of("0000:87:00.0"));
        assert_ne!(pci_switch_of("0001:18:00.0"), pci_switch_of("0000:18:00.0"));
        assert_eq!(pci_switch_of("18:00.0"), "0000:00-1f");
        assert_eq!(pci_switch_of("garbage"), "garbage");
        assert_eq!(pci_switch_of("zz:18:00.0"), "zz:18:00.0");
    }

    #[test]
    fn call_chain_needs_five_oom_spans_in_one_trace() {
        let mut spans: Vec<(String, bool)> = (0..5).map(|_| ("t1".to_string(), true)).collect();
        spans.extend((0..4).map(|_| ("t2".to_string(), true)));
        spans.extend((0..9).map(|_| ("t3".to_string(), false)));
        assert_eq!(call_chain_convergence(&spans, 5), vec!["t1".to_string()]);
        assert!(call_chain_convergence(&[], 5).is_empty());
    }

    #[test]
    fn suppression_window() {
        let mut s = Suppressor::default();
        assert!(s.should_emit("sw", 0, 120_000));
        assert!(!s.should_emit("sw", 60_000, 120_000));
        assert!(s.should_emit("other", 60_000, 120_000));
        assert!(s.should_emit("sw", 120_000, 120_000));
        s.prune(1_000_000, 300_000);
        assert!(s.is_empty());
    }
}
