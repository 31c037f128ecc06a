// `GET /api/v1/gpus`: whether GPU telemetry runs (and why not), its backend, and the latest
// reading of every device with the processes on it and their container/pod.

use super::reader::{DeviceReading, ProcessReading};
use super::sampler::{GpuState, SharedGpuState};
use axum::Json;
use axum::extract::State;
use axum::routing::get;
use serde_json::{Value, json};

pub fn router(state: SharedGpuState) -> axum::Router {
    axum::Router::new()
        .route("/api/v1/gpus", get(gpus))
        .with_state(state)
}

async fn gpus(State(state): State<SharedGpuState>) -> Json<Value> {
    let st = state.read().unwrap_or_else(|p| p.into_inner());
    Json(render(&st))
}

/// The response body, built from the source's own latest snapshot.
pub fn render(st: &GpuState) -> Value {
    let mut body = serde_json::to_value(st).unwrap_or_else(|_| json!({}));
    let devices: Vec<Value> = match &st.latest {
        Some(snap) => snap
            .devices
            .iter()
            .map(|d| {
                let procs: Vec<&ProcessReading> = snap
                    .processes
                    .iter()
                    .filter(|p| p.device_uuid == d.uuid)
                    .collect();
                device_json(d, model_of(st, d), &procs)
            })
            .collect(),
        None => Vec::new(),
    };
    if let Some(obj) = body.as_object_mut() {
        obj.insert("devices".into(), json!(devices));
    }
    body
}

fn model_of<'a>(st: &'a GpuState, d: &DeviceReading) -> &'a str {
    st.device_models
        .get(&d.uuid)
        .or_else(|| st.device_models.get(&d.index.to_string()))
        .map(String::as_str)
        .unwrap_or("")
}

fn device_json(d: &DeviceReading, model_id: &str, procs: &[&ProcessReading]) -> Value {
    json!({
        "index": d.index,
        "uuid": d.uuid,
        "name": d.name,
        "pci_bus_id": d.pci_bus_id,
        "model_id": model_id,
        "memory_used_bytes": d.memory_used_bytes,
        "memory_total_bytes": d.memory_total_bytes,
        "memory_used_ratio": d.memory_used_ratio(),
        "utilization": d.utilization,
        "temperature_celsius": d.temperature_c,
        "power_watts": d.power_w,
        "processes": procs.iter().map(|p| json!({
            "pid": p.pid,
            "used_memory_bytes": p.used_memory_bytes,
            "container": p.container,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::gpu::reader::{ContainerRef, GpuSnapshot};

    #[test]
    fn disabled_state_says_why() {
        let st = GpuState {
            enabled: false,
            reason: Some("no NVML".into()),
            backend: "nvml".into(),
            ..Default::default()
        };
        let v = render(&st);
        assert_eq!(
            (v["enabled"].as_bool(), v["reason"].as_str()),
            (Some(false), Some("no NVML"))
        );
        assert_eq!(v["devices"], json!([]));
    }

    #[test]
    fn devices_carry_their_processes() {
        let snap = GpuSnapshot {
            devices: vec![DeviceReading {
                index: 0,
                uuid: "GPU-a".into(),
                name: "n".into(),
                pci_bus_id: "p".into(),
                memory_used_bytes: 1,
                memory_total_bytes: 4,
                utilization: None,
                temperature_c: Some(30.0),
                power_w: None,
            }],
            processes: vec![
                ProcessReading {
                    pid: 1,
                    device_uuid: "GPU-a".into(),
                    used_memory_bytes: 1,
                    container: Some(ContainerRef {
                        runtime: "docker".into(),
                        container_id: Some("x".into()),
                        pod_uid: None,
                    }),
                },
                ProcessReading {
                    pid: 2,
                    device_uuid: "GPU-other".into(),
                    used_memory_bytes: 1,
                    container: None,
                },
            ],
        };
        let st = GpuState {
            enabled: true,
            backend: "replay".into(),
            latest: Some(snap),
            ..Default::default()
        };
        let v = render(&st);
        let d = &v["devices"][0];
        assert_eq!(d["memory_used_ratio"], 0.25);
        assert_eq!(d["processes"].as_array().unwrap().len(), 1);
        assert_eq!(d["processes"][0]["container"]["container_id"], "x");
        assert!(v.get("latest").is_none());
    }
}
