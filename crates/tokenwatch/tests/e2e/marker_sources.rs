// Version markers from the sources other than the proxy, through the binary: prompt versions on
// OTLP spans (span or resource attribute) and the model version a scraped runtime reports.

use crate::common;

use common::metrics_target::MetricsTarget;
use common::otlp::{chat_span, post_resource_spans, str_attr};
use common::{
    get, now_ms, now_ns, start_collector, start_otlp_collector_with, stored_record, wait_markers,
    write_config,
};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// POSTs to `otlp_http` `n` GenAI chat spans of `model` whose prompt version is `version`, as a
/// span attribute (`gen_ai.prompt.version`) or a resource attribute (`tokenwatch.prompt.version`).
async fn post_versioned_spans(
    otlp_http: SocketAddr,
    model: &str,
    version: &str,
    on_resource: bool,
    first: usize,
    n: usize,
) {
    let now_ns = now_ns();
    let spans: Vec<Value> = (first..first + n)
        .map(|i| {
            let mut span = chat_span(
                &format!("{:032x}", 0xfeed_0000_u128 + i as u128),
                &format!("{:016x}", 0xbead_0000_u64 + i as u64),
                model,
                now_ns - 200_000_000,
                now_ns,
                9,
            );
            if !on_resource {
                span["attributes"]
                    .as_array_mut()
                    .unwrap()
                    .push(str_attr("gen_ai.prompt.version", version));
            }
            span
        })
        .collect();
    let mut resource = vec![str_attr("service.name", "rag-app")];
    if on_resource {
        resource.push(str_attr("tokenwatch.prompt.version", version));
    }
    post_resource_spans(otlp_http, resource, spans).await;
}

/// Asserts marker `m` is of `kind`, from `from` to `to`, made by `source`.
fn assert_marker(m: &Value, kind: &str, from: &str, to: &str, source: &str) {
    assert_eq!(
        (
            &m["kind"],
            &m["from_version"],
            &m["to_version"],
            &m["source"]
        ),
        (&json!(kind), &json!(from), &json!(to), &json!(source)),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_prompt_versions_make_a_prompt_version_marker() {
    let dir = tempfile::tempdir().unwrap();
    let (tw, api, http) = start_otlp_collector_with(dir.path(), "capture:\n  text: false\n").await;
    for (version, on_resource, first) in [("tmpl-3", false, 0), ("tmpl-4", true, 100)] {
        post_versioned_spans(http, "rag-model", version, on_resource, first, 60).await;
    }
    let found = wait_markers(api, "rag-model", 1, || tw.log()).await;
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_marker(&found[0], "prompt_version", "tmpl-3", "tmpl-4", "otlp");
    // Each record keeps its prompt version. The marker is made as the spans are read, before
    // their records are written, so the records are read by id once stored.
    let first_old = stored_record(api, &format!("{:016x}", 0xbead_0000_u64), &tw).await;
    assert_eq!(first_old["prompt_version"], "tmpl-3", "{first_old}");
    let first_new = stored_record(api, &format!("{:016x}", 0xbead_0000_u64 + 100), &tw).await;
    assert_eq!(first_new["prompt_version"], "tmpl-4", "{first_new}");
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
    let config = write_config(
        dir.path(),
        &format!(
            "scrape:\n  interval: 1s\n  timeout: 1s\n  targets:\n    - url: http://{}/metrics\n",
            target.addr
        ),
    );
    let (tw, api) = start_collector(dir.path(), &["-c", config.to_str().unwrap()]).await;
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

    let before_ms = now_ms();
    *version.lock().unwrap() = "2025-06-01".to_string();
    let found = wait_markers(api, "scraped-model", 1, || tw.log()).await;
    // More scrapes of the same version add nothing.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let r = get(&format!("http://{api}/api/v1/markers?model=scraped-model"))
        .await
        .json();
    assert_eq!(r["markers"].as_array().unwrap().len(), 1, "{r}");
    let m = &found[0];
    assert_marker(m, "model_version", "2025-05-01", "2025-06-01", "scrape");
    assert!(m["at_unix_ms"].as_i64().unwrap() >= before_ms, "{m}");
}
