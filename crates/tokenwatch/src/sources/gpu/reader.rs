// The boundary between the GPU source and whatever reads the GPUs (NVML, a replayed recording):
// the `GpuReader` trait, the snapshot it returns, and its error type.

use serde::{Deserialize, Serialize};

/// One reading of every GPU of the machine and of the processes using them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuSnapshot {
    pub devices: Vec<DeviceReading>,
    #[serde(default)]
    pub processes: Vec<ProcessReading>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceReading {
    pub index: u32,
    /// `GPU-xxxxxxxx-…`, stable across reboots; used as `device_id`.
    pub uuid: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub pci_bus_id: String,
    pub memory_used_bytes: u64,
    pub memory_total_bytes: u64,
    /// Fraction of the sample period a kernel ran, 0..1 (absent where NVML does not support it, e.g. MIG).
    #[serde(default)]
    pub utilization: Option<f64>,
    #[serde(default)]
    pub temperature_c: Option<f64>,
    #[serde(default)]
    pub power_w: Option<f64>,
}

impl DeviceReading {
    /// Memory used / total, or `None` when the total is unknown (0).
    pub fn memory_used_ratio(&self) -> Option<f64> {
        (self.memory_total_bytes > 0)
            .then(|| self.memory_used_bytes as f64 / self.memory_total_bytes as f64)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessReading {
    pub pid: u32,
    pub device_uuid: String,
    /// GPU memory the process holds on that device (0 where the driver does not say).
    pub used_memory_bytes: u64,
    /// Container/pod the process runs in, from its cgroup (filled by the source, not the reader).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<ContainerRef>,
}

/// Which container (and Kubernetes pod) a process belongs to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerRef {
    /// `docker`, `containerd`, `cri-o`, `podman`, or empty when the cgroup does not say.
    #[serde(default)]
    pub runtime: String,
    /// 64-hex container id, when found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// Kubernetes pod UID (with dashes), when found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// The backend cannot run on this machine (no NVML library, no driver, no GPU).
    #[error("{0}")]
    Unavailable(String),
    /// One read failed; the next may succeed.
    #[error("{0}")]
    Read(String),
}

/// Reads all GPUs at once. Calls block (NVML talks to the driver), so run them off the async runtime.
pub trait GpuReader: Send {
    fn read(&mut self) -> Result<GpuSnapshot, GpuError>;
    /// What is read, for logs and the API (`NVML 550.54 (libnvidia-ml.so.1)`, `replay of x.jsonl`).
    fn describe(&self) -> String;
    /// `nvml` or `replay`: the `source` of the signal points.
    fn backend(&self) -> &'static str;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_round_trips_and_optional_fields_default() {
        let line = r#"{"devices":[{"index":0,"uuid":"GPU-1","memory_used_bytes":5,"memory_total_bytes":10}]}"#;
        let s: GpuSnapshot = serde_json::from_str(line).unwrap();
        assert_eq!(s.devices[0].utilization, None);
        assert!(s.processes.is_empty());
        assert_eq!(s.devices[0].memory_used_ratio(), Some(0.5));
        let back: GpuSnapshot = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }
}
