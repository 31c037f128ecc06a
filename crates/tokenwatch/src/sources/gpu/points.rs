// Turns a GPU snapshot into normalised signal points: per device memory, utilisation,
// temperature and power (device_id = GPU UUID), and per process GPU memory with its container.

use super::reader::{DeviceReading, GpuSnapshot, ProcessReading};
use std::collections::BTreeMap;
use tokenwatch_core::signals::{SignalPoint, names};

/// Per-process GPU memory; `device_id` is `<gpu uuid>/<pid>` so every process is its own series.
pub const GPU_PROCESS_MEMORY_BYTES: &str = "gpu_process_memory_bytes";

/// What is the same for every point of one read.
pub struct PointContext<'a> {
    /// `nvml` or `replay`.
    pub source: &'a str,
    pub instance: &'a str,
    /// GPU UUID or index (as text) → model served on it.
    pub device_models: &'a BTreeMap<String, String>,
    pub timestamp_unix_ms: i64,
}

impl PointContext<'_> {
    pub fn model_of(&self, d: &DeviceReading) -> String {
        self.device_models
            .get(&d.uuid)
            .or_else(|| self.device_models.get(&d.index.to_string()))
            .cloned()
            .unwrap_or_default()
    }

    fn point(
        &self,
        model_id: &str,
        signal: &str,
        value: f64,
        device_id: &str,
        notes: BTreeMap<String, String>,
    ) -> SignalPoint {
        SignalPoint {
            model_id: model_id.to_string(),
            signal: signal.to_string(),
            value,
            source: self.source.to_string(),
            runtime: String::new(),
            instance: self.instance.to_string(),
            device_id: device_id.to_string(),
            timestamp_unix_ms: self.timestamp_unix_ms,
            notes,
        }
    }
}

/// Every signal point of one snapshot. Readings a device did not report are left out.
pub fn snapshot_points(snap: &GpuSnapshot, ctx: &PointContext<'_>) -> Vec<SignalPoint> {
    let mut out = Vec::with_capacity(snap.devices.len() * 6 + snap.processes.len());
    let mut models: BTreeMap<&str, String> = BTreeMap::new();
    for d in &snap.devices {
        let model = ctx.model_of(d);
        let notes = BTreeMap::from([
            ("index".to_string(), d.index.to_string()),
            ("name".to_string(), d.name.clone()),
            ("pci_bus_id".to_string(), d.pci_bus_id.clone()),
        ]);
        let values = [
            (
                names::GPU_MEMORY_USED_BYTES,
                Some(d.memory_used_bytes as f64),
            ),
            (
                names::GPU_MEMORY_TOTAL_BYTES,
                Some(d.memory_total_bytes as f64),
            ),
            (names::GPU_MEMORY_USED_RATIO, d.memory_used_ratio()),
            (names::GPU_UTILIZATION, d.utilization),
            (names::GPU_TEMPERATURE_CELSIUS, d.temperature_c),
            (names::GPU_POWER_WATTS, d.power_w),
        ];
        for (signal, value) in values {
            if let Some(v) = value {
                out.push(ctx.point(&model, signal, v, &d.uuid, notes.clone()));
            }
        }
        models.insert(&d.uuid, model);
    }
    for p in &snap.processes {
        let model = models
            .get(p.device_uuid.as_str())
            .cloned()
            .unwrap_or_default();
        let device_id = format!("{}/{}", p.device_uuid, p.pid);
        out.push(ctx.point(
            &model,
            GPU_PROCESS_MEMORY_BYTES,
            p.used_memory_bytes as f64,
            &device_id,
            process_notes(p),
        ));
    }
    out
}

fn process_notes(p: &ProcessReading) -> BTreeMap<String, String> {
    let mut notes = BTreeMap::from([
        ("pid".to_string(), p.pid.to_string()),
        ("device_uuid".to_string(), p.device_uuid.clone()),
    ]);
    if let Some(c) = &p.container {
        if !c.runtime.is_empty() {
            notes.insert("container_runtime".into(), c.runtime.clone());
        }
        if let Some(id) = &c.container_id {
            notes.insert("container_id".into(), id.clone());
        }
        if let Some(uid) = &c.pod_uid {
            notes.insert("pod_uid".into(), uid.clone());
        }
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::gpu::reader::ContainerRef;

    fn snap() -> GpuSnapshot {
        GpuSnapshot {
            devices: vec![
                DeviceReading {
                    index: 0,
                    uuid: "GPU-a".into(),
                    name: "NVIDIA H200".into(),
                    pci_bus_id: "00000000:18:00.0".into(),
                    memory_used_bytes: 25,
                    memory_total_bytes: 100,
                    utilization: Some(0.03),
                    temperature_c: Some(40.0),
                    power_w: Some(120.5),
                },
                DeviceReading {
                    index: 1,
                    uuid: "GPU-b".into(),
                    name: String::new(),
                    pci_bus_id: String::new(),
                    memory_used_bytes: 0,
                    memory_total_bytes: 0,
                    utilization: None,
                    temperature_c: None,
                    power_w: None,
                },
            ],
            processes: vec![ProcessReading {
                pid: 42,
                device_uuid: "GPU-a".into(),
                used_memory_bytes: 20,
                container: Some(ContainerRef {
                    runtime: "containerd".into(),
                    container_id: Some("c".repeat(64)),
                    pod_uid: Some("5c2e3b8a-1d4f-4e6a-9b7c-0a1b2c3d4e5f".into()),
                }),
            }],
        }
    }

    #[test]
    fn devices_and_processes_become_points() {
        let models = BTreeMap::from([("0".to_string(), "llama-8b".to_string())]);
        let ctx = PointContext {
            source: "replay",
            instance: "host1",
            device_models: &models,
            timestamp_unix_ms: 7,
        };
        let points = snapshot_points(&snap(), &ctx);
        let find = |signal: &str, device: &str| {
            points
                .iter()
                .find(|p| p.signal == signal && p.device_id == device)
        };
        let used = find(names::GPU_MEMORY_USED_BYTES, "GPU-a").unwrap();
        assert_eq!(
            (used.value, used.model_id.as_str(), used.source.as_str()),
            (25.0, "llama-8b", "replay")
        );
        assert_eq!(
            (used.instance.as_str(), used.timestamp_unix_ms),
            ("host1", 7)
        );
        assert_eq!(used.notes["pci_bus_id"], "00000000:18:00.0");
        assert_eq!(
            find(names::GPU_MEMORY_USED_RATIO, "GPU-a").unwrap().value,
            0.25
        );
        assert_eq!(find(names::GPU_UTILIZATION, "GPU-a").unwrap().value, 0.03);
        assert_eq!(
            find(names::GPU_TEMPERATURE_CELSIUS, "GPU-a").unwrap().value,
            40.0
        );
        assert_eq!(find(names::GPU_POWER_WATTS, "GPU-a").unwrap().value, 120.5);
        // Device b: only memory used/total (no ratio with an unknown total, no optional readings), no model.
        let b: Vec<&str> = points
            .iter()
            .filter(|p| p.device_id == "GPU-b")
            .map(|p| p.signal.as_str())
            .collect();
        assert_eq!(
            b,
            vec![names::GPU_MEMORY_USED_BYTES, names::GPU_MEMORY_TOTAL_BYTES]
        );
        assert!(
            points
                .iter()
                .filter(|p| p.device_id == "GPU-b")
                .all(|p| p.model_id.is_empty())
        );
        let proc_ = find(GPU_PROCESS_MEMORY_BYTES, "GPU-a/42").unwrap();
        assert_eq!((proc_.value, proc_.model_id.as_str()), (20.0, "llama-8b"));
        assert_eq!(proc_.notes["pid"], "42");
        assert_eq!(proc_.notes["container_id"], "c".repeat(64));
        assert_eq!(
            proc_.notes["pod_uid"],
            "5c2e3b8a-1d4f-4e6a-9b7c-0a1b2c3d4e5f"
        );
        assert_eq!(proc_.notes["container_runtime"], "containerd");
        assert_eq!(points.len(), 6 + 2 + 1);
    }

    #[test]
    fn models_map_by_uuid_before_index() {
        let models = BTreeMap::from([
            ("0".to_string(), "by-index".to_string()),
            ("GPU-a".to_string(), "by-uuid".to_string()),
        ]);
        let ctx = PointContext {
            source: "nvml",
            instance: "h",
            device_models: &models,
            timestamp_unix_ms: 0,
        };
        assert_eq!(ctx.model_of(&snap().devices[0]), "by-uuid");
    }
}
