// Eviction ranking of spec section 6: when GPU memory is nearly full and latency jumps, rank the
// instances serving a model by 0.4 memory + 0.3 P99 + 0.3 queued (min–max normalised), worst first.

use serde::{Deserialize, Serialize};

use crate::{ParamError, Validate, check};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceLoad {
    pub instance: String,
    /// GPU memory used / total, 0..1.
    pub memory_ratio: f64,
    pub p99_s: f64,
    pub queued: f64,
}

/// When to attach an eviction ranking: memory ≥ `memory_ratio` and latency up by ≥ `latency_jump_s`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvictionParams {
    pub memory_ratio: f64,
    pub latency_jump_s: f64,
}

impl Default for EvictionParams {
    fn default() -> Self {
        EvictionParams {
            memory_ratio: 0.92,
            latency_jump_s: 0.3,
        }
    }
}

impl Validate for EvictionParams {
    fn validate(&self) -> Result<(), ParamError> {
        check(
            (0.0..=1.0).contains(&self.memory_ratio),
            "memory_ratio",
            "must be a fraction in [0, 1]",
        )?;
        check(
            self.latency_jump_s.is_finite() && self.latency_jump_s >= 0.0,
            "latency_jump_s",
            "must be ≥ 0",
        )
    }
}

/// Spec section 6's trigger; NaN inputs never trigger.
pub fn eviction_triggered(memory_ratio: f64, latency_jump_s: f64, p: &EvictionParams) -> bool {
    memory_ratio >= p.memory_ratio && latency_jump_s >= p.latency_jump_s
}

/// Min–max normalisation to [0, 1]; a constant column (or a single instance) is all 0, and a
/// non-finite value counts 0 (unknown is not blamed).
fn normalise(xs: &[f64]) -> Vec<f64> {
    let finite = xs.iter().copied().filter(|x| x.is_finite());
    let (lo, hi) = finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
        (lo.min(x), hi.max(x))
    });
    xs.iter()
        .map(|x| {
            if x.is_finite() && hi > lo {
                (x - lo) / (hi - lo)
            } else {
                0.0
            }
        })
        .collect()
}

/// Every instance once, with its score in [0, 1], worst (highest) first; ties keep input order.
pub fn eviction_ranking(instances: &[InstanceLoad]) -> Vec<(String, f64)> {
    let mem = normalise(&instances.iter().map(|i| i.memory_ratio).collect::<Vec<_>>());
    let p99 = normalise(&instances.iter().map(|i| i.p99_s).collect::<Vec<_>>());
    let queued = normalise(&instances.iter().map(|i| i.queued).collect::<Vec<_>>());
    let mut ranked: Vec<(String, f64)> = instances
        .iter()
        .enumerate()
        .map(|(k, i)| {
            (
                i.instance.clone(),
                0.4 * mem[k] + 0.3 * p99[k] + 0.3 * queued[k],
            )
        })
        .collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    ranked
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn inst(name: &str, mem: f64, p99: f64, queued: f64) -> InstanceLoad {
        InstanceLoad {
            instance: name.to_string(),
            memory_ratio: mem,
            p99_s: p99,
            queued,
        }
    }

    #[test]
    fn worst_instance_first() {
        let r = eviction_ranking(&[
            inst("a", 0.80, 0.5, 2.0),
            inst("b", 0.97, 1.5, 20.0),
            inst("c", 0.90, 0.5, 2.0),
        ]);
        assert_eq!(r[0], ("b".to_string(), 1.0));
        assert_eq!(r[1].0, "c");
        assert!((r[1].1 - 0.4 * (0.10 / 0.17)).abs() < 1e-12);
        assert_eq!(r[2], ("a".to_string(), 0.0));
    }

    #[test]
    fn ties_constant_nan_and_empty() {
        let r = eviction_ranking(&[
            inst("x", 0.9, 1.0, 3.0),
            inst("y", 0.9, 1.0, 3.0),
            inst("z", 0.9, 1.0, 3.0),
        ]);
        assert_eq!(
            r.iter().map(|x| x.0.as_str()).collect::<Vec<_>>(),
            ["x", "y", "z"],
            "stable ties"
        );
        assert!(r.iter().all(|x| x.1 == 0.0));
        let r = eviction_ranking(&[inst("n", f64::NAN, 1.0, 1.0), inst("m", 0.95, 2.0, 1.0)]);
        assert_eq!(r[0].0, "m");
        assert!(eviction_ranking(&[]).is_empty());
        assert_eq!(
            eviction_ranking(&[inst("solo", 0.99, 9.0, 9.0)]),
            vec![("solo".to_string(), 0.0)]
        );
        assert!(eviction_triggered(0.95, 0.4, &EvictionParams::default()));
        assert!(!eviction_triggered(0.90, 0.4, &EvictionParams::default()));
        assert!(!eviction_triggered(
            f64::NAN,
            0.4,
            &EvictionParams::default()
        ));
    }

    proptest! {
        #[test]
        fn ranking_is_a_permutation_sorted_desc(rows in prop::collection::vec((0.0f64..1.0, 0.0f64..10.0, 0.0f64..100.0), 0..20)) {
            let inst: Vec<InstanceLoad> = rows.iter().enumerate().map(|(k, (m, p, q))| inst(&format!("i{k}"), *m, *p, *q)).collect();
            let r = eviction_ranking(&inst);
            let mut names: Vec<String> = r.iter().map(|x| x.0.clone()).collect();
            names.sort();
            let mut expected: Vec<String> = inst.iter().map(|i| i.instance.clone()).collect();
            expected.sort();
            prop_assert_eq!(names, expected);
            prop_assert!(r.windows(2).all(|w| w[0].1 >= w[1].1));
            prop_assert!(r.iter().all(|x| (0.0..=1.0 + 1e-12).contains(&x.1)));
        }
    }
}
