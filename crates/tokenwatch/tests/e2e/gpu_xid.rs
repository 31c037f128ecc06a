// dcgm-exporter through the binary: a fake exporter on 127.0.0.1 serves the real sample in
// Kubernetes mode (pod labels, profiling fields); /api/v1/gpus lists the GPU with its pod, and
// when its XID field turns to 79 while the simulator fails requests, the XID error is the root
// cause of the error_burst alert, with the code and its meaning, and the fatal code pages.

use crate::common;

use common::{Proc, get, run_tokenwatch, send, start_sim};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const DCGM_SAMPLE: &str = include_str!("../../../../fixtures/dcgm-exporter.txt");
const UUID: &str = "GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43";
const MODEL: &str = "sim-llama-8b";
const SIM_ARGS: &[&str] = &["--itl-ms", "4", "--max-tokens", "24", "--ttft-ms", "40"];

/// The sample as dcgm-exporter writes it in Kubernetes mode, with SM active and the last XID
/// code of the GPU.
fn dcgm_text(xid: u32) -> String {
    let k8s = r#"hostname="gpu1-wl8sg",container="vllm",namespace="serving",pod="vllm-0""#;
    let labels = format!(
        r#"gpu="0",UUID="{UUID}",pci_bus_id="00000000:00:07.0",device="nvidia0",modelName="NVIDIA L40S",{k8s}"#
    );
    let mut text = DCGM_SAMPLE.replace(r#"Hostname="gpu1-wl8sg""#, k8s);
    text.push_str(&format!(
        "# TYPE DCGM_FI_PROF_SM_ACTIVE gauge\nDCGM_FI_PROF_SM_ACTIVE{{{labels}}} 0.812000\n\
         # TYPE DCGM_FI_DEV_XID_ERRORS gauge\nDCGM_FI_DEV_XID_ERRORS{{{labels}}} {xid}\n"
    ));
    text
}

/// A dcgm-exporter stand-in on 127.0.0.1: `/metrics` answers `dcgm_text(xid)` with the code
/// set now. It stops when dropped.
struct FakeDcgm {
    target: common::metrics_target::MetricsTarget,
    xid: Arc<AtomicU32>,
}

impl FakeDcgm {
    async fn start() -> FakeDcgm {
        let xid = Arc::new(AtomicU32::new(0));
        let code = xid.clone();
        let target = common::metrics_target::MetricsTarget::start(move || {
            dcgm_text(code.load(Ordering::SeqCst))
        })
        .await;
        FakeDcgm { target, xid }
    }
}

/// Poll `url` until `check` accepts its JSON; fails with the last answer and the log.
async fn wait_json(url: &str, tw: &Proc, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = get(url).await;
        assert_eq!(r.status, 200, "{url}: {}", r.body);
        let v = r.json();
        if check(&v) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within 30 s; last {url}:\n{v:#}\nlog:\n{}",
            tw.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_xid_error_is_the_root_cause_of_the_error_burst_it_causes() {
    let dir = tempfile::tempdir().unwrap();
    let (_sim_proc, sim) = start_sim(dir.path(), SIM_ARGS).await;
    let dcgm = FakeDcgm::start().await;
    let cfg = dir.path().join("tokenwatch.yaml");
    std::fs::write(
        &cfg,
        format!(
            "scrape:\n  interval: 1s\n  targets:\n    - url: http://{}/metrics\nalerting:\n  resolve_after: 30s\n",
            dcgm.target.addr
        ),
    )
    .unwrap();
    let c = cfg.display().to_string();
    let (tw, api, proxy) =
        run_tokenwatch(dir.path(), &format!("http://{sim}"), &["--config", &c]).await;

    // The scraped GPU is listed with the pod holding it and its profiling ratios.
    let gpus_url = format!("http://{api}/api/v1/gpus");
    let gpu = |v: &Value| {
        v["scraped"]
            .as_array()
            .and_then(|a| a.iter().find(|d| d["uuid"] == UUID))
            .cloned()
    };
    let v = wait_json(&gpus_url, &tw, "the dcgm GPU", |v| gpu(v).is_some()).await;
    let d = gpu(&v).unwrap();
    assert_eq!(
        (&d["pod"], &d["namespace"], &d["container"], &d["instance"]),
        (
            &json!("vllm-0"),
            &json!("serving"),
            &json!("vllm"),
            &json!("gpu1-wl8sg")
        ),
        "{d:#}"
    );
    assert_eq!(d["signals"]["gpu_sm_active_ratio"], 0.812, "{d:#}");
    assert_eq!(d["signals"]["gpu_dram_active_ratio"], 0.000131, "{d:#}");
    assert_eq!(d["signals"]["gpu_xid_last_code"], 0.0, "{d:#}");
    let signals = get(&format!("http://{api}/api/v1/signals")).await.json();
    let tensor = signals["signals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["signal"] == "gpu_tensor_active_ratio" && p["device_id"] == UUID)
        .unwrap_or_else(|| panic!("no tensor ratio: {signals:#}"));
    assert_eq!(tensor["notes"]["pod"], "vllm-0");
    // The profiling ratios are on /metrics with the GPU's other signals.
    let metrics = get(&format!("http://{api}/metrics")).await.body;
    let sm = metrics
        .lines()
        .find(|l| l.starts_with("tokenwatch_gpu_sm_active_ratio{") && l.contains(UUID))
        .unwrap_or_else(|| panic!("no SM active ratio on /metrics:\n{metrics}"));
    assert!(
        sm.ends_with(" 0.812") && sm.contains("instance=\"gpu1-wl8sg\""),
        "{sm}"
    );

    // Traffic, then the GPU falls off the bus and the runtime's requests fail.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let clients = common::chat_traffic(proxy, MODEL, 4, stop.clone(), done.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    while done.load(Ordering::Relaxed) < 80 {
        assert!(
            Instant::now() < deadline,
            "only {} requests in 30 s",
            done.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    dcgm.xid.store(79, Ordering::SeqCst);
    wait_json(&gpus_url, &tw, "XID 79 scraped", |v| {
        gpu(v).is_some_and(|d| d["signals"]["gpu_xid_last_code"] == 79.0)
    })
    .await;
    let r = send(
        "POST",
        &format!("http://{sim}/admin/faults"),
        Some(&json!({"spec": "error_burst:rate=0.5"}).to_string()),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);

    let alerts_url = format!("http://{api}/api/v1/alerts");
    let v = wait_json(&alerts_url, &tw, "the error_burst alert", |v| {
        v["alerts"].as_array().is_some_and(|a| {
            a.iter()
                .any(|a| a["rule"] == "error_burst" && !a["fired_at_unix_ms"].is_null())
        })
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        let _ = tokio::time::timeout(Duration::from_secs(10), c).await;
    }
    let alert = v["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["rule"] == "error_burst" && !a["fired_at_unix_ms"].is_null())
        .unwrap();
    let causes = alert["root_cause"].as_array().cloned().unwrap_or_default();
    let top = causes
        .first()
        .unwrap_or_else(|| panic!("no root cause: {alert:#}"));
    assert_eq!(top["detector"], "gpu_xid_error", "{alert:#}");
    assert_eq!(top["path"], json!(["gpu_xid_error", "error_burst"]));
    assert_eq!(
        (
            &top["labels"]["xid"],
            &top["labels"]["pod"],
            &top["labels"]["device_id"]
        ),
        (&json!("79"), &json!("vllm-0"), &json!(UUID)),
        "{top:#}"
    );
    let summary = top["summary"].as_str().unwrap();
    assert!(
        summary.contains("XID 79 (GPU has fallen off the bus)")
            && summary.contains("pod serving/vllm-0"),
        "{summary}"
    );
    assert!(
        alert["annotations"]["root_cause"]
            .as_str()
            .unwrap_or("")
            .contains("gpu_xid_error"),
        "{alert:#}"
    );
    // An XID error is no alert of its own; a fatal code (79) pages through the gpu_xid_fatal
    // rule of the default set, per GPU.
    let alerts = v["alerts"].as_array().unwrap();
    assert!(alerts.iter().all(|a| a["rule"] != "gpu_xid_error"), "{v:#}");
    let fatal = alerts
        .iter()
        .find(|a| a["rule"] == "gpu_xid_fatal")
        .unwrap_or_else(|| panic!("no gpu_xid_fatal alert: {v:#}"));
    assert_eq!(
        (
            &fatal["labels"]["device_id"],
            &fatal["labels"]["instance"],
            &fatal["severity"]
        ),
        (&json!(UUID), &json!("gpu1-wl8sg"), &json!("critical")),
        "{fatal:#}"
    );
    assert!(
        fatal["annotations"]["summary"]
            .as_str()
            .unwrap_or("")
            .contains("XID 79 (GPU has fallen off the bus)"),
        "{fatal:#}"
    );
}
