// Alerting: rules, alert lifecycle and evaluation (engine, with the SLOs it tracks), and what
// happens once an alert exists — delivery to Alertmanager and webhooks, snapshots, Prometheus
// rules export.

pub mod api;
pub mod budget;
pub mod deliver;
pub mod detectors;
pub mod engine;
pub mod promexport;
pub mod rules;
pub mod slo;
pub mod snapshot;
