// Convergence through the real binary: busy GPUs behind one PCIe switch leaking together (a GPU
// replay) page once, not once per GPU; CUDA OOM spans of one root trace (OTLP/HTTP JSON) page once.

use crate::alerting_support;
use crate::common;

use alerting_support::{Hook, Stack};
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

const GIB: u64 = 1024 * 1024 * 1024;
const MIB: u64 = 1024 * 1024;

/// Four GPUs behind one switch (buses 0x18–0x1b), one behind another (0x41).
const GPUS: [(&str, &str); 5] = [
    (
        "GPU-00000000-aaaa-4000-8000-000000000000",
        "00000000:18:00.0",
    ),
    (
        "GPU-00000000-aaaa-4000-8000-000000000001",
        "00000000:19:00.0",
    ),
    (
        "GPU-00000000-aaaa-4000-8000-000000000002",
        "00000000:1A:00.0",
    ),
    (
        "GPU-00000000-aaaa-4000-8000-000000000003",
        "00000000:1B:00.0",
    ),
    (
        "GPU-00000000-aaaa-4000-8000-000000000004",
        "00000000:41:00.0",
    ),
];

/// A replay: `busy` GPUs at 95% utilisation, the others idle; after 10 flat samples the busy
/// ones grow 256 MiB per sample (a leak in the process they share) for `grow` samples.
fn write_replay(path: &Path, busy: usize, grow: u64) {
    let mut lines = Vec::new();
    for t in 0..(10 + grow) {
        let devices: Vec<Value> = GPUS
            .iter()
            .enumerate()
            .map(|(i, (uuid, bus))| {
                let leaking = i < busy;
                let used = 40 * GIB
                    + if leaking {
                        t.saturating_sub(10) * 256 * MIB
                    } else {
                        0
                    };
                json!({
                    "index": i, "uuid": uuid, "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": bus,
                    "memory_used_bytes": used, "memory_total_bytes": 80 * GIB,
                    "utilization": if leaking { 0.95 } else { 0.02 },
                    "temperature_c": 60.0, "power_w": 500.0
                })
            })
            .collect();
        lines.push(json!({ "devices": devices, "processes": [] }).to_string());
    }
    std::fs::write(path, lines.join("\n")).unwrap();
}

fn gpu_config(replay: &Path, hook: &str) -> String {
    let models: String = (0..GPUS.len())
        .map(|i| {
            format!(
                "    \"{i}\": {}\n",
                if i < 4 { "mixtral-8x22b" } else { "embedder" }
            )
        })
        .collect();
    format!(
        "gpu:\n  replay: {}\n  interval: 200ms\n  instance: node-a\n  device_models:\n{models}\
         alerting:\n  resolve_after: 10s\n  delivery:\n    webhooks: [{{url: \"{hook}\"}}]\n",
        replay.display()
    )
}

#[tokio::test]
async fn gpus_behind_one_switch_leaking_together_page_once() {
    let (hook, url) = Hook::serve().await;
    let tmp = tempfile::tempdir().unwrap();
    let replay = tmp.path().join("replay.jsonl");
    write_replay(&replay, 4, 40);
    let s = Stack::collector(&gpu_config(&replay, &url)).await;

    let switch = s
        .wait_firing("gpu_switch_saturation", Duration::from_secs(20), |_| true)
        .await;
    assert_eq!(
        switch["labels"]["pci_switch"], "node-a/0000:00-1f",
        "{switch:#}"
    );
    let devices = switch["last_event"]["evidence"]["devices"].clone();
    assert_eq!(
        devices,
        json!(GPUS[..4].iter().map(|g| g.0).collect::<Vec<_>>()),
        "{switch:#}"
    );
    // Every leaking GPU's own alert fires (the detector sees each one) but converges into the
    // switch alert: kept for the API with `inhibited_by`, not delivered.
    let deadline = Instant::now() + Duration::from_secs(20);
    let leaks = loop {
        let leaks: Vec<Value> = s
            .alerts()
            .await
            .into_iter()
            .filter(|a| a["rule"] == "gpu_memory_leak" && !a["fired_at_unix_ms"].is_null())
            .collect();
        if leaks.len() == 4 {
            break leaks;
        }
        assert!(
            Instant::now() < deadline,
            "expected four leak alerts, got {leaks:#?}\n{}",
            s.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    for l in &leaks {
        let by = l["annotations"]["inhibited_by"]
            .as_str()
            .unwrap_or_default();
        assert!(
            by.starts_with("gpu_switch_saturation"),
            "leak alert not converged into the switch alert: {l:#}"
        );
        assert_ne!(l["labels"]["device_id"], GPUS[4].0);
    }
    // Delivery settles: one alert paged for the whole switch.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let paged = hook.firing();
    assert_eq!(
        paged.iter().map(|(_, r)| r.as_str()).collect::<Vec<_>>(),
        ["gpu_switch_saturation"],
        "one delivered alert expected: {:#?}",
        hook.received.lock().unwrap()
    );
}

#[tokio::test]
async fn two_busy_gpus_are_below_the_convergence_threshold() {
    let (hook, url) = Hook::serve().await;
    let tmp = tempfile::tempdir().unwrap();
    let replay = tmp.path().join("replay.jsonl");
    write_replay(&replay, 2, 30);
    let s = Stack::collector(&gpu_config(&replay, &url)).await;
    // Two leaking GPUs: each pages on its own (nothing to converge), and no switch alert.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let paged = hook.firing();
        if paged.len() >= 2 {
            assert!(
                paged.iter().all(|(_, r)| r == "gpu_memory_leak"),
                "{paged:?}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "two leak alerts expected, got {paged:?}; alerts {:#?}",
            s.alerts().await
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let alerts = s.alerts().await;
    assert!(
        !alerts.iter().any(|a| a["rule"] == "gpu_switch_saturation"),
        "{alerts:#?}"
    );
    assert_eq!(hook.firing().len(), 2, "{:?}", hook.firing());
}

/// One trace: a root span and `oom` children (a call chain) reporting CUDA out-of-memory.
fn oom_trace(trace_id: &str, oom: usize) -> Vec<Value> {
    let start = common::now_ns() - 1_000_000_000;
    let mut spans = vec![json!({
        "traceId": trace_id, "spanId": format!("{:016x}", 1), "name": "POST /v1/chat/completions",
        "kind": 2, "startTimeUnixNano": start.to_string(), "endTimeUnixNano": (start + 900_000_000).to_string(),
        "status": {"code": 2, "message": "upstream failed"}
    })];
    let components = [
        "router",
        "tokenizer",
        "engine.prefill",
        "engine.decode",
        "kv_cache.alloc",
        "sampler",
        "postprocess",
    ];
    for i in 0..oom {
        spans.push(json!({
            "traceId": trace_id, "spanId": format!("{:016x}", i + 2),
            "parentSpanId": format!("{:016x}", i + 1),
            "name": components[i % components.len()], "kind": 1,
            "startTimeUnixNano": (start + (i as u128 + 1) * 1_000_000).to_string(),
            "endTimeUnixNano": (start + 800_000_000).to_string(),
            "status": {"code": 2, "message": "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.10 GiB total capacity)"}
        }));
    }
    spans
}

/// POSTs the spans of a trace as the `llm-gateway` service.
async fn post_spans(s: &Stack, spans: Vec<Value>) {
    common::otlp::post_otlp_spans(s.otlp_http, "llm-gateway", spans).await;
}

#[tokio::test]
async fn cuda_oom_spans_of_one_trace_page_once() {
    let (hook, url) = Hook::serve().await;
    let s = Stack::collector(&format!(
        "gpu:\n  enabled: false\nalerting:\n  delivery:\n    webhooks: [{{url: \"{url}\"}}]\n"
    ))
    .await;
    // Below the threshold: four OOM spans in one trace, and scattered single ones.
    post_spans(&s, oom_trace("11111111111111111111111111111111", 4)).await;
    for t in 0..3 {
        post_spans(
            &s,
            oom_trace(&format!("2222222222222222222222222222222{t}"), 1),
        )
        .await;
    }
    // The engine reads spans every 5 s: wait for two reads.
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert!(s.alerts().await.is_empty(), "{:#?}", s.alerts().await);

    // One failure spreading along a call chain: seven spans of one root trace.
    let root = "33333333333333333333333333333333";
    post_spans(&s, oom_trace(root, 7)).await;
    let a = s
        .wait_firing("cuda_oom_call_chain", Duration::from_secs(20), |_| true)
        .await;
    assert_eq!(a["severity"], "critical");
    assert_eq!(
        a["last_event"]["evidence"]["trace_ids"],
        json!([root]),
        "{a:#}"
    );
    // A second chain within the suppression window joins the same alert.
    post_spans(&s, oom_trace("44444444444444444444444444444444", 6)).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let alerts = s.alerts().await;
        assert_eq!(alerts.len(), 1, "one alert for both chains: {alerts:#?}");
        if alerts[0]["last_event"]["evidence"]["trace_ids"]
            .as_array()
            .is_some_and(|t| t.len() == 2)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "second chain never seen: {alerts:#?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(hook.firing().len(), 1, "{:?}", hook.firing());
}
