// tokenwatch's end-to-end tests, one test binary: each module starts the real `tokenwatch`
// binary (and the real peers it talks to) on loopback ports and talks to it as a user would.
// One binary links once (the suite used to link ~60, each recompiling the shared helpers).
// Run one file's tests with `cargo test -p tokenwatch --test e2e <module>::`.

mod alerting_support;
mod auth_support;
mod common;
mod listener_tls_support;

mod alert_delivery;
mod alert_instances;
mod alert_storm;
mod audit;
mod auth;
mod browser_safety;
mod capture;
mod clickhouse_backend;
mod clickhouse_writers;
mod config_reload;
mod config_schema;
mod crash_and_cli;
mod debian_package;
mod deploy_artifacts;
mod drift_inputs;
mod engine_memory;
mod feedback_scores;
mod gpu_source;
mod gpu_xid;
mod grafana_dashboard;
mod hostile_input;
mod latency_sources;
mod listener_tls;
mod local_embeddings;
mod log_templates;
mod marker_sources;
mod markers;
mod metrics_cardinality;
mod operator_config;
mod otlp_http_payloads;
mod otlp_python_sdk;
mod proxy_e2e;
mod proxy_failures;
mod proxy_spans;
mod proxy_streaming_apis;
mod proxy_tls;
mod remote_write;
mod request_limits;
mod rules_export;
mod runtime_latency;
mod scrape_e2e;
mod sharded_collectors;
mod span_sampling;
mod spend;
mod timed;
mod top_tui;
mod ui_api;
mod ui_browser;
