// Weighted routes between model versions (canary splits): their configuration, the lock-free
// weight table the proxy picks an arm from, and the board the rollback controller and API read.
// Kernel, not proxy: the proxy (a source) picks from these tables and canary rollback (an
// action) sets their weights; both import them from here, neither from the other.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// Arms a route may split between (the proxy reads their weights into a stack array).
pub const MAX_ARMS: usize = 8;

/// `proxy.routes[]`: requests for `model` are split between model versions by weight.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// The route's name (`/api/v1/routes/{name}`, alert labels).
    pub name: String,
    /// The requested model this route applies to (the request body's `model`).
    pub model: String,
    /// The arms: each an upstream serving one version, with its share of the traffic. The arm
    /// with the highest weight is the stable one; the others are canaries.
    pub split: Vec<SplitArmConfig>,
    /// `tenant`: a tenant's requests always take the same arm (for the same weights);
    /// `none`: each request is drawn on its own.
    #[serde(default)]
    pub sticky: Sticky,
    /// Automatic rollback of a regressing canary (the `canary_rollback` alert rule decides).
    #[serde(default)]
    pub rollback: RollbackConfig,
}

/// One arm of `proxy.routes[].split`.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct SplitArmConfig {
    /// An entry of `proxy.upstreams`: its `instance` (default `host:port`) or its index.
    pub upstream: String,
    /// The model version recorded for the arm's requests (`model_version` and `ab_group`).
    pub version: String,
    /// Relative weight (non-negative; not all zero).
    pub weight: f64,
}

/// How a route's arm is chosen per request.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Sticky {
    Tenant,
    #[default]
    None,
}

/// `proxy.routes[].rollback`: when the `canary_rollback` rule sets a canary's weight to 0.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RollbackConfig {
    /// Roll a canary back automatically.
    pub enabled: bool,
    /// Consecutive bad evaluation windows before the canary's weight goes to 0.
    pub windows: u32,
    /// What makes a window bad: `regression` of the canary against the stable arm (latency,
    /// quality, toxicity or error rate), or `regression_and_split_deviation` (both at once).
    pub condition: RollbackOn,
}

impl Default for RollbackConfig {
    fn default() -> Self {
        RollbackConfig {
            enabled: true,
            windows: 2,
            condition: RollbackOn::Regression,
        }
    }
}

/// What makes a rollback window bad.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum RollbackOn {
    #[default]
    Regression,
    RegressionAndSplitDeviation,
}

/// One arm of a live split.
#[derive(Debug)]
struct Arm {
    version: String,
    /// The upstream's instance label.
    upstream: String,
    /// `Router` index of the upstream.
    route: usize,
    configured: f64,
    /// The weight in force (f64 bits): the configured one until a rollback or an operator
    /// changes it.
    weight: AtomicU64,
    /// Requests routed to this arm since the table was built.
    picks: AtomicU64,
}

impl Arm {
    fn weight(&self) -> f64 {
        f64::from_bits(self.weight.load(Ordering::Relaxed))
    }

    fn set_weight(&self, w: f64) {
        self.weight.store(w.to_bits(), Ordering::Relaxed);
    }
}

/// A live split: weights read by every routed request without a lock; the controller's state
/// beside them under a mutex no request takes.
#[derive(Debug)]
pub struct SplitTable {
    pub name: String,
    pub model: String,
    pub sticky: Sticky,
    pub rollback: RollbackConfig,
    arms: Box<[Arm]>,
    /// Index of the stable arm (the highest configured weight, first on ties).
    stable: usize,
    /// Draw counter of non-sticky picks.
    next: AtomicU64,
    control: Mutex<Control>,
}

/// The rollback controller's state of one route (reset with the table).
#[derive(Debug, Clone, Default)]
pub struct Control {
    /// Start of the window being collected (unix ms); None until the first evaluation.
    pub window_start_ms: Option<i64>,
    /// Consecutive bad windows per canary version.
    pub bad_windows: std::collections::BTreeMap<String, u32>,
    /// The latest evaluated window.
    pub last_window: Option<WindowView>,
    /// Canaries rolled back and not restored since.
    pub rolled_back: Vec<Rollback>,
}

/// One evaluated window of a route, as the controller saw it.
#[derive(Debug, Clone, Serialize)]
pub struct WindowView {
    pub from_unix_ms: i64,
    pub to_unix_ms: i64,
    pub arms: Vec<ArmWindow>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ArmWindow {
    pub version: String,
    pub requests: u64,
    /// Share of the route's requests in the window.
    pub share: f64,
    /// The share the weights in force asked for.
    pub target_share: f64,
    pub error_rate: f64,
    pub p99_s: f64,
    /// Canary arms: the window counted as bad.
    pub bad: Option<bool>,
}

/// A canary set to weight 0 by the controller.
#[derive(Debug, Clone, Serialize)]
pub struct Rollback {
    pub version: String,
    pub at_unix_ms: i64,
    /// The weight it had before.
    pub weight_before: f64,
    /// Consecutive bad windows that caused it.
    pub windows: u32,
    pub reason: String,
    pub evidence: serde_json::Value,
}

/// Why a weight change was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum WeightError {
    #[error("route {route:?} has no version {version:?} (versions: {known})")]
    UnknownVersion {
        route: String,
        version: String,
        known: String,
    },
    #[error("weight of {version:?} must be a finite number ≥ 0, got {weight}")]
    BadWeight { version: String, weight: f64 },
    #[error("the weights would all be 0: at least one version needs a positive weight")]
    AllZero,
}

impl SplitTable {
    /// Build from `cfg` (the configuration key `key` names its errors), resolving upstreams
    /// among `routes`: the proxy's upstreams as (instance name, route index).
    pub fn new(
        key: &str,
        cfg: &RouteConfig,
        routes: &[(&str, usize)],
    ) -> Result<SplitTable, String> {
        check(key, cfg)?;
        let mut arms = Vec::with_capacity(cfg.split.len());
        for (i, a) in cfg.split.iter().enumerate() {
            let akey = format!("{key}.split[{i}]");
            let route = routes
                .iter()
                .find(|r| r.0 == a.upstream)
                .or_else(|| a.upstream.parse::<usize>().ok().and_then(|n| routes.get(n)))
                .ok_or_else(|| {
                    let names: Vec<&str> = routes.iter().map(|r| r.0).collect();
                    format!(
                        "{akey}.upstream: no proxy.upstreams entry has instance {:?} (instances: {}; or give an index)",
                        a.upstream,
                        names.join(", ")
                    )
                })?;
            arms.push(Arm {
                version: a.version.clone(),
                upstream: route.0.to_string(),
                route: route.1,
                configured: a.weight,
                weight: AtomicU64::new(a.weight.to_bits()),
                picks: AtomicU64::new(0),
            });
        }
        let stable = (0..arms.len()).fold(0, |best, i| {
            if arms[i].configured > arms[best].configured {
                i
            } else {
                best
            }
        });
        Ok(SplitTable {
            name: cfg.name.clone(),
            model: cfg.model.clone(),
            sticky: cfg.sticky,
            rollback: cfg.rollback.clone(),
            arms: arms.into_boxed_slice(),
            stable,
            next: AtomicU64::new(0),
            control: Mutex::new(Control::default()),
        })
    }
}

/// The checks of `proxy.routes` that need no upstream (`Config::validate`, before command-line
/// upstreams are added): names and models unique, versions unique, weights ≥ 0 and not all 0.
/// Errors are (key path, message).
pub fn validate(routes: &[RouteConfig]) -> Result<(), (String, String)> {
    for (i, cfg) in routes.iter().enumerate() {
        let key = format!("proxy.routes[{i}]");
        if routes[..i].iter().any(|r| r.name == cfg.name) {
            return Err((
                format!("{key}.name"),
                format!("route name {:?} is used twice", cfg.name),
            ));
        }
        if routes[..i].iter().any(|r| r.model == cfg.model) {
            return Err((
                format!("{key}.model"),
                format!("model {:?} already has a route", cfg.model),
            ));
        }
        check(&key, cfg).map_err(|e| match e.split_once(": ") {
            Some((path, msg)) => (path.to_string(), msg.to_string()),
            None => (key.clone(), e),
        })?;
    }
    Ok(())
}

/// One route's checks that need no upstream; the error is `key.path: message`.
fn check(key: &str, cfg: &RouteConfig) -> Result<(), String> {
    if cfg.name.trim().is_empty() {
        return Err(format!("{key}.name: must not be empty"));
    }
    if cfg.model.trim().is_empty() {
        return Err(format!("{key}.model: must not be empty"));
    }
    if cfg.split.is_empty() || cfg.split.len() > MAX_ARMS {
        return Err(format!(
            "{key}.split: needs 1 to {MAX_ARMS} arms, has {}",
            cfg.split.len()
        ));
    }
    for (i, a) in cfg.split.iter().enumerate() {
        let akey = format!("{key}.split[{i}]");
        if a.version.trim().is_empty() {
            return Err(format!("{akey}.version: must not be empty"));
        }
        if cfg.split[..i].iter().any(|b| b.version == a.version) {
            return Err(format!("{akey}.version: {:?} is listed twice", a.version));
        }
        if !a.weight.is_finite() || a.weight < 0.0 {
            return Err(format!(
                "{akey}.weight: must be a number ≥ 0, got {}",
                a.weight
            ));
        }
    }
    if cfg.split.iter().all(|a| a.weight == 0.0) {
        return Err(format!("{key}.split: the weights are all 0"));
    }
    if cfg.rollback.windows == 0 {
        return Err(format!("{key}.rollback.windows: must be ≥ 1"));
    }
    Ok(())
}

impl SplitTable {
    /// The arm for one request: `(router index of its upstream, its version)`. Sticky routes
    /// place a tenant by a hash of its id; others draw from a counter's mixed bits. Lock-free.
    pub fn pick(&self, tenant: &str) -> (usize, &str) {
        let i = self.pick_index(tenant);
        let arm = &self.arms[i];
        arm.picks.fetch_add(1, Ordering::Relaxed);
        (arm.route, &arm.version)
    }

    fn pick_index(&self, tenant: &str) -> usize {
        let bits = match self.sticky {
            Sticky::Tenant if !tenant.is_empty() => mix(fnv1a(tenant.as_bytes())),
            _ => mix(self.next.fetch_add(1, Ordering::Relaxed)),
        };
        let u = (bits >> 11) as f64 / (1u64 << 53) as f64;
        let mut w = [0.0f64; MAX_ARMS];
        let mut total = 0.0;
        for (slot, arm) in w.iter_mut().zip(self.arms.iter()) {
            *slot = arm.weight().max(0.0);
            total += *slot;
        }
        if total <= 0.0 || !total.is_finite() {
            return self.stable;
        }
        let target = u * total;
        let mut acc = 0.0;
        let mut last_positive = self.stable;
        for (i, wi) in w.iter().take(self.arms.len()).enumerate() {
            if *wi <= 0.0 {
                continue;
            }
            acc += wi;
            last_positive = i;
            if target < acc {
                return i;
            }
        }
        last_positive
    }

    /// `Router` index of the stable arm's upstream.
    pub fn stable_route(&self) -> usize {
        self.arms[self.stable].route
    }

    pub fn stable_version(&self) -> &str {
        &self.arms[self.stable].version
    }

    /// `(version, weight in force)` of every arm, in configuration order.
    pub fn weights(&self) -> Vec<(String, f64)> {
        self.arms
            .iter()
            .map(|a| (a.version.clone(), a.weight()))
            .collect()
    }

    /// The canary versions (every arm but the stable one).
    pub fn canaries(&self) -> impl Iterator<Item = &str> {
        self.arms
            .iter()
            .enumerate()
            .filter(move |(i, _)| *i != self.stable)
            .map(|(_, a)| a.version.as_str())
    }

    /// The weight in force of `version`.
    pub fn weight_of(&self, version: &str) -> Option<f64> {
        self.arms
            .iter()
            .find(|a| a.version == version)
            .map(Arm::weight)
    }

    /// Set the weights of the listed versions (the others keep theirs). Refused as a whole
    /// when a version is unknown, a weight negative or not finite, or all would be 0. A restore:
    /// the controller forgets its rollbacks and streaks and starts a new window.
    pub fn set_weights(&self, weights: &[(String, f64)]) -> Result<(), WeightError> {
        let mut next: Vec<f64> = self.arms.iter().map(Arm::weight).collect();
        for (version, w) in weights {
            let Some(i) = self.arms.iter().position(|a| &a.version == version) else {
                return Err(WeightError::UnknownVersion {
                    route: self.name.clone(),
                    version: version.clone(),
                    known: self
                        .arms
                        .iter()
                        .map(|a| a.version.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            };
            if !w.is_finite() || *w < 0.0 {
                return Err(WeightError::BadWeight {
                    version: version.clone(),
                    weight: *w,
                });
            }
            next[i] = *w;
        }
        if next.iter().all(|w| *w == 0.0) {
            return Err(WeightError::AllZero);
        }
        self.store_weights(&next);
        let mut c = self.control();
        c.rolled_back.clear();
        c.bad_windows.clear();
        c.window_start_ms = None;
        Ok(())
    }

    /// Raised weights first, so a concurrent pick never sees them all at 0.
    fn store_weights(&self, next: &[f64]) {
        for (a, w) in self.arms.iter().zip(next) {
            if *w >= a.weight() {
                a.set_weight(*w);
            }
        }
        for (a, w) in self.arms.iter().zip(next) {
            a.set_weight(*w);
        }
    }

    /// Back to the configured weights, the controller's state cleared (a configuration reload).
    pub fn reset(&self) {
        let configured: Vec<f64> = self.arms.iter().map(|a| a.configured).collect();
        self.store_weights(&configured);
        *self.control() = Control::default();
    }

    /// Set `version`'s weight to 0 and record why (the controller's rollback). None when the
    /// version is unknown or already at 0, or it is the only arm with weight left.
    pub fn roll_back(
        &self,
        version: &str,
        windows: u32,
        reason: String,
        evidence: serde_json::Value,
        now_ms: i64,
    ) -> Option<Rollback> {
        let i = self.arms.iter().position(|a| a.version == version)?;
        let before = self.arms[i].weight();
        let others = self
            .arms
            .iter()
            .enumerate()
            .any(|(j, a)| j != i && a.weight() > 0.0);
        if before <= 0.0 || !others {
            return None;
        }
        self.arms[i].set_weight(0.0);
        let rb = Rollback {
            version: version.to_string(),
            at_unix_ms: now_ms,
            weight_before: before,
            windows,
            reason,
            evidence,
        };
        let mut c = self.control();
        c.bad_windows.remove(version);
        c.rolled_back.retain(|r| r.version != version);
        c.rolled_back.push(rb.clone());
        Some(rb)
    }

    /// The controller's state (never locked by a routed request).
    pub fn control(&self) -> std::sync::MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The route as `GET /api/v1/routes` shows it.
    pub fn view(&self) -> serde_json::Value {
        let picks: Vec<u64> = self
            .arms
            .iter()
            .map(|a| a.picks.load(Ordering::Relaxed))
            .collect();
        let total_picks: u64 = picks.iter().sum();
        let c = self.control().clone();
        let arms: Vec<serde_json::Value> = self
            .arms
            .iter()
            .zip(&picks)
            .enumerate()
            .map(|(i, (a, p))| {
                let observed = c.last_window.as_ref().and_then(|w| w.arms.iter().find(|x| x.version == a.version));
                serde_json::json!({
                    "version": a.version,
                    "upstream": a.upstream,
                    "role": if i == self.stable { "stable" } else { "canary" },
                    "configured_weight": a.configured,
                    "weight": a.weight(),
                    "picks": p,
                    "picked_share": if total_picks > 0 { *p as f64 / total_picks as f64 } else { 0.0 },
                    "observed_share": observed.map(|o| o.share),
                    "bad_windows": c.bad_windows.get(&a.version).copied().unwrap_or(0),
                    "rolled_back": c.rolled_back.iter().any(|r| r.version == a.version),
                })
            })
            .collect();
        serde_json::json!({
            "name": self.name,
            "model": self.model,
            "sticky": self.sticky,
            "rollback": {
                "enabled": self.rollback.enabled,
                "windows": self.rollback.windows,
                "condition": self.rollback.condition,
                "rolled_back": c.rolled_back,
            },
            "arms": arms,
            "last_window": c.last_window,
        })
    }
}

/// FNV-1a of a tenant id.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// splitmix64's finalizer: spreads a counter or a hash over all 64 bits.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The splits of the routes the proxy runs now, for the rollback controller and the API. The
/// proxy publishes its tables when it starts and when a reload replaces them; the application
/// creates one board and hands it to the proxy, the alert engine and the API (no process-wide
/// state).
#[derive(Default)]
pub struct SplitBoard {
    tables: RwLock<Vec<Arc<SplitTable>>>,
}

impl SplitBoard {
    /// A board without routes (no proxy).
    pub const fn empty() -> SplitBoard {
        SplitBoard {
            tables: RwLock::new(Vec::new()),
        }
    }

    pub fn publish(&self, tables: Vec<Arc<SplitTable>>) {
        *self.tables.write().unwrap_or_else(|p| p.into_inner()) = tables;
    }

    pub fn all(&self) -> Vec<Arc<SplitTable>> {
        self.tables
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn get(&self, name: &str) -> Option<Arc<SplitTable>> {
        self.all().into_iter().find(|t| t.name == name)
    }

    /// Every route back to its configured weights (a reload that kept the routes).
    pub fn reset_all(&self) {
        for t in self.all() {
            t.reset();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The proxy's upstreams: (instance, route index).
    const ROUTES: &[(&str, usize)] = &[("stable-gpu", 0), ("canary-gpu", 1)];

    fn cfg(sticky: Sticky, weights: [f64; 2]) -> RouteConfig {
        RouteConfig {
            name: "r".into(),
            model: "m".into(),
            split: vec![
                SplitArmConfig {
                    upstream: "stable-gpu".into(),
                    version: "v1".into(),
                    weight: weights[0],
                },
                SplitArmConfig {
                    upstream: "1".into(),
                    version: "v2".into(),
                    weight: weights[1],
                },
            ],
            sticky,
            rollback: RollbackConfig::default(),
        }
    }

    fn shares(t: &SplitTable, n: usize, tenant: impl Fn(usize) -> String) -> [usize; 2] {
        let mut c = [0, 0];
        for i in 0..n {
            let (route, version) = t.pick(&tenant(i));
            assert_eq!(route, if version == "v1" { 0 } else { 1 });
            c[route] += 1;
        }
        c
    }

    #[test]
    fn weighted_picks_follow_the_weights() {
        let t =
            SplitTable::new("proxy.routes[0]", &cfg(Sticky::None, [80.0, 20.0]), ROUTES).unwrap();
        assert_eq!(t.stable_version(), "v1");
        assert_eq!(t.canaries().collect::<Vec<_>>(), ["v2"]);
        let c = shares(&t, 20_000, |_| String::new());
        let canary = c[1] as f64 / 20_000.0;
        assert!((canary - 0.2).abs() < 0.01, "canary share {canary}");
        // Within every run of 1000 draws the share is already close (no long streaks).
        let c = shares(&t, 1_000, |_| String::new());
        assert!((150..=250).contains(&c[1]), "{c:?}");
        t.set_weights(&[("v2".into(), 0.0)]).unwrap();
        assert_eq!(shares(&t, 1_000, |_| String::new()), [1_000, 0]);
        t.set_weights(&[("v1".into(), 1.0), ("v2".into(), 3.0)])
            .unwrap();
        let c = shares(&t, 8_000, |_| String::new());
        assert!((c[1] as f64 / 8_000.0 - 0.75).abs() < 0.02, "{c:?}");
        t.reset();
        assert_eq!(
            t.weights(),
            [("v1".to_string(), 80.0), ("v2".to_string(), 20.0)]
        );
    }

    #[test]
    fn sticky_tenants_keep_their_arm_and_spread_by_weight() {
        let t = SplitTable::new(
            "proxy.routes[0]",
            &cfg(Sticky::Tenant, [50.0, 50.0]),
            ROUTES,
        )
        .unwrap();
        let first: Vec<&str> = (0..500).map(|i| t.pick(&format!("tenant-{i}")).1).collect();
        for _ in 0..3 {
            let again: Vec<&str> = (0..500).map(|i| t.pick(&format!("tenant-{i}")).1).collect();
            assert_eq!(first, again);
        }
        let v2 = first.iter().filter(|v| **v == "v2").count();
        assert!((200..=300).contains(&v2), "{v2} of 500 tenants on v2");
        // A table with the same weights places every tenant the same way.
        let u = SplitTable::new(
            "proxy.routes[0]",
            &cfg(Sticky::Tenant, [50.0, 50.0]),
            ROUTES,
        )
        .unwrap();
        assert!((0..500).all(|i| u.pick(&format!("tenant-{i}")).1 == first[i]));
        // Canary at 0: every tenant on the stable arm; tenants already there stay there.
        t.set_weights(&[("v2".into(), 0.0)]).unwrap();
        assert!((0..500).all(|i| t.pick(&format!("tenant-{i}")).1 == "v1"));
        // Without a tenant id a sticky route draws per request.
        t.set_weights(&[("v2".into(), 50.0)]).unwrap();
        let c = shares(&t, 2_000, |_| String::new());
        assert!(c[0] > 800 && c[1] > 800, "{c:?}");
    }

    #[test]
    fn bad_configurations_and_weights_are_refused() {
        let rs = ROUTES;
        let mut c = cfg(Sticky::None, [0.0, 0.0]);
        let e = SplitTable::new("proxy.routes[0]", &c, rs).unwrap_err();
        assert!(
            e.contains("proxy.routes[0].split") && e.contains("all 0"),
            "{e}"
        );
        c = cfg(Sticky::None, [1.0, -1.0]);
        let e = SplitTable::new("proxy.routes[0]", &c, rs).unwrap_err();
        assert!(e.contains("proxy.routes[0].split[1].weight"), "{e}");
        c = cfg(Sticky::None, [1.0, 1.0]);
        c.split[1].upstream = "nowhere".into();
        let e = SplitTable::new("proxy.routes[0]", &c, rs).unwrap_err();
        assert!(
            e.contains("split[1].upstream") && e.contains("canary-gpu"),
            "{e}"
        );
        c = cfg(Sticky::None, [1.0, 1.0]);
        c.split[1].version = "v1".into();
        assert!(SplitTable::new("k", &c, rs).unwrap_err().contains("twice"));

        let t = SplitTable::new("k", &cfg(Sticky::None, [9.0, 1.0]), rs).unwrap();
        assert!(matches!(
            t.set_weights(&[("v3".into(), 1.0)]),
            Err(WeightError::UnknownVersion { .. })
        ));
        assert!(matches!(
            t.set_weights(&[("v2".into(), f64::NAN)]),
            Err(WeightError::BadWeight { .. })
        ));
        assert_eq!(
            t.set_weights(&[("v1".into(), 0.0), ("v2".into(), 0.0)]),
            Err(WeightError::AllZero)
        );
        assert_eq!(
            t.weights(),
            [("v1".to_string(), 9.0), ("v2".to_string(), 1.0)]
        );
    }

    #[test]
    fn validation_names_the_key_without_needing_upstreams() {
        let a = cfg(Sticky::None, [1.0, 1.0]);
        let mut b = a.clone();
        b.model = "other".into();
        let e = validate(&[a.clone(), b.clone()]).unwrap_err();
        assert_eq!(e.0, "proxy.routes[1].name", "{e:?}");
        b.name = "r2".into();
        b.split[0].upstream = "added later by --upstream".into();
        assert!(validate(&[a.clone(), b.clone()]).is_ok());
        b.split[0].weight = -1.0;
        let e = validate(&[a, b]).unwrap_err();
        assert_eq!(e.0, "proxy.routes[1].split[0].weight", "{e:?}");
    }

    #[test]
    fn a_rollback_zeroes_the_canary_until_restored() {
        let t = SplitTable::new("k", &cfg(Sticky::None, [80.0, 20.0]), ROUTES).unwrap();
        let rb = t
            .roll_back("v2", 2, "P99 +300%".into(), serde_json::json!({"x": 1}), 5)
            .unwrap();
        assert_eq!((rb.weight_before, rb.windows), (20.0, 2));
        assert_eq!(t.weight_of("v2"), Some(0.0));
        assert_eq!(shares(&t, 500, |_| String::new()), [500, 0]);
        // Already at 0, or the last arm with weight: nothing to roll back.
        assert!(
            t.roll_back("v2", 2, String::new(), serde_json::Value::Null, 6)
                .is_none()
        );
        assert!(
            t.roll_back("v1", 2, String::new(), serde_json::Value::Null, 6)
                .is_none()
        );
        let v = t.view();
        assert_eq!(v["arms"][1]["rolled_back"], true);
        assert_eq!(v["arms"][1]["configured_weight"], 20.0);
        assert_eq!(v["rollback"]["rolled_back"][0]["version"], "v2");
        t.set_weights(&[("v2".into(), 20.0)]).unwrap();
        assert!(t.control().rolled_back.is_empty());
        assert_eq!(t.view()["arms"][1]["rolled_back"], false);
    }
}
