// Cache pollution (spec section 4): per-tenant prefix-key access concentrated on few keys
// (low normalised Shannon entropy) while many cached keys go cold.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::text::pct;
use crate::{Finding, ParamError, Validate, check};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CachePollutionParams {
    pub max_entropy: f64,
    pub max_cold_ratio: f64,
    pub cold_after_ms: i64,
    pub min_accesses: usize,
}

impl Default for CachePollutionParams {
    fn default() -> Self {
        CachePollutionParams {
            max_entropy: 0.3,
            max_cold_ratio: 0.4,
            cold_after_ms: 5 * 60_000,
            min_accesses: 50,
        }
    }
}

impl Validate for CachePollutionParams {
    fn validate(&self) -> Result<(), ParamError> {
        check(
            (0.0..1.0).contains(&self.max_entropy),
            "max_entropy",
            "must be in [0, 1)",
        )?;
        check(
            (0.0..1.0).contains(&self.max_cold_ratio),
            "max_cold_ratio",
            "must be in [0, 1)",
        )?;
        check(self.cold_after_ms > 0, "cold_after_ms", "must be > 0")
    }
}

/// `accesses` are one tenant's (prefix key, unix ms) accesses over the lookback the caller keeps.
/// Entropy is normalised by ln(distinct keys) (0 with a single key); the cold ratio is the share of
/// distinct keys whose last access is older than `cold_after_ms` before `now_unix_ms`.
/// Fires when entropy < max_entropy and cold ratio > max_cold_ratio. Score = geometric mean of
/// (1 − H) / (1 − max_entropy) and cold / max_cold_ratio: 1.0 at both thresholds.
pub fn cache_pollution(
    accesses: &[(String, i64)],
    now_unix_ms: i64,
    p: &CachePollutionParams,
) -> Option<Finding> {
    if accesses.len() < p.min_accesses.max(2) {
        return None;
    }
    let mut keys: BTreeMap<&str, (u64, i64)> = BTreeMap::new();
    for (k, t) in accesses {
        let e = keys.entry(k.as_str()).or_insert((0, i64::MIN));
        e.0 += 1;
        e.1 = e.1.max(*t);
    }
    let distinct = keys.len();
    if distinct < 2 {
        return None;
    }
    let n = accesses.len() as f64;
    let h: f64 = keys
        .values()
        .map(|(c, _)| *c as f64 / n)
        .map(|q| -q * q.ln())
        .sum();
    let entropy = (h / (distinct as f64).ln()).clamp(0.0, 1.0);
    let cold_before = now_unix_ms.saturating_sub(p.cold_after_ms);
    let cold = keys
        .values()
        .filter(|(_, last)| *last < cold_before)
        .count();
    let cold_ratio = cold as f64 / distinct as f64;
    if entropy >= p.max_entropy || cold_ratio <= p.max_cold_ratio {
        return None;
    }
    let score = ((1.0 - entropy) / (1.0 - p.max_entropy) * cold_ratio / p.max_cold_ratio).sqrt();
    let (hot_key, hot) = keys
        .iter()
        .max_by_key(|(_, (c, _))| *c)
        .map_or(("", 0), |(k, (c, _))| (*k, *c));
    let summary = format!(
        "prefix-cache access is concentrated (entropy {entropy:.2} < {}) while {} of {distinct} cached prefixes \
         went unused for {} min ({}) — one-off prefixes are polluting the cache; the hottest prefix takes {} \
         of accesses. Check this tenant's prompt templates (per-request ids or timestamps in the prefix)",
        p.max_entropy,
        cold,
        p.cold_after_ms / 60_000,
        pct(cold_ratio),
        pct(hot as f64 / n)
    );
    Some(
        Finding::new(score, summary)
            .with("entropy", entropy)
            .with("max_entropy", p.max_entropy)
            .with("cold_ratio", cold_ratio)
            .with("max_cold_ratio", p.max_cold_ratio)
            .with("distinct_keys", distinct)
            .with("cold_keys", cold)
            .with("accesses", accesses.len())
            .with("hottest_key_share", hot as f64 / n)
            .with("hottest_key", hot_key)
            .with("cold_after_ms", p.cold_after_ms),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 10_000_000;

    fn acc(key: &str, ago_ms: i64) -> (String, i64) {
        (key.to_string(), NOW - ago_ms)
    }

    #[test]
    fn polluted_cache_fires() {
        // 200 hits on one hot prefix now; 20 one-off prefixes touched 10 min ago.
        let mut a: Vec<_> = (0..200).map(|_| acc("system-v1", 1_000)).collect();
        a.extend((0..20).map(|i| acc(&format!("req-{i}"), 600_000)));
        let f = cache_pollution(&a, NOW, &CachePollutionParams::default()).unwrap();
        assert!(f.evidence["entropy"].as_f64().unwrap() < 0.3);
        assert!((f.evidence["cold_ratio"].as_f64().unwrap() - 20.0 / 21.0).abs() < 1e-12);
        assert!(f.score > 1.0);
    }

    #[test]
    fn healthy_and_edge_cases() {
        let p = CachePollutionParams::default();
        // Even use of 10 prefixes, all recent: high entropy, nothing cold.
        let even: Vec<_> = (0..200)
            .map(|i| acc(&format!("p{}", i % 10), 1_000))
            .collect();
        assert!(cache_pollution(&even, NOW, &p).is_none());
        // Concentrated but nothing cold.
        let mut hot: Vec<_> = (0..200).map(|_| acc("system", 1_000)).collect();
        hot.extend((0..5).map(|i| acc(&format!("x{i}"), 1_000)));
        assert!(cache_pollution(&hot, NOW, &p).is_none());
        // Too few accesses; empty; single key (constant).
        assert!(cache_pollution(&hot[..10], NOW, &p).is_none());
        assert!(cache_pollution(&[], NOW, &p).is_none());
        let single: Vec<_> = (0..100).map(|_| acc("only", 900_000)).collect();
        assert!(cache_pollution(&single, NOW, &p).is_none());
    }
}
