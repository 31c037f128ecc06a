// The end-to-end areas whose assertions hold times (alert delays, latency against a baseline,
// streams across restarts): the test command runs them two at a time after the rest
// (scripts/test.sh), so that no other area's load moves their clocks.

pub mod alert_convergence;
pub mod alert_experiments;
pub mod alert_quality;
pub mod alert_restart;
pub mod alert_scenarios;
pub mod analysis_panic;
pub mod analysis_priority;
pub mod canary_rollback;
pub mod early_ttft;
pub mod incident_across_labels;
pub mod proxy_roles;
pub mod replica_shift;
pub mod rollout;
pub mod scaling;
pub mod sim_leak_default_rules;
pub mod slos;
pub mod store_failure;
