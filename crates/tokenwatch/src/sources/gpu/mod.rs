// GPU source: reads devices and their processes through NVML (loaded at run time) or a
// recorded series, attributing process memory to containers and pods via cgroups.

use crate::config::{Config, HumanDuration};
use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuConfig {
    pub enabled: bool,
    /// Sampling interval (down to 200ms).
    pub interval: HumanDuration,
    /// Path of libnvidia-ml.so.1 when it is not on the loader path.
    pub nvml_library: Option<PathBuf>,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig { enabled: true, interval: HumanDuration(Duration::from_secs(1)), nvml_library: None }
    }
}

pub fn from_config(_cfg: &Config) -> anyhow::Result<Vec<Box<dyn super::Source>>> {
    Ok(Vec::new())
}
