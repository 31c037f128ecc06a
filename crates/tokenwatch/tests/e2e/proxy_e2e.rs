// End to end through the real binary: the OpenAI Python client streams through the proxy
// to the simulator; the API and `/metrics` then show correct timing, tokens and records.

use crate::common;

use common::*;
use std::process::Command;
use std::time::Duration;

async fn wait_records(api: std::net::SocketAddr, want: u64) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let text = get(&format!("http://{api}/metrics")).await.body;
        if metric_value(&text, "tokenwatch_store_records_written_total").unwrap_or(0.0) as u64
            >= want
        {
            return text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "records never reached the store:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_client_through_proxy_gives_correct_timing_and_records() {
    let stack = Stack::start(
        &[
            "--model",
            "m-fast,m-slow",
            "--ttft-ms",
            "150",
            "--itl-ms",
            "10",
        ],
        &[],
    )
    .await;
    let py = python();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/openai_client.py");
    let out = Command::new(&py)
        .args([script, &format!("http://{}/v1", stack.proxy), "m-fast", "8"])
        .output()
        .expect("running the OpenAI client");
    assert!(
        out.status.success(),
        "openai client failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        stack.tw.log()
    );
    let results: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let results = results["results"].as_array().unwrap().clone();
    assert_eq!(results.len(), 8);
    for r in &results {
        assert!(r["usage"].as_u64().unwrap() > 0, "client saw no usage: {r}");
    }

    let metrics = wait_records(stack.api, 8).await;

    // Records: one per request, tokens from usage, first token after arrival and before end.
    let recs = get(&format!(
        "http://{}/api/v1/requests?model=m-fast&limit=100",
        stack.api
    ))
    .await
    .json();
    let recs = recs["requests"].as_array().unwrap();
    assert_eq!(recs.len(), 8, "{recs:?}");
    let streamed: Vec<_> = recs.iter().filter(|r| r["stream"] == true).collect();
    assert_eq!(streamed.len(), 6);
    let client_usages: Vec<u64> = results
        .iter()
        .filter(|r| r["stream"] == true)
        .map(|r| r["usage"].as_u64().unwrap())
        .collect();
    for r in &streamed {
        let ttft = r["first_token_s"].as_f64().unwrap();
        let end = r["end_s"].as_f64().unwrap();
        assert!(ttft >= 0.15 && ttft < end, "ttft {ttft} end {end}");
        assert!(r["tokens_from_usage"].as_bool().unwrap());
        assert!(client_usages.contains(&r["output_tokens"].as_u64().unwrap()));
        // Every content chunk the client saw was timed (role-only and empty chunks are not tokens).
        let offsets = r["chunk_offsets_us"].as_array().unwrap();
        assert!(!offsets.is_empty());
        assert_eq!(r["status"], 200);
        assert!(r["error_class"].is_null());
        assert_eq!(r["runtime"], "sim");
        assert!(r["tenant"].as_str().unwrap().starts_with("tenant-"));
        assert_eq!(r["trace_id"].as_str().unwrap().len(), 32);
        assert!(
            r["queue_s"].as_f64().is_some(),
            "the simulator's x-queue-time header was recorded"
        );
    }
    let non_stream: Vec<_> = recs.iter().filter(|r| r["stream"] == false).collect();
    assert_eq!(non_stream.len(), 2);
    assert!(
        non_stream
            .iter()
            .all(|r| r["first_token_s"].is_null() && r["output_tokens"].as_u64().unwrap() > 0)
    );

    // Latency API: TTFT from the simulator's 150 ms prefill, ITL near its 10 ms step.
    let ttft = get(&format!(
        "http://{}/api/v1/latency?model=m-fast&metric=ttft&window=5m",
        stack.api
    ))
    .await
    .json();
    assert_eq!(ttft["count"], 6, "{ttft}");
    let p50 = ttft["p50"].as_f64().unwrap();
    assert!((0.15..0.6).contains(&p50), "ttft p50 {p50}");
    for q in ["p90", "p95", "p99", "mean"] {
        assert!(ttft[q].as_f64().unwrap() >= p50 * 0.5, "{q} in {ttft}");
    }
    let itl = get(&format!(
        "http://{}/api/v1/latency?model=m-fast&metric=itl&window=1m",
        stack.api
    ))
    .await
    .json();
    let itl_p50 = itl["p50"].as_f64().unwrap();
    assert!(
        (0.005..0.1).contains(&itl_p50),
        "itl p50 {itl_p50} in {itl}"
    );
    let by = get(&format!(
        "http://{}/api/v1/latency?model=m-fast&metric=e2e&window=1h&by=tenant",
        stack.api
    ))
    .await
    .json();
    let groups = by["groups"].as_array().unwrap();
    let tenants: Vec<&str> = groups
        .iter()
        .map(|g| g["labels"]["tenant"].as_str().unwrap())
        .collect();
    assert!(
        tenants.contains(&"tenant-0") && tenants.contains(&"tenant-1"),
        "{by}"
    );
    let other = get(&format!(
        "http://{}/api/v1/latency?model=m-slow&metric=ttft",
        stack.api
    ))
    .await
    .json();
    assert_eq!(other["count"], 0, "no traffic went to m-slow: {other}");

    // /metrics: GenAI histograms with the conventions' labels, valid for promtool.
    let ttft_counts: Vec<&str> = metrics
        .lines()
        .filter(|l| {
            l.starts_with("gen_ai_server_time_to_first_token_seconds_count{")
                && l.contains("gen_ai_request_model=\"m-fast\"")
        })
        .collect();
    assert!(
        !ttft_counts.is_empty(),
        "no TTFT count for m-fast:\n{metrics}"
    );
    for line in &ttft_counts {
        for label in [
            "gen_ai_operation_name=\"chat\"",
            "gen_ai_provider_name=\"sim\"",
            "gen_ai_response_model=",
            "instance=",
        ] {
            assert!(line.contains(label), "{label} missing: {line}");
        }
        assert!(!line.contains("tenant="), "tenant is opt-in: {line}");
    }
    let streamed_count: f64 = ttft_counts
        .iter()
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(
        streamed_count, 6.0,
        "six streamed requests: {ttft_counts:?}"
    );
    // Token usage: a histogram whose sum is the tokens the records counted.
    assert!(
        metrics.contains("# TYPE gen_ai_client_token_usage histogram"),
        "{metrics}"
    );
    let usage_sum: f64 = metrics
        .lines()
        .filter(|l| {
            l.starts_with("gen_ai_client_token_usage_sum{")
                && l.contains("gen_ai_request_model=\"m-fast\"")
                && l.contains("gen_ai_token_type=\"output\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    let recorded: u64 = recs
        .iter()
        .filter_map(|r| r["output_tokens"].as_u64())
        .sum();
    assert_eq!(usage_sum, recorded as f64, "{metrics}");
    // The client's chunk histograms: a first chunk per streamed call, and one gap per content
    // chunk after the first — as many as the stored records' chunk times give.
    let count_of = |family: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| {
                l.starts_with(&format!("{family}_count{{"))
                    && l.contains("gen_ai_request_model=\"m-fast\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert_eq!(
        count_of("gen_ai_client_operation_time_to_first_chunk_seconds"),
        6.0,
        "{metrics}"
    );
    let gaps: usize = recs
        .iter()
        .filter_map(|r| r["chunk_offsets_us"].as_array())
        .map(|a| a.len().saturating_sub(1))
        .sum();
    assert!(gaps >= 6, "the streams had several chunks each: {gaps}");
    assert_eq!(
        count_of("gen_ai_client_operation_time_per_output_chunk_seconds"),
        gaps as f64,
        "{metrics}"
    );
    promtool_check_metrics(&metrics);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_id_and_traceparent_are_propagated() {
    let stack = Stack::start(&["--model", "m1", "--ttft-ms", "5", "--itl-ms", "1"], &[]).await;
    let body = r#"{"model":"m1","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":5}"#;
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let url = format!("http://{}/v1/chat/completions", stack.proxy);
    let r = send(
        "POST",
        &url,
        Some(body),
        &[("traceparent", tp), ("x-request-id", "req-abc-1")],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.headers.get("x-request-id").unwrap(), "req-abc-1");
    assert!(r.body.contains("data: [DONE]"));
    let r2 = send("POST", &url, Some(body), &[]).await.unwrap();
    let generated_id = r2
        .headers
        .get("x-request-id")
        .expect("x-request-id set")
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(generated_id.len(), 32);
    wait_records(stack.api, 2).await;
    let recs = get(&format!("http://{}/api/v1/requests?limit=10", stack.api))
        .await
        .json();
    let recs = recs["requests"].as_array().unwrap();
    let first = recs
        .iter()
        .find(|r| r["request_id"] == "req-abc-1")
        .expect("record with the client's request id");
    assert_eq!(first["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
    let second = recs
        .iter()
        .find(|r| r["request_id"] == generated_id.as_str())
        .unwrap();
    assert_ne!(second["trace_id"], first["trace_id"]);
}

/// Two upstreams routed by model and none for requests without one (the demo's shape): the
/// OpenAI client's model list is answered by the proxy from its routes, not refused, and the
/// models it names are served through the same proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_list_comes_from_the_routes_when_no_upstream_takes_every_model() {
    let dir = tempfile::tempdir().unwrap();
    let (_sim_a, a) = start_sim(dir.path(), &["--model", "m-a"]).await;
    let (_sim_b, b) = start_sim(dir.path(), &["--model", "m-b"]).await;
    let yaml = format!(
        "data_dir: {data}\nproxy:\n  upstreams:\n    - url: http://{a}\n      models: [m-a]\n      runtime: vllm\n    - url: http://{b}\n      models: [m-b]\n      runtime: sglang\n",
        data = dir.path().join("data").display()
    );
    let cfg = write_config(dir.path(), &yaml);
    let (tw, _api, proxy) = run_with_config(dir.path(), &cfg).await;
    let listing = "import json, sys\nfrom openai import OpenAI\n\
        c = OpenAI(base_url=sys.argv[1], api_key='sk-test', max_retries=0, timeout=10)\n\
        models = [(m.id, m.owned_by) for m in c.models.list()]\n\
        answers = [c.chat.completions.create(model=m, messages=[{'role': 'user', 'content': 'hi'}], max_tokens=4).model for m, _ in models]\n\
        print(json.dumps({'models': models, 'answers': answers}))\n";
    let out = Command::new(python())
        .args(["-c", listing, &format!("http://{proxy}/v1")])
        .output()
        .expect("running the OpenAI client");
    assert!(
        out.status.success(),
        "openai client failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        tw.log()
    );
    let seen: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        seen["models"],
        serde_json::json!([["m-a", "vllm"], ["m-b", "sglang"]])
    );
    assert_eq!(seen["answers"], serde_json::json!(["m-a", "m-b"]));
}

/// Azure OpenAI's shapes of a chat call, from the real OpenAI Python client: a deployment's path
/// (`/openai/deployments/{deployment}/chat/completions?api-version=…`, the model only in the
/// path, the key in `api-key`) and the v1 API under the `/openai` prefix. Both are forwarded on
/// their own path and measured like `/v1/chat/completions`: the deployment as the model, first
/// token and chunks timed, usage counted, and one tenant for the one key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_openai_paths_are_measured_like_v1_chat_completions() {
    let stack = Stack::start(
        &["--model", "gpt-4o-prod", "--ttft-ms", "40", "--itl-ms", "5"],
        &[],
    )
    .await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/azure_client.py");
    let out = Command::new(python())
        .args([script, &format!("http://{}", stack.proxy), "gpt-4o-prod"])
        .output()
        .expect("running the OpenAI client");
    assert!(
        out.status.success(),
        "azure client failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        stack.tw.log()
    );
    let seen: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut tenants = Vec::new();
    for id in ["azure-deployment", "azure-v1"] {
        let c = &seen[id];
        let r = stored_record(stack.api, id, &stack.tw).await;
        assert_eq!(
            (&r["endpoint"], &r["model_id"], &r["status"], &r["stream"]),
            (
                &serde_json::json!("/v1/chat/completions"),
                &serde_json::json!("gpt-4o-prod"),
                &serde_json::json!(200),
                &serde_json::json!(true)
            ),
            "{id}: {r}"
        );
        let ttft = r["first_token_s"].as_f64().unwrap_or(0.0);
        assert!(ttft >= 0.04, "{id}: {r}");
        assert_eq!(r["output_tokens"], c["completion_tokens"], "{id}: {r}");
        assert_eq!(r["prompt_tokens"], c["prompt_tokens"], "{id}: {r}");
        assert_eq!(
            r["chunk_offsets_us"].as_array().map(Vec::len),
            c["content_chunks"].as_u64().map(|n| n as usize),
            "{id}: {r}"
        );
        tenants.push(r["tenant"].clone());
    }
    assert!(
        tenants[0].as_str().is_some_and(|t| t.starts_with("key-")),
        "{tenants:?}"
    );
    assert_eq!(tenants[0], tenants[1], "api-key and Bearer of one key");
}
