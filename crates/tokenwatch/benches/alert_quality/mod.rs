// The labelled alert-quality harness shared by `benches/alert_quality.rs` and
// `tests/e2e/timed/alert_quality.rs`: a simulated fleet behind one tokenwatch, real load, scoring.
//
// Parts: `fleet` (simulators, tokenwatch, Alertmanager, fault switching), `load` (heavy-tailed,
// swinging Poisson traffic), `observe` (what tokenwatch and Alertmanager report), `scenario`
// (labelled runs) and `score` (recall, time to detect, false alerts, groups, root cause).
#![allow(dead_code)]

#[path = "../alert_latency/procs.rs"]
pub mod procs;

pub mod fleet;
pub mod load;
pub mod observe;
pub mod random;
pub mod router;
pub mod scenario;
pub mod score;
pub mod truth;
