// Version markers end to end through the binary and the simulator: v1 traffic, then v2 with
// higher latency, makes one v1→v2 marker whose before/after comparison says TTFT got worse;
// posted deploy markers are listed, bad input is refused naming the field, restarts keep them;
// OTLP spans whose resource names a new model version make an `otlp` marker.

use crate::common;

use common::otlp::{chat_span, post_resource_spans, str_attr};
use common::{Stack, get, now_ns, send, start_otlp_collector_with, wait_markers, wait_ready};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const MODEL: &str = "m1";
const REQUESTS: usize = 60;
const CONCURRENCY: usize = 6;

/// `n` streamed chats through the proxy with `x-model-version: version`, `CONCURRENCY` at a time.
async fn chats(stack: &Stack, version: &str, n: usize) {
    let url = format!("http://{}/v1/chat/completions", stack.proxy);
    let body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "stream": true,
        "max_tokens": 8,
    })
    .to_string();
    let headers = [("x-model-version", version)];
    for wave in 0..n.div_ceil(CONCURRENCY) {
        let k = CONCURRENCY.min(n - wave * CONCURRENCY);
        let replies = futures_util::future::join_all(
            (0..k).map(|_| send("POST", &url, Some(&body), &headers)),
        )
        .await;
        for r in replies {
            let r = r.unwrap();
            assert_eq!(r.status, 200, "{}", r.body);
        }
    }
}

/// Polls `f` every 200 ms until it returns Some, failing with tokenwatch's log after 30 s.
async fn wait_for<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    stack: &Stack,
    mut f: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what} never happened; log:\n{}",
            stack.tw.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn markers(stack: &Stack, query: &str) -> Vec<Value> {
    let r = get(&format!("http://{}/api/v1/markers{query}", stack.api)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["markers"].as_array().cloned().unwrap_or_default()
}

fn signal<'a>(cmp: &'a Value, name: &str) -> &'a Value {
    cmp["signals"]
        .as_array()
        .and_then(|s| s.iter().find(|r| r["signal"] == name))
        .unwrap_or_else(|| panic!("no {name} in {cmp:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_marker_compares_before_and_after_and_survives_a_restart() {
    let mut stack =
        Stack::start_restartable(&["--model", MODEL, "--ttft-ms", "20", "--itl-ms", "2"], &[])
            .await;
    let api = stack.api;

    chats(&stack, "v1", REQUESTS).await;
    // v2 is 10x slower to first token (and between tokens).
    let fault = send(
        "POST",
        &format!("http://{}/admin/faults", stack.sim_addr),
        Some(&json!({ "spec": "latency_spike:factor=10,share=1" }).to_string()),
        &[],
    )
    .await
    .unwrap();
    assert!(fault.status < 300, "{}", fault.body);
    chats(&stack, "v2", REQUESTS).await;

    let found = wait_for("a v1→v2 marker", &stack, || async {
        let m = markers(&stack, &format!("?model={MODEL}")).await;
        (!m.is_empty()).then_some(m)
    })
    .await;
    assert_eq!(found.len(), 1, "one marker for one rollout: {found:#?}");
    let m = &found[0];
    assert_eq!(
        (
            &m["kind"],
            &m["model"],
            &m["from_version"],
            &m["to_version"],
            &m["source"]
        ),
        (
            &json!("model_version"),
            &json!(MODEL),
            &json!("v1"),
            &json!("v2"),
            &json!("proxy")
        )
    );
    let id = m["id"].as_str().unwrap().to_string();

    // Every v2 record stored, then the comparison.
    let cmp = wait_for("all records on both sides", &stack, || async {
        let r = get(&format!(
            "http://{api}/api/v1/compare?marker={id}&window=10m"
        ))
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        (v["before"]["requests"] == REQUESTS && v["after"]["requests"] == REQUESTS).then_some(v)
    })
    .await;
    for name in ["ttft_p50_seconds", "ttft_p95_seconds"] {
        let s = signal(&cmp, name);
        assert_eq!(s["verdict"], "worse", "{name}: {s:#}");
        assert!(
            s["after"]["lo"].as_f64().unwrap() > s["before"]["hi"].as_f64().unwrap(),
            "{name}: the intervals overlap: {s:#}"
        );
    }
    let err = signal(&cmp, "error_rate");
    assert_eq!(
        (err["verdict"].as_str(), err["after"]["value"].as_f64()),
        (Some("no_change"), Some(0.0)),
        "{err:#}"
    );
    assert_eq!(cmp["marker"]["id"], id.as_str());
    assert_eq!(cmp["window"], "10m");

    // Bad parameters and unknown markers.
    for (q, status, says) in [
        ("", 400, "marker"),
        ("?marker=mk-nope", 404, "mk-nope"),
        (
            &format!("?marker={id}&window=forever") as &str,
            400,
            "window",
        ),
        (&format!("?marker={id}&windw=5m"), 400, "windw"),
    ] {
        let r = get(&format!("http://{api}/api/v1/compare{q}")).await;
        assert_eq!(r.status, status, "{q}: {}", r.body);
        assert!(r.body.contains(says), "{q}: {}", r.body);
    }

    // A deploy marker through the API; bad ones are refused naming the field.
    let url = format!("http://{api}/api/v1/markers");
    let posted = send(
        "POST",
        &url,
        Some(r#"{"kind":"deploy","note":"helm upgrade 1.4.0"}"#),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(posted.status, 201, "{}", posted.body);
    let deploy_id = posted.json()["id"].as_str().unwrap().to_string();
    for (body, field) in [
        (r#"{"kind":"rollout"}"#, "kind"),
        (
            r#"{"kind":"deploy","at_unix_ms":"yesterday"}"#,
            "at_unix_ms",
        ),
        (r#"{"kind":"deploy","colour":"red"}"#, "colour"),
    ] {
        let r = send("POST", &url, Some(body), &[]).await.unwrap();
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert!(
            r.json()["error"].as_str().unwrap().contains(field),
            "{body}: {}",
            r.body
        );
    }
    let ids = |list: &[Value]| {
        list.iter()
            .map(|m| m["id"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        ids(&markers(&stack, "").await),
        [id.clone(), deploy_id.clone()]
    );
    assert_eq!(ids(&markers(&stack, "?since=1h").await).len(), 2);
    assert!(get(&format!("{url}?since=soon")).await.status == 400);

    // A restart keeps the markers and remembers v2 is live: more v2 makes no new marker.
    assert!(stack.tw.terminate().success());
    stack.restart_tokenwatch();
    wait_ready(&format!("http://{api}/readyz"), &stack.tw).await;
    assert_eq!(ids(&markers(&stack, "").await), [id.clone(), deploy_id]);
    chats(&stack, "v2", REQUESTS).await;
    wait_for("the new records", &stack, || async {
        let r = get(&format!("http://{api}/api/v1/requests?limit=1000"))
            .await
            .json();
        (r["count"] == 3 * REQUESTS).then_some(())
    })
    .await;
    let after = markers(&stack, &format!("?model={MODEL}")).await;
    assert_eq!(ids(&after), [id], "no marker for the version already live");
    assert!(stack.tw.terminate().success());
}

/// POSTs to `otlp_http` `n` GenAI chat spans of `model` from a service whose resource attribute
/// `tokenwatch.model_version` is `version`.
async fn post_model_version_spans(
    otlp_http: std::net::SocketAddr,
    model: &str,
    version: &str,
    first: usize,
    n: usize,
) {
    let now_ns = now_ns();
    let spans: Vec<Value> = (first..first + n)
        .map(|i| {
            chat_span(
                &format!("{:032x}", 0xabc0_0000_u128 + i as u128),
                &format!("{:016x}", 0x5eed_0000_u64 + i as u64),
                model,
                now_ns - 300_000_000,
                now_ns,
                12,
            )
        })
        .collect();
    let resource = vec![
        str_attr("service.name", "chat-app"),
        str_attr("tokenwatch.model_version", version),
    ];
    post_resource_spans(otlp_http, resource, spans).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_resource_versions_make_a_marker() {
    let dir = tempfile::tempdir().unwrap();
    let (tw, api, http) = start_otlp_collector_with(dir.path(), "capture:\n  text: false\n").await;
    for (version, first) in [("2025-01", 0), ("2025-02", 100)] {
        post_model_version_spans(http, "otel-model", version, first, 60).await;
    }
    let found = wait_markers(api, "otel-model", 1, || tw.log()).await;
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(
        (
            &found[0]["from_version"],
            &found[0]["to_version"],
            &found[0]["source"]
        ),
        (&json!("2025-01"), &json!("2025-02"), &json!("otlp"))
    );
}
