// GPU source: reads devices and their processes through NVML (loaded at run time) or a
// recorded series, attributing process memory to containers and pods via cgroups.

pub mod api;
pub mod cgroup;
pub mod nvml;
pub mod points;
pub mod reader;
pub mod replay;
pub mod sampler;

use crate::kernel::duration::HumanDuration;
use anyhow::Context;
use reader::{GpuError, GpuReader};
use sampler::{GpuMetrics, GpuState, Sampler, SharedGpuState};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// The shortest sampling interval accepted.
pub const MIN_INTERVAL: Duration = Duration::from_millis(200);

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuConfig {
    pub enabled: bool,
    /// Sampling interval (down to 200ms).
    pub interval: HumanDuration,
    /// Path of libnvidia-ml.so.1 when it is not on the loader path.
    pub nvml_library: Option<PathBuf>,
    /// Replay a recorded series (JSON lines, one snapshot per line) instead of reading NVML.
    pub replay: Option<PathBuf>,
    /// At the end of the replay, start again (true) or keep returning the last sample (false).
    pub replay_loop: bool,
    /// Where `<pid>/cgroup` files are read for container attribution.
    pub proc_root: PathBuf,
    /// `instance` of the GPU signals; the host name when unset.
    pub instance: Option<String>,
    /// GPU UUID or index → model served on it (the `model_id` of that GPU's signals).
    pub device_models: BTreeMap<String, String>,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            enabled: true,
            interval: HumanDuration(Duration::from_secs(1)),
            nvml_library: None,
            replay: None,
            replay_loop: false,
            proc_root: PathBuf::from("/proc"),
            instance: None,
            device_models: BTreeMap::new(),
        }
    }
}

impl GpuConfig {
    /// Checks serde cannot express: (key path, message) of the first problem.
    pub fn validate(&self) -> Result<(), (String, String)> {
        if self.interval.0 < MIN_INTERVAL {
            return Err((
                "gpu.interval".into(),
                format!(
                    "{}ms is below the minimum of 200ms",
                    self.interval.0.as_millis()
                ),
            ));
        }
        if self.instance.as_deref().is_some_and(str::is_empty) {
            return Err((
                "gpu.instance".into(),
                "must not be empty (leave it out to use the host name)".into(),
            ));
        }
        Ok(())
    }

    fn backend(&self) -> &'static str {
        if self.replay.is_some() {
            "replay"
        } else {
            "nvml"
        }
    }
}

/// The GPU source is always listed, so `/api/v1/gpus` and `/readyz` can say why it is off.
pub fn from_config(gpu: &GpuConfig) -> anyhow::Result<Vec<Box<dyn super::Source>>> {
    Ok(vec![Box::new(GpuSource { cfg: gpu.clone() })])
}

pub struct GpuSource {
    cfg: GpuConfig,
}

/// Open the configured reader. A replay that cannot be read is a configuration error (`Err`);
/// NVML missing is not (`Ok(Err(reason))`).
fn open_reader(cfg: &GpuConfig) -> anyhow::Result<Result<Box<dyn GpuReader>, GpuError>> {
    if let Some(path) = &cfg.replay {
        let r = replay::ReplayReader::open(path, cfg.replay_loop).map_err(anyhow::Error::msg)?;
        return Ok(Ok(Box::new(r)));
    }
    Ok(nvml::NvmlReader::open(cfg.nvml_library.as_deref())
        .map(|r| Box::new(r) as Box<dyn GpuReader>))
}

/// The host name (the default `instance` of GPU signals).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "localhost".into())
}

impl super::Source for GpuSource {
    fn name(&self) -> &'static str {
        "gpu"
    }

    fn start(self: Box<Self>, ctx: super::SourceContext) -> super::StartFuture {
        Box::pin(async move {
            let cfg = self.cfg;
            let instance = cfg.instance.clone().unwrap_or_else(hostname);
            let state: SharedGpuState = Arc::new(RwLock::new(GpuState {
                backend: cfg.backend().into(),
                interval_ms: cfg.interval.0.as_millis() as u64,
                instance: instance.clone(),
                device_models: cfg.device_models.clone(),
                ..Default::default()
            }));
            let disable = |reason: String| {
                ctx.host
                    .components
                    .set("gpu", format!("disabled: {reason}"));
                let mut st = state.write().unwrap_or_else(|p| p.into_inner());
                st.enabled = false;
                st.reason = Some(reason);
            };
            if !cfg.enabled {
                disable("gpu.enabled is false in the configuration".into());
                return Ok(super::SourceHandle {
                    request_path: None,
                    listening: Vec::new(),
                    tasks: Vec::new(),
                    routes: Some(api::router(state, ctx.signals.board.clone())),
                });
            }
            let for_open = cfg.clone();
            let opened = tokio::task::spawn_blocking(move || open_reader(&for_open))
                .await
                .context("opening the GPU reader")??;
            let reader = match opened {
                Ok(r) => r,
                Err(e) => {
                    let hint = if cfg.nvml_library.is_some() {
                        "check gpu.nvml_library"
                    } else {
                        "set gpu.nvml_library if libnvidia-ml.so.1 is installed elsewhere, or gpu.enabled: false to silence this"
                    };
                    tracing::info!("GPU telemetry disabled: {e} ({hint})");
                    disable(e.to_string());
                    return Ok(super::SourceHandle {
                        request_path: None,
                        listening: Vec::new(),
                        tasks: Vec::new(),
                        routes: Some(api::router(state, ctx.signals.board.clone())),
                    });
                }
            };
            tracing::info!(interval_ms = cfg.interval.0.as_millis() as u64, %instance, "GPU telemetry on: {}", reader.describe());
            {
                let mut st = state.write().unwrap_or_else(|p| p.into_inner());
                st.enabled = true;
                st.reader = reader.describe();
            }
            ctx.host.components.set("gpu", "ok");
            let metrics = GpuMetrics::default();
            metrics.register(&ctx.host.metrics);
            let sampler = Sampler::new(
                reader,
                cfg.proc_root.clone(),
                instance,
                cfg.device_models.clone(),
                ctx.signals.board.clone(),
                state.clone(),
                metrics,
            );
            let task = sampler.spawn(cfg.interval.0, ctx.host.shutdown);
            Ok(super::SourceHandle {
                request_path: None,
                listening: Vec::new(),
                tasks: vec![task],
                routes: Some(api::router(state, ctx.signals.board.clone())),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn interval_below_200ms_is_refused_with_its_key() {
        let c = Config::from_yaml("gpu:\n  interval: 200ms\n", "t.yaml").unwrap();
        assert_eq!(c.gpu.interval.0, MIN_INTERVAL);
        let err = Config::from_yaml("gpu:\n  interval: 150ms\n", "t.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("t.yaml") && err.contains("gpu.interval") && err.contains("200ms"),
            "{err}"
        );
        assert!(Config::from_yaml("gpu:\n  interval: 0s\n", "t.yaml").is_err());
    }

    #[test]
    fn defaults_and_full_config_parse() {
        let c = Config::from_yaml("", "t.yaml").unwrap();
        assert!(c.gpu.enabled && c.gpu.replay.is_none());
        assert_eq!(
            (c.gpu.interval.0, c.gpu.proc_root.clone()),
            (Duration::from_secs(1), PathBuf::from("/proc"))
        );
        let y = "gpu:\n  replay: x.jsonl\n  replay_loop: true\n  interval: 500ms\n  proc_root: /tmp/p\n  instance: node-1\n  device_models:\n    '0': llama\n    GPU-abc: qwen\n";
        let c = Config::from_yaml(y, "t.yaml").unwrap();
        assert_eq!(c.gpu.backend(), "replay");
        assert_eq!(c.gpu.device_models["0"], "llama");
        assert_eq!(c.gpu.device_models["GPU-abc"], "qwen");
        let err = Config::from_yaml("gpu:\n  replya: x\n", "t.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("replya"), "{err}");
    }

    #[test]
    fn a_bad_replay_is_a_configuration_error_but_missing_nvml_is_not() {
        let cfg = GpuConfig {
            replay: Some("/nonexistent/r.jsonl".into()),
            ..Default::default()
        };
        assert!(open_reader(&cfg).is_err());
        let cfg = GpuConfig {
            nvml_library: Some("/nonexistent/libnvidia-ml.so.1".into()),
            ..Default::default()
        };
        assert!(matches!(
            open_reader(&cfg),
            Ok(Err(GpuError::Unavailable(_)))
        ));
    }
}
