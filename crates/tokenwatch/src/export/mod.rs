// Export stage: what leaves tokenwatch for other tools. The Prometheus `/metrics` exposition
// and its remote write (`export:` in the configuration); ClickHouse will sit beside them.

pub mod otlp;
pub mod prometheus;
pub mod remote_write;

/// `export:` in the configuration.
#[derive(Debug, Clone, Default, serde::Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExportConfig {
    /// The `/metrics` exposition's options (`tenant_label`).
    pub prometheus: prometheus::PrometheusExportConfig,
    /// Prometheus remote-write endpoints that receive what `/metrics` serves.
    pub remote_write: Vec<remote_write::RemoteWriteConfig>,
    /// An OTLP endpoint that receives the proxy's spans (and, optionally, received ones).
    pub otlp: Option<otlp::OtlpExportConfig>,
}
