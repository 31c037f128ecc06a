// Scrape source: pulls Prometheus/OpenMetrics endpoints of inference runtimes and GPU
// exporters on an interval and maps what it reads onto normalised signals.

use crate::config::{Config, HumanDuration};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScrapeConfig {
    /// Default interval between scrapes of a target (down to 1s).
    pub interval: HumanDuration,
    /// Default time allowed for one scrape.
    pub timeout: HumanDuration,
    pub targets: Vec<ScrapeTarget>,
}

impl Default for ScrapeConfig {
    fn default() -> Self {
        ScrapeConfig {
            interval: HumanDuration(Duration::from_secs(5)),
            timeout: HumanDuration(Duration::from_secs(3)),
            targets: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScrapeTarget {
    /// `http://host:port/metrics`
    pub url: String,
    /// Runtime (`vllm`, `tgi`, `sglang`, `triton`, `dcgm`); detected from metric names when absent.
    #[serde(default)]
    pub runtime: Option<String>,
    #[serde(default)]
    pub interval: Option<HumanDuration>,
    #[serde(default)]
    pub timeout: Option<HumanDuration>,
    /// Extra labels attached to everything read from this target.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

pub fn from_config(_cfg: &Config) -> anyhow::Result<Vec<Box<dyn super::Source>>> {
    Ok(Vec::new())
}
