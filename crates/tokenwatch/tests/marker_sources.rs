// Version markers from the sources other than the proxy, through the binary: prompt versions on
// OTLP spans (span or resource attribute) and the model version a scraped runtime reports.

mod common;

use common::metrics_target::MetricsTarget;
use common::{free_addr, get, send, start_collector, start_otlp_collector};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The markers of `model` once there are `want`, else fails naming what there was.
async fn wait_markers(
    api: SocketAddr,
    model: &str,
    want: usize,
    log: impl Fn() -> String,
) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = get(&format!("http://{api}/api/v1/markers?model={model}"))
            .await
            .json();
        let list = r["markers"].as_array().cloned().unwrap_or_default();
        if list.len() >= want {
            return list;
        }
        assert!(
            Instant::now() < deadline,
            "markers of {model}: {r}\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// OTLP/JSON: `n` GenAI chat spans of `model` whose prompt version is `version`, as a span
/// attribute (`gen_ai.prompt.version`) or a resource attribute (`tokenwatch.prompt.version`).
fn spans(model: &str, version: &str, on_resource: bool, first: usize, n: usize) -> String {
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let spans: Vec<Value> = (first..first + n)
        .map(|i| {
            let mut attrs = vec![
                json!({"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}),
                json!({"key": "gen_ai.request.model", "value": {"stringValue": model}}),
                json!({"key": "gen_ai.usage.output_tokens", "value": {"intValue": 9}}),
            ];
            if !on_resource {
                attrs.push(
                    json!({"key": "gen_ai.prompt.version", "value": {"stringValue": version}}),
                );
            }
            json!({
                "traceId": format!("{:032x}", 0xfeed_0000_u128 + i as u128),
                "spanId": format!("{:016x}", 0xbead_0000_u64 + i as u64),
                "name": format!("chat {model}"),
                "kind": 3,
                "startTimeUnixNano": (now_ns - 200_000_000).to_string(),
                "endTimeUnixNano": now_ns.to_string(),
                "attributes": attrs,
            })
        })
        .collect();
    let mut resource = vec![json!({"key": "service.name", "value": {"stringValue": "rag-app"}})];
    if on_resource {
        resource
            .push(json!({"key": "tokenwatch.prompt.version", "value": {"stringValue": version}}));
    }
    json!({"resourceSpans": [{
        "resource": {"attributes": resource},
        "scopeSpans": [{"scope": {"name": "test"}, "spans": spans}],
    }]})
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_prompt_versions_make_a_prompt_version_marker() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tw.yaml");
    std::fs::write(&config, "capture:\n  text: false\n").unwrap();
    let api = free_addr();
    let (tw, _grpc, http) = start_otlp_collector(dir.path(), api, &config).await;
    let url = format!("http://{http}/v1/traces");
    for (version, on_resource, first) in [("tmpl-3", false, 0), ("tmpl-4", true, 100)] {
        let r = send(
            "POST",
            &url,
            Some(&spans("rag-model", version, on_resource, first, 60)),
            &[],
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let found = wait_markers(api, "rag-model", 1, || tw.log()).await;
    assert_eq!(found.len(), 1, "{found:#?}");
    let m = &found[0];
    assert_eq!(
        (
            &m["kind"],
            &m["from_version"],
            &m["to_version"],
            &m["source"]
        ),
        (
            &json!("prompt_version"),
            &json!("tmpl-3"),
            &json!("tmpl-4"),
            &json!("otlp")
        ),
        "{m}"
    );
    // The record keeps its prompt version.
    let r = get(&format!(
        "http://{api}/api/v1/requests?model=rag-model&limit=1"
    ))
    .await
    .json();
    assert_eq!(r["requests"][0]["prompt_version"], "tmpl-4", "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scraped_model_version_change_makes_a_scrape_marker() {
    let version = Arc::new(Mutex::new("2025-05-01".to_string()));
    let shown = version.clone();
    let target = MetricsTarget::start(move || {
        let v = shown.lock().unwrap().clone();
        format!(
            "# TYPE vllm:num_requests_running gauge\n\
             vllm:num_requests_running{{model_name=\"scraped-model\"}} 1\n\
             # TYPE vllm:model_info gauge\n\
             vllm:model_info{{model_name=\"scraped-model\",model_version=\"{v}\"}} 1\n"
        )
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tw.yaml");
    std::fs::write(
        &config,
        format!(
            "scrape:\n  interval: 1s\n  timeout: 1s\n  targets:\n    - url: http://{}/metrics\n",
            target.addr
        ),
    )
    .unwrap();
    let api = free_addr();
    let tw = start_collector(dir.path(), api, &["-c", config.to_str().unwrap()]).await;
    // The first version is learnt, not a change.
    let deadline = Instant::now() + Duration::from_secs(20);
    while target.hits() < 3 {
        assert!(Instant::now() < deadline, "never scraped\n{}", tw.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = get(&format!("http://{api}/api/v1/markers?model=scraped-model"))
        .await
        .json();
    assert_eq!(r["markers"], json!([]), "{r}");

    let before_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    *version.lock().unwrap() = "2025-06-01".to_string();
    let found = wait_markers(api, "scraped-model", 1, || tw.log()).await;
    // More scrapes of the same version add nothing.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let r = get(&format!("http://{api}/api/v1/markers?model=scraped-model"))
        .await
        .json();
    assert_eq!(r["markers"].as_array().unwrap().len(), 1, "{r}");
    let m = &found[0];
    assert_eq!(
        (
            &m["kind"],
            &m["from_version"],
            &m["to_version"],
            &m["source"]
        ),
        (
            &json!("model_version"),
            &json!("2025-05-01"),
            &json!("2025-06-01"),
            &json!("scrape")
        ),
        "{m}"
    );
    assert!(m["at_unix_ms"].as_i64().unwrap() >= before_ms, "{m}");
}
