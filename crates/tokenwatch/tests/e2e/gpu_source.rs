// GPU source end to end: the real binary replays a recorded leaking GPU (with cgroup files for its
// processes) and serves it on /api/v1/gpus and /api/v1/signals; without NVML it disables itself quietly.

use crate::common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MIB: f64 = 1024.0 * 1024.0;
const LEAKY_GPU: &str = "GPU-5f1c2a9e-7b3d-4e8f-a1c6-2d9e8b7f4a30";
const DOCKER_GPU: &str = "GPU-b83e61d4-0c2a-4f97-8e5b-61a7c3d9e2f1";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name)
}

/// `tokenwatch run` without an upstream, on ports it picks, with `config` as its configuration
/// file, once ready: (process, API address).
async fn start(dir: &Path, config: &str) -> (Proc, std::net::SocketAddr) {
    let cfg_path = dir.join("tokenwatch.yaml");
    std::fs::write(&cfg_path, config).unwrap();
    let (data, cfg) = (
        dir.join("data").to_string_lossy().into_owned(),
        cfg_path.to_string_lossy().into_owned(),
    );
    let args = [
        "run",
        "-c",
        &cfg,
        "--listen",
        ANY,
        "--data-dir",
        &data,
        "--otlp-grpc-listen",
        ANY,
        "--otlp-http-listen",
        ANY,
    ];
    let tw = Proc::start("tokenwatch", &args, dir);
    let (api, _) = ready_on(&tw).await;
    (tw, api)
}

async fn json_of(url: &str) -> Value {
    let r = get(url).await;
    assert_eq!(r.status, 200, "{url}: {}", r.body);
    r.json()
}

fn signal<'a>(signals: &'a Value, name: &str, device: &str) -> Option<&'a Value> {
    signals["signals"]
        .as_array()?
        .iter()
        .find(|p| p["signal"] == name && p["device_id"] == device)
}

#[tokio::test]
async fn replayed_leak_shows_in_gpus_and_signals_with_containers() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "gpu:\n  replay: {}\n  interval: 200ms\n  proc_root: {}\n  instance: node-a\n  device_models:\n    \"0\": leaky-model\n",
        fixture("gpu-leak-replay.jsonl").display(),
        fixture("gpu-leak-proc").display()
    );
    let (mut tw, api) = start(dir.path(), &config).await;

    let ready = json_of(&format!("http://{api}/readyz")).await;
    assert_eq!(ready["components"]["gpu"], "ok", "{ready}");

    // Wait for a few reads.
    let deadline = Instant::now() + Duration::from_secs(20);
    let gpus = loop {
        let g = json_of(&format!("http://{api}/api/v1/gpus")).await;
        if g["reads"].as_u64().unwrap_or(0) >= 3 {
            break g;
        }
        assert!(
            Instant::now() < deadline,
            "no GPU reads after 20s: {g}\nlog:\n{}",
            tw.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        (gpus["enabled"].as_bool(), gpus["backend"].as_str()),
        (Some(true), Some("replay")),
        "{gpus}"
    );
    assert_eq!(
        (gpus["instance"].as_str(), gpus["interval_ms"].as_u64()),
        (Some("node-a"), Some(200))
    );
    let devices = gpus["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2, "{gpus}");
    let leaky = &devices[0];
    assert_eq!(
        (leaky["uuid"].as_str(), leaky["model_id"].as_str()),
        (Some(LEAKY_GPU), Some("leaky-model"))
    );
    assert_eq!(leaky["pci_bus_id"], "00000000:18:00.0");
    assert_eq!(leaky["name"], "NVIDIA H200");
    let p = &leaky["processes"][0];
    assert_eq!(p["pid"], 4242);
    assert_eq!(p["container"]["runtime"], "containerd", "{p}");
    assert_eq!(
        p["container"]["pod_uid"],
        "5c2e3b8a-1d4f-4e6a-9b7c-0a1b2c3d4e5f"
    );
    assert_eq!(
        p["container"]["container_id"].as_str().map(str::len),
        Some(64)
    );
    let docker = &devices[1];
    assert_eq!(docker["uuid"], DOCKER_GPU);
    let p = &docker["processes"][0];
    assert_eq!(
        (p["pid"].as_u64(), p["container"]["runtime"].as_str()),
        (Some(5151), Some("docker")),
        "{p}"
    );
    assert_eq!(
        p["container"]["container_id"],
        "e4a1b7c3d9f2068a5b1c4e7d0a3f6b9c2e5d8a1b4c7f0e3d6a9b2c5f8e1d4a7b"
    );
    assert!(p["container"].get("pod_uid").is_none(), "{p}");

    // The leaking device's memory grows in steps of 256 MiB, with utilisation < 5%.
    let url = format!("http://{api}/api/v1/signals?model=leaky-model");
    let first = json_of(&url).await;
    let used =
        |s: &Value| signal(s, "gpu_memory_used_bytes", LEAKY_GPU).and_then(|p| p["value"].as_f64());
    let v1 =
        used(&first).unwrap_or_else(|| panic!("no gpu_memory_used_bytes for {LEAKY_GPU}: {first}"));
    let point = signal(&first, "gpu_memory_used_bytes", LEAKY_GPU).unwrap();
    assert_eq!(
        (point["source"].as_str(), point["instance"].as_str()),
        (Some("replay"), Some("node-a"))
    );
    assert!(
        signal(&first, "gpu_utilization", LEAKY_GPU).unwrap()["value"]
            .as_f64()
            .unwrap()
            < 0.05
    );
    for name in [
        "gpu_memory_total_bytes",
        "gpu_memory_used_ratio",
        "gpu_temperature_celsius",
        "gpu_power_watts",
    ] {
        assert!(
            signal(&first, name, LEAKY_GPU).is_some(),
            "missing {name}: {first}"
        );
    }
    // The next reading that differs (a 200 ms replay interval).
    let deadline = Instant::now() + Duration::from_secs(10);
    let v2 = loop {
        let second = json_of(&url).await;
        let v2 = used(&second).unwrap();
        if v2 != v1 {
            break v2;
        }
        assert!(
            Instant::now() < deadline,
            "gpu_memory_used_bytes of {LEAKY_GPU} still {v1} after 10 s: {second}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let grown_mib = (v2 - v1) / MIB;
    assert!(
        grown_mib >= 256.0 && grown_mib % 256.0 == 0.0,
        "expected growth in 256 MiB steps, got {grown_mib} MiB"
    );

    // Per-process memory, with its container, and the other device's signals (no model mapped).
    let all = json_of(&format!("http://{api}/api/v1/signals")).await;
    let proc_point = signal(
        &all,
        "gpu_process_memory_bytes",
        &format!("{DOCKER_GPU}/5151"),
    )
    .unwrap();
    assert_eq!(proc_point["notes"]["pid"], "5151");
    assert_eq!(
        proc_point["notes"]["container_id"].as_str().map(str::len),
        Some(64)
    );
    assert_eq!(
        signal(&all, "gpu_memory_used_bytes", DOCKER_GPU).unwrap()["model_id"],
        ""
    );

    let metrics = get(&format!("http://{api}/metrics")).await.body;
    assert!(
        metric_value(&metrics, "tokenwatch_gpu_reads_total").unwrap_or(0.0) >= 3.0,
        "{metrics}"
    );
    assert_eq!(metric_value(&metrics, "tokenwatch_gpu_devices"), Some(2.0));
    assert_eq!(
        metric_value(&metrics, "tokenwatch_gpu_read_errors_total"),
        Some(0.0)
    );

    assert!(tw.terminate().success(), "log:\n{}", tw.log());
    let log = tw.log();
    assert!(log.contains("GPU telemetry on: replay of"), "{log}");
}

#[tokio::test]
async fn without_nvml_the_source_is_disabled_and_nothing_else_changes() {
    // Default configuration: on a machine without NVML the source disables itself. (On a GPU
    // machine the same test checks that the real devices are read instead.)
    let dir = tempfile::tempdir().unwrap();
    let (mut tw, api) = start(dir.path(), "").await;
    let gpus = json_of(&format!("http://{api}/api/v1/gpus")).await;
    let ready = json_of(&format!("http://{api}/readyz")).await;
    assert_eq!(ready["ready"], true, "{ready}");
    if gpus["enabled"] == true {
        assert_eq!(
            (
                ready["components"]["gpu"].as_str(),
                gpus["backend"].as_str()
            ),
            (Some("ok"), Some("nvml"))
        );
        eprintln!("NVML is present here: checked the real GPU path instead: {gpus}");
        assert!(tw.terminate().success());
        return;
    }
    assert_disabled(&mut tw, api, &gpus, &ready).await;

    // An explicit library path that does not exist gives the same answer on any machine.
    let dir = tempfile::tempdir().unwrap();
    let (mut tw, api) = start(
        dir.path(),
        "gpu:\n  nvml_library: /nonexistent/libnvidia-ml.so.1\n",
    )
    .await;
    let gpus = json_of(&format!("http://{api}/api/v1/gpus")).await;
    let ready = json_of(&format!("http://{api}/readyz")).await;
    assert!(
        gpus["reason"]
            .as_str()
            .unwrap_or("")
            .contains("/nonexistent/libnvidia-ml.so.1"),
        "{gpus}"
    );
    assert_disabled(&mut tw, api, &gpus, &ready).await;
}

async fn assert_disabled(tw: &mut Proc, api: std::net::SocketAddr, gpus: &Value, ready: &Value) {
    let reason = gpus["reason"]
        .as_str()
        .unwrap_or_else(|| panic!("no reason: {gpus}"));
    assert!(reason.contains("NVML"), "{reason}");
    assert_eq!(
        (gpus["enabled"].as_bool(), gpus["backend"].as_str()),
        (Some(false), Some("nvml"))
    );
    assert_eq!(gpus["devices"], serde_json::json!([]));
    let component = ready["components"]["gpu"].as_str().unwrap();
    assert!(component.starts_with("disabled: "), "{ready}");
    assert_eq!(ready["ready"], true);
    // Everything else answers as usual, and no GPU signal or metric appears.
    assert_eq!(get(&format!("http://{api}/healthz")).await.status, 200);
    let signals = json_of(&format!("http://{api}/api/v1/signals")).await;
    assert!(!signals.to_string().contains("gpu_"), "{signals}");
    assert_eq!(
        get(&format!("http://{api}/api/v1/latency")).await.status,
        200
    );
    let metrics = get(&format!("http://{api}/metrics")).await;
    assert_eq!(metrics.status, 200);
    assert!(
        !metrics.body.contains("tokenwatch_gpu_"),
        "{}",
        metrics.body
    );
    assert!(tw.terminate().success(), "log:\n{}", tw.log());
    // Exactly one log line about the GPU, saying why it is off.
    let log = tw.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.to_ascii_lowercase().contains("gpu") || l.contains("NVML"))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "expected one GPU line, got:\n{}",
        lines.join("\n")
    );
    assert!(
        lines[0].contains("GPU telemetry disabled") && lines[0].contains(reason),
        "{}",
        lines[0]
    );
}

#[tokio::test]
async fn an_interval_below_200ms_is_a_configuration_error() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.yaml");
    std::fs::write(&cfg, "gpu:\n  interval: 100ms\n").unwrap();
    let out = std::process::Command::new(BIN)
        .args(["check-config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("bad.yaml") && stderr.contains("gpu.interval") && stderr.contains("200ms"),
        "{stderr}"
    );
}
