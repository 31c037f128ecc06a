// OTLP source: receives OpenTelemetry traces, metrics and logs over gRPC and HTTP and turns
// GenAI spans into request records and GenAI metrics into normalised signals.

use crate::config::Config;
use serde::Deserialize;
use std::net::SocketAddr;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OtlpConfig {
    pub enabled: bool,
    pub grpc_listen: SocketAddr,
    pub http_listen: SocketAddr,
    /// Largest accepted request (after decompression).
    pub max_request_bytes: usize,
}

impl Default for OtlpConfig {
    fn default() -> Self {
        OtlpConfig {
            enabled: true,
            grpc_listen: SocketAddr::from(([127, 0, 0, 1], 4317)),
            http_listen: SocketAddr::from(([127, 0, 0, 1], 4318)),
            max_request_bytes: 8 * 1024 * 1024,
        }
    }
}

pub fn from_config(_cfg: &Config) -> anyhow::Result<Vec<Box<dyn super::Source>>> {
    Ok(Vec::new())
}
