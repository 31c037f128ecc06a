// Log templates through the real binary: a vLLM-shaped log replayed through the file source is
// mined into stable templates that survive a restart (same ids, offsets resumed, counts not
// doubled); a CUDA OOM burst then raises an anomaly named in the root cause of the error alert.

use crate::common;

use common::{Proc, get, run_tokenwatch, send, start_sim};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A vLLM 0.6 server's log: start-up, routes, then requests, metrics lines every 10 s and a
/// few preemption warnings (modelled on vLLM's own lines).
const SERVE_LOG: &str = include_str!("../fixtures/vllm-serve.txt");
/// Four failed engine steps: CUDA out of memory with its traceback, and the 500s that follow.
const OOM_LOG: &str = include_str!("../fixtures/vllm-cuda-oom.txt");
const MODEL: &str = "sim-llama-8b";
const SIM_ARGS: &[&str] = &["--itl-ms", "4", "--max-tokens", "24", "--ttft-ms", "40"];

fn config(log: &Path) -> String {
    format!(
        "sources:\n  files:\n    - path: {}\n      runtime: vllm\n      instance: sim-a\nlogs:\n  warmup_lines: 50\n  poll_interval: 100ms\nalerting:\n  resolve_after: 30s\n",
        log.display()
    )
}

fn append(path: &Path, text: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f.sync_all().unwrap();
}

async fn templates(api: SocketAddr) -> Vec<Value> {
    let r = get(&format!("http://{api}/api/v1/logs/templates?limit=10000")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["templates"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn total(rows: &[Value]) -> u64 {
    rows.iter().map(|r| r["count"].as_u64().unwrap_or(0)).sum()
}

/// Poll the templates until `done` holds for them; fails with what was last seen.
async fn wait_templates(
    api: SocketAddr,
    tw: &Proc,
    what: &str,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let rows = templates(api).await;
        if done(&rows) {
            return rows;
        }
        if Instant::now() > deadline {
            panic!(
                "{what}: not within 30 s; {} lines in {} templates\nlog:\n{}",
                total(&rows),
                rows.len(),
                tw.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// tokenwatch with `cfg` proxying `sim`, on ports it picks, once ready: (process, API, proxy).
async fn start(dir: &Path, sim: SocketAddr, cfg: &Path) -> (Proc, SocketAddr, SocketAddr) {
    let c = cfg.display().to_string();
    run_tokenwatch(dir, &format!("http://{sim}"), &["--config", &c]).await
}

#[tokio::test]
async fn vllm_log_templates_are_stable_across_restarts_and_a_cuda_oom_is_the_root_cause() {
    let dir = tempfile::tempdir().unwrap();
    let (_sim_proc, sim) = start_sim(dir.path(), SIM_ARGS).await;

    let log = dir.path().join("vllm.log");
    let cfg = dir.path().join("tokenwatch.yaml");
    std::fs::write(&cfg, config(&log)).unwrap();
    let lines: Vec<&str> = SERVE_LOG.lines().collect();
    let first_part = 700;
    append(&log, &(lines[..first_part].join("\n") + "\n"));

    // First run: the first part of the log is mined.
    let (mut tw, api, _) = start(dir.path(), sim, &cfg).await;
    let before = wait_templates(api, &tw, "the first part mined", |r| {
        total(r) == first_part as u64
    })
    .await;
    assert!(
        before.len() >= 15 && before.len() <= 60,
        "{} templates: {before:#?}",
        before.len()
    );
    let metrics = before
        .iter()
        .find(|r| {
            r["template"]
                .as_str()
                .unwrap()
                .contains("Avg prompt throughput")
        })
        .expect("the metrics line's template");
    assert_eq!(
        metrics["template"],
        "[metrics.py:<NUM>] Avg prompt throughput: <NUM> tokens/s, Avg generation throughput: <NUM> tokens/s, Running: <NUM> reqs, Swapped: <NUM> reqs, Pending: <NUM> reqs, GPU KV cache usage: <PCT>, CPU KV cache usage: <PCT>."
    );
    assert_eq!(metrics["severity"], "INFO");
    assert_eq!(
        metrics["source"],
        json!({"runtime": "vllm", "instance": "sim-a"})
    );
    assert!(metrics["rate_per_min"].as_f64().unwrap() > 0.0);
    assert!(
        metrics["first_seen_unix_ms"].as_i64().unwrap()
            <= metrics["last_seen_unix_ms"].as_i64().unwrap()
    );
    assert!(
        metrics["examples"][0]
            .as_str()
            .unwrap()
            .contains("GPU KV cache usage")
    );
    assert!(
        metrics["fields"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["kind"] == "percent"),
        "{metrics:#}"
    );
    let access = before
        .iter()
        .find(|r| {
            r["template"].as_str().unwrap().starts_with("<IP> - ")
                && r["template"]
                    .as_str()
                    .unwrap()
                    .ends_with("<PATH> HTTP/1.1\" <NUM> OK")
        })
        .expect("the access line's template");
    assert!(access["count"].as_u64().unwrap() > 200);
    // Healthy logs raise nothing.
    assert!(
        before.iter().all(|r| r["last_anomaly"].is_null()),
        "{before:#?}"
    );
    let bad = get(&format!("http://{api}/api/v1/logs/templates?severity=warn")).await;
    assert_eq!(bad.status, 400);
    assert!(bad.body.contains("min_severity"), "{}", bad.body);
    let warn = get(&format!(
        "http://{api}/api/v1/logs/templates?min_severity=warning"
    ))
    .await
    .json();
    assert!(
        warn["templates"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["severity"] == "WARN"),
        "{warn:#}"
    );
    assert!(warn["count"].as_u64().unwrap() >= 1);

    // Restart: the rest of the log was written while tokenwatch was down.
    assert!(tw.terminate().success(), "{}", tw.log());
    append(&log, &(lines[first_part..].join("\n") + "\n"));
    let (tw, api, proxy) = start(dir.path(), sim, &cfg).await;
    let after = wait_templates(api, &tw, "the whole log mined", |r| {
        total(r) >= lines.len() as u64
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after_settled = templates(api).await;
    assert_eq!(
        total(&after_settled),
        lines.len() as u64,
        "resumed at the saved offset: nothing read twice"
    );
    let by_id: BTreeMap<&str, &Value> = after
        .iter()
        .map(|r| (r["id"].as_str().unwrap(), r))
        .collect();
    for r in &before {
        let id = r["id"].as_str().unwrap();
        let now = by_id
            .get(id)
            .unwrap_or_else(|| panic!("template {id} ({}) lost in the restart", r["template"]));
        assert_eq!(now["template"], r["template"]);
        assert!(now["count"].as_u64() >= r["count"].as_u64());
    }

    // OTLP log records are mined too, under their service; a source still warming up raises nothing.
    let otlp_http = tw.listening().await["otlp_http"].to_string();
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let nccl = "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5912, OpType=ALLREDUCE, NumelIn=4096, NumelOut=4096, Timeout(ms)=600000) ran for 600042 milliseconds before timing out.";
    let payload = json!({"resourceLogs": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "vllm-b"}}]},
        "scopeLogs": [{"logRecords": [{
            "timeUnixNano": now_ns.to_string(), "severityNumber": 17, "severityText": "ERROR",
            "body": {"stringValue": nccl},
        }]}],
    }]});
    let r = send(
        "POST",
        &format!("http://{otlp_http}/v1/logs"),
        Some(&payload.to_string()),
        &[("content-type", "application/json")],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let rows = wait_templates(api, &tw, "the OTLP log's template", |rows| {
        rows.iter()
            .any(|r| r["source"] == json!({"runtime": "otlp", "instance": "vllm-b"}))
    })
    .await;
    let from_otlp = rows
        .iter()
        .find(|r| r["source"]["instance"] == "vllm-b")
        .unwrap();
    assert_eq!(
        (&from_otlp["class"], &from_otlp["severity"]),
        (&json!("nccl_timeout"), &json!("ERROR"))
    );
    assert!(from_otlp["last_anomaly"].is_null(), "{from_otlp:#}");

    // Traffic through the proxy, then the runtime runs out of memory and requests fail.
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
    append(&log, OOM_LOG);
    let rows = wait_templates(api, &tw, "the CUDA OOM anomaly", |rows| {
        rows.iter()
            .any(|r| r["class"] == "cuda_oom" && !r["last_anomaly"].is_null())
    })
    .await;
    let oom = rows
        .iter()
        .find(|r| r["class"] == "cuda_oom" && !r["last_anomaly"].is_null())
        .unwrap();
    assert_eq!(oom["severity"], "ERROR");
    assert_eq!(oom["last_anomaly"]["detector"], "log_cuda_oom");
    assert_eq!(oom["last_anomaly"]["kind"], "new_error_template");
    // The metrics line's template is no anomaly, before or after.
    assert!(
        rows.iter()
            .filter(|r| r["class"] != "cuda_oom" && r["severity"] != "ERROR")
            .all(|r| r["last_anomaly"].is_null())
    );
    let r = send(
        "POST",
        &format!("http://{sim}/admin/faults"),
        Some(&json!({"spec": "error_burst:rate=0.5"}).to_string()),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);

    let deadline = Instant::now() + Duration::from_secs(30);
    let alert = loop {
        let r = get(&format!("http://{api}/api/v1/alerts")).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let alerts = r.json()["alerts"].as_array().cloned().unwrap_or_default();
        if let Some(a) = alerts
            .iter()
            .find(|a| a["rule"] == "error_burst" && !a["fired_at_unix_ms"].is_null())
        {
            break a.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no error_burst alert: {alerts:#?}\nlog:\n{}",
            tw.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        let _ = tokio::time::timeout(Duration::from_secs(10), c).await;
    }
    let causes = alert["root_cause"].as_array().cloned().unwrap_or_default();
    let top = causes
        .first()
        .unwrap_or_else(|| panic!("no root cause: {alert:#}"));
    assert_eq!(top["detector"], "log_cuda_oom", "{alert:#}");
    assert_eq!(top["path"], json!(["log_cuda_oom", "error_burst"]));
    assert_eq!(top["labels"]["instance"], "sim-a");
    assert!(
        top["summary"]
            .as_str()
            .unwrap()
            .contains("CUDA out of memory"),
        "{top:#}"
    );
    let evidence: Value = serde_json::from_str(
        alert["annotations"]["log_evidence"]
            .as_str()
            .expect("log evidence"),
    )
    .unwrap();
    let first = &evidence[0]["evidence"];
    assert!(
        first["template"]
            .as_str()
            .unwrap()
            .contains("CUDA out of memory. Tried to allocate <NUM> GiB."),
        "{evidence:#}"
    );
    assert!(
        first["examples"][0]
            .as_str()
            .unwrap()
            .contains("GPU 0 has a total capacity of 79.15 GiB"),
        "{evidence:#}"
    );
    assert!(
        alert["annotations"]["root_cause"]
            .as_str()
            .unwrap()
            .contains("log_cuda_oom"),
        "{alert:#}"
    );
    let m = get(&format!("http://{api}/metrics")).await.body;
    assert!(
        common::metric_value(&m, "tokenwatch_log_template_anomalies_total")
            .is_some_and(|v| v >= 1.0),
        "{}",
        m.lines()
            .filter(|l| l.contains("tokenwatch_log"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
