// `GET /api/v1/gpus`: whether GPU telemetry runs (and why not), its backend, and the latest
// reading of every device with the processes on it and their container/pod; GPUs read from
// scraped exporters (dcgm-exporter) are listed beside them with their pod.

use super::reader::{DeviceReading, ProcessReading};
use super::sampler::{GpuState, SharedGpuState};
use axum::Json;
use axum::extract::State;
use axum::routing::get;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use tokenwatch_core::signals::{SharedSignals, SignalPoint};

pub fn router(state: SharedGpuState, signals: SharedSignals) -> axum::Router {
    axum::Router::new()
        .route("/api/v1/gpus", get(gpus))
        .with_state((state, signals))
}

async fn gpus(State((state, signals)): State<(SharedGpuState, SharedSignals)>) -> Json<Value> {
    let mut body = {
        let st = state.read().unwrap_or_else(|p| p.into_inner());
        render(&st)
    };
    let points = signals.read().unwrap_or_else(|p| p.into_inner()).devices();
    if let Some(obj) = body.as_object_mut() {
        obj.insert("scraped".into(), Value::Array(scraped(&points)));
    }
    Json(body)
}

/// Notes of a scraped GPU's signals shown as fields of the device (dcgm-exporter labels).
const SCRAPED_FIELDS: [(&str, &str); 7] = [
    ("gpu", "gpu"),
    ("pci_bus_id", "pci_bus_id"),
    ("modelName", "name"),
    ("hostname", "hostname"),
    ("pod", "pod"),
    ("namespace", "namespace"),
    ("container", "container"),
];

/// GPUs whose signals come from a scraped exporter: one entry per (instance, device, model),
/// its latest value of each signal, and where it is (host, Kubernetes pod) from the notes.
pub fn scraped(points: &[SignalPoint]) -> Vec<Value> {
    let mut by_device: BTreeMap<(&str, &str, &str), Vec<&SignalPoint>> = BTreeMap::new();
    for p in points.iter().filter(|p| p.source.starts_with("scrape:")) {
        by_device
            .entry((&p.instance, &p.device_id, &p.model_id))
            .or_default()
            .push(p);
    }
    by_device
        .into_iter()
        .map(|((instance, device_id, model_id), ps)| {
            let mut d = Map::new();
            d.insert("instance".into(), json!(instance));
            d.insert("uuid".into(), json!(device_id));
            d.insert("model_id".into(), json!(model_id));
            // The newest point's notes: the pod holding the GPU can change.
            if let Some(newest) = ps.iter().max_by_key(|p| p.timestamp_unix_ms) {
                d.insert("source".into(), json!(newest.source));
                d.insert("updated_unix_ms".into(), json!(newest.timestamp_unix_ms));
                for (note, field) in SCRAPED_FIELDS {
                    if let Some(v) = newest.notes.get(note) {
                        d.insert(field.into(), json!(v));
                    }
                }
            }
            let signals: BTreeMap<&str, f64> =
                ps.iter().map(|p| (p.signal.as_str(), p.value)).collect();
            d.insert("signals".into(), json!(signals));
            Value::Object(d)
        })
        .collect()
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
    fn scraped_gpus_are_listed_with_their_pod() {
        let point = |signal: &str, value: f64, source: &str, pod: Option<&str>| SignalPoint {
            model_id: String::new(),
            signal: signal.into(),
            value,
            source: source.into(),
            runtime: "dcgm".into(),
            instance: "gpu1".into(),
            device_id: "GPU-a".into(),
            timestamp_unix_ms: 5,
            notes: pod
                .map(|p| {
                    BTreeMap::from([
                        ("pod".to_string(), p.to_string()),
                        ("namespace".to_string(), "serving".to_string()),
                        ("gpu".to_string(), "0".to_string()),
                    ])
                })
                .unwrap_or_default(),
        };
        let points = [
            point("gpu_utilization", 0.5, "scrape:dcgm", Some("vllm-0")),
            point(
                "gpu_tensor_active_ratio",
                0.25,
                "scrape:dcgm",
                Some("vllm-0"),
            ),
            point("gpu_utilization", 0.9, "nvml", None),
        ];
        let v = scraped(&points);
        assert_eq!(
            v.len(),
            1,
            "NVML points are the source's own devices: {v:#?}"
        );
        let d = &v[0];
        assert_eq!(
            (
                d["uuid"].as_str(),
                d["pod"].as_str(),
                d["namespace"].as_str(),
                d["gpu"].as_str()
            ),
            (Some("GPU-a"), Some("vllm-0"), Some("serving"), Some("0"))
        );
        assert_eq!(d["signals"]["gpu_tensor_active_ratio"], 0.25);
        assert_eq!(d["signals"]["gpu_utilization"], 0.5);
        assert!(d.get("container").is_none());
    }

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
