// Configuration reload through the real binary: SIGHUP and `POST /-/reload` swap routes and
// rules while a stream stays open, refuse a bad file, name restart keys, guard the admin role.

use crate::common;

use common::{
    Proc, Reply, any_addr, free_addr, get, metric_value, ready_on, send, start_collector,
    start_sim, stored_record,
};
use http_body_util::{BodyExt, Full};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

const MODEL: &str = "model-a";

fn config(
    api: SocketAddr,
    proxy: SocketAddr,
    data: &Path,
    upstream: SocketAddr,
    extra: &str,
) -> String {
    format!(
        "listen: {api}\ndata_dir: {}\notlp:\n  enabled: false\nproxy:\n  listen: {proxy}\n  upstreams:\n    - url: http://{upstream}\n      models: [{MODEL}]\n      runtime: sim\n{extra}",
        data.display()
    )
}

/// `scrape.targets`: the sims' own /metrics, scraped every second.
fn scrape(sims: &[SocketAddr]) -> String {
    let targets: String = sims
        .iter()
        .map(|a| format!("    - {{url: 'http://{a}/metrics', interval: 1s}}\n"))
        .collect();
    format!("scrape:\n  targets:\n{targets}")
}

/// (url, health) of every scrape target.
async fn targets(api: SocketAddr) -> Vec<(String, String)> {
    let v = get(&format!("http://{api}/api/v1/targets")).await.json();
    let mut out: Vec<(String, String)> = v["targets"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|t| {
                    (
                        t["url"].as_str().unwrap_or_default().to_string(),
                        t["health"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

const PROBE_RULE: &str = "alerting:\n  rules:\n    - name: reload_probe\n      detector: threshold\n      signal: kv_cache_usage\n      params: {op: '>', value: 2}\n";

async fn post_reload(api: SocketAddr, token: Option<&str>) -> Reply {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth
        .as_deref()
        .map(|a| vec![("authorization", a)])
        .unwrap_or_default();
    send("POST", &format!("http://{api}/-/reload"), None, &headers)
        .await
        .unwrap_or_else(|e| panic!("POST {e}"))
}

fn chat(stream: bool, max_tokens: u32) -> String {
    serde_json::json!({
        "model": MODEL,
        "stream": stream,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "tell me about reloads"}],
    })
    .to_string()
}

/// A completed chat request through the proxy with request id `id`: the upstream instance its
/// stored record names.
async fn routed_to(api: SocketAddr, proxy: SocketAddr, id: &str, tw: &Proc) -> String {
    let r = send(
        "POST",
        &format!("http://{proxy}/v1/chat/completions"),
        Some(&chat(false, 8)),
        &[("x-request-id", id)],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let rec = stored_record(api, id, tw).await;
    rec["instance"].as_str().unwrap_or_default().to_string()
}

fn rule_names(api_rules: &serde_json::Value) -> Vec<String> {
    api_rules["rules"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|r| r["name"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

async fn metric(api: SocketAddr, series: &str) -> Option<f64> {
    metric_value(&get(&format!("http://{api}/metrics")).await.body, series)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_swaps_routes_and_rules_without_dropping_a_held_stream() {
    let dir = tempfile::tempdir().unwrap();
    // Sim 1 streams slowly, every answer as long as the request allows (the held stream: 60
    // tokens, about 3 s); sim 2 at the default pace.
    let sim1_args = [
        "--model",
        MODEL,
        "--itl-ms",
        "50",
        "--instance-name",
        "sim-1",
        "--fault",
        "length_blowup:factor=100",
    ];
    let (_sim1, sim1) = start_sim(dir.path(), &sim1_args).await;
    let (_sim2, sim2) =
        start_sim(dir.path(), &["--model", MODEL, "--instance-name", "sim-2"]).await;
    // The file's listeners are port 0 (`any`), every version of it; the test reads the bound
    // addresses back.
    let any = any_addr();
    let data = dir.path().join("data");
    let file = dir.path().join("tw.yaml");
    std::fs::write(&file, config(any, any, &data, sim1, &scrape(&[sim1]))).unwrap();
    let tw = Proc::start(
        "tokenwatch",
        &["run", "-c", file.to_str().unwrap()],
        dir.path(),
    );
    let (api, proxy) = ready_on(&tw).await;
    let sim1_target = (format!("http://{sim1}/metrics"), "up".to_string());
    let deadline = Instant::now() + Duration::from_secs(15);
    while targets(api).await != [sim1_target.clone()] {
        assert!(
            Instant::now() < deadline,
            "sim 1 never scraped: {:?}",
            targets(api).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        routed_to(api, proxy, "before-1", &tw).await,
        sim1.to_string()
    );
    let rules = get(&format!("http://{api}/api/v1/rules")).await.json();
    assert!(
        !rule_names(&rules).is_empty() && !rule_names(&rules).contains(&"reload_probe".to_string()),
        "{rules}"
    );

    // Hold a stream open on sim 1: its headers and first bytes are in, the rest still comes.
    let req = http::Request::post(format!("http://{proxy}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("x-request-id", "held-1")
        .body(Full::new(bytes::Bytes::from(chat(true, 60))))
        .unwrap();
    let resp = common::client().request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut held = Vec::new();
    while held.is_empty() {
        let frame = body.frame().await.expect("a first chunk").unwrap();
        if let Ok(data) = frame.into_data() {
            held.extend_from_slice(&data);
        }
    }

    // Route the model to sim 2, add a rule and a scrape target; SIGHUP (the test owns the
    // child's pid).
    let with_probe = format!("{PROBE_RULE}{}", scrape(&[sim1, sim2]));
    std::fs::write(&file, config(any, any, &data, sim2, &with_probe)).unwrap();
    let status = std::process::Command::new("kill")
        .args(["-HUP", &tw.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let rules = get(&format!("http://{api}/api/v1/rules")).await.json();
        if rule_names(&rules).iter().any(|n| n == "reload_probe") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new rule never appeared: {rules}; log:\n{}",
            tw.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        metric(api, "tokenwatch_config_reloads_total{result=\"success\"}").await,
        Some(1.0)
    );
    // The new target is there; the unchanged one kept running (never back to `unknown`).
    let now = targets(api).await;
    assert_eq!(now.len(), 2, "{now:?}");
    assert!(now.contains(&sim1_target), "{now:?}");
    let sim2_target = (format!("http://{sim2}/metrics"), "up".to_string());
    let deadline = Instant::now() + Duration::from_secs(15);
    while !targets(api).await.contains(&sim2_target) {
        assert!(
            Instant::now() < deadline,
            "sim 2 never scraped: {:?}",
            targets(api).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        metric(api, "tokenwatch_config_last_reload_successful").await,
        Some(1.0)
    );
    assert_eq!(
        routed_to(api, proxy, "after-1", &tw).await,
        sim2.to_string()
    );

    // The held stream finishes on sim 1, whole.
    let rest = tokio::time::timeout(Duration::from_secs(30), body.collect())
        .await
        .expect("the held stream ends")
        .unwrap();
    let rest = rest.to_bytes();
    // It was still streaming when the reload had been applied.
    assert!(
        String::from_utf8_lossy(&rest).contains("\"content\""),
        "nothing came after the reload"
    );
    held.extend_from_slice(&rest);
    let text = String::from_utf8_lossy(&held);
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(text.contains("\"finish_reason\":\"length\""), "{text}");
    let rec = stored_record(api, "held-1", &tw).await;
    assert_eq!(
        (rec["instance"].as_str(), rec["status"].as_u64()),
        (Some(sim1.to_string().as_str()), Some(200)),
        "{rec}"
    );
    assert!(rec["error_class"].is_null(), "{rec}");
    assert_eq!(rec["finish_reason"], "length", "{rec}");
    let chunks = rec["chunk_offsets_us"]
        .as_array()
        .map(Vec::len)
        .unwrap_or_default();
    assert!(
        chunks > 10 && rec["end_s"].as_f64().unwrap_or_default() > 2.0,
        "{rec}"
    );

    // The same file again: nothing to apply.
    let r = post_reload(api, None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["applied"], serde_json::json!([]), "{v}");
    assert_eq!(v["restart_required"], serde_json::json!([]), "{v}");
    assert_eq!(
        v["unchanged"],
        serde_json::json!([
            "proxy.upstreams",
            "proxy.routes",
            "alerting",
            "slos",
            "scrape.targets"
        ]),
        "{v}"
    );

    // A bad file: 400 naming the key, nothing applied (the rule and sim 2 stay).
    let bad = config(any, any, &data, sim1, &with_probe)
        .replace(&format!("http://{sim1}"), "ftp://nowhere");
    std::fs::write(&file, bad).unwrap();
    let r = post_reload(api, None).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.body.contains("proxy.upstreams[0].url") && r.body.contains("tw.yaml"),
        "{}",
        r.body
    );
    assert_eq!(
        metric(api, "tokenwatch_config_last_reload_successful").await,
        Some(0.0)
    );
    assert_eq!(
        metric(api, "tokenwatch_config_reloads_total{result=\"failure\"}").await,
        Some(1.0)
    );
    assert_eq!(
        routed_to(api, proxy, "after-bad", &tw).await,
        sim2.to_string()
    );
    let rules = get(&format!("http://{api}/api/v1/rules")).await.json();
    assert!(
        rule_names(&rules).contains(&"reload_probe".to_string()),
        "{rules}"
    );

    // A new `listen` waits for a restart; the rule's removal, sim 1 and the removal of sim 2's
    // target apply now.
    // Another `listen` (a free port, never bound: the change only waits for a restart).
    let moved = config(free_addr(), any, &data, sim1, &scrape(&[sim1]));
    std::fs::write(&file, moved).unwrap();
    let r = post_reload(api, None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(
        v["applied"],
        serde_json::json!(["proxy.upstreams", "alerting", "scrape.targets"]),
        "{v}"
    );
    assert_eq!(v["restart_required"], serde_json::json!(["listen"]), "{v}");
    assert_eq!(
        metric(api, "tokenwatch_config_last_reload_successful").await,
        Some(1.0)
    );
    assert_eq!(
        routed_to(api, proxy, "after-listen", &tw).await,
        sim1.to_string()
    );
    let rules = get(&format!("http://{api}/api/v1/rules")).await.json();
    assert!(
        !rule_names(&rules).contains(&"reload_probe".to_string()),
        "{rules}"
    );
    assert_eq!(targets(api).await, [sim1_target]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_needs_admin_is_audited_and_needs_a_file() {
    const VIEWER: &str = "rd-reload-viewer-5f1c2a9e";
    const ADMIN: &str = "ad-reload-admin-0b7d3c61";
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        format!("read {VIEWER} viewer\nadmin {ADMIN} ops\n"),
    )
    .unwrap();
    let file = dir.path().join("tw.yaml");
    let yaml = |extra: &str| format!("auth:\n  tokens_file: {}\n{extra}", tokens.display());
    std::fs::write(&file, yaml("")).unwrap();
    let (tw, api) = start_collector(dir.path(), &["-c", file.to_str().unwrap()]).await;

    std::fs::write(&file, yaml("slos: []\n")).unwrap();
    let r = post_reload(api, Some(VIEWER)).await;
    assert_eq!(r.status, 403, "{}", r.body);
    let r = post_reload(api, None).await;
    assert_eq!(r.status, 401, "{}", r.body);
    let r = post_reload(api, Some(ADMIN)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.json()["applied"],
        serde_json::json!(["slos"]),
        "{}",
        r.body
    );
    let slos = send(
        "GET",
        &format!("http://{api}/api/v1/slos"),
        None,
        &[("authorization", &format!("Bearer {VIEWER}"))],
    )
    .await
    .unwrap();
    assert_eq!(slos.status, 200, "{}", slos.body);

    // The audit log has the reload with its outcome, and the refused attempt as a request.
    let audit = dir.path().join("data").join("audit");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let text: String = std::fs::read_dir(&audit)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
                    .collect()
            })
            .unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let reloaded = lines.iter().any(|l| {
            l["event"] == "config_reloaded"
                && l["trigger"] == "api"
                && l["applied"] == serde_json::json!(["slos"])
        });
        let refused = lines
            .iter()
            .any(|l| l["path"] == "/-/reload" && l["status"] == 403 && l["caller"] == "viewer");
        if reloaded && refused {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "audit lines missing:\n{text}\nlog:\n{}",
            tw.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Started from flags alone: nothing to reload.
    let dir2 = tempfile::tempdir().unwrap();
    let (_flags_only, api2) = start_collector(dir2.path(), &[]).await;
    let r = post_reload(api2, None).await;
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(
        r.body.contains("started without a config file"),
        "{}",
        r.body
    );
}

/// A proxy replica's file (`role: proxy`): `upstream` serving `models`, shipping to `aggregator`
/// (nothing need listen there: a replica buffers), with `extra` appended.
fn replica_config(
    api: SocketAddr,
    proxy: SocketAddr,
    data: &Path,
    upstream: SocketAddr,
    models: &str,
    aggregator: SocketAddr,
    extra: &str,
) -> String {
    format!(
        "role: proxy\nlisten: {api}\ndata_dir: {}\naggregator:\n  endpoint: http://{aggregator}\nproxy:\n  listen: {proxy}\n  tenant_salt: replicas-share-this\n  upstreams:\n    - url: http://{upstream}\n      models: [{models}]\n      runtime: sim\n{extra}",
        data.display()
    )
}

/// A short non-streamed chat of `model` through `proxy`: its status.
async fn chat_status(proxy: SocketAddr, model: &str) -> u16 {
    let body = serde_json::json!({
        "model": model,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "which route?"}],
    })
    .to_string();
    send(
        "POST",
        &format!("http://{proxy}/v1/chat/completions"),
        Some(&body),
        &[("content-type", "application/json")],
    )
    .await
    .unwrap()
    .status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_replica_reloads_its_routes_on_sighup_without_cutting_a_held_stream() {
    let dir = tempfile::tempdir().unwrap();
    // Every answer as long as the request allows, 50 ms a token: the held stream (60 tokens)
    // takes about 3 s.
    let (_sim, sim) = start_sim(
        dir.path(),
        &[
            "--model",
            "model-a,model-b",
            "--itl-ms",
            "50",
            "--fault",
            "length_blowup:factor=100",
        ],
    )
    .await;
    // Listeners on port 0 (read back below); the aggregator's address is one nobody listens
    // on: what the replica ships is not looked at here.
    let (any, aggregator) = (any_addr(), free_addr());
    let data = dir.path().join("data");
    let file = dir.path().join("tw.yaml");
    let write = |models: &str, extra: &str| {
        std::fs::write(
            &file,
            replica_config(any, any, &data, sim, models, aggregator, extra),
        )
        .unwrap()
    };
    write("model-a", "");
    let tw = Proc::start(
        "replica",
        &["run", "-c", file.to_str().unwrap()],
        dir.path(),
    );
    let (api, proxy) = ready_on(&tw).await;
    assert_eq!(chat_status(proxy, "model-a").await, 200);
    let refused = chat_status(proxy, "model-b").await;
    assert_ne!(refused, 200, "model-b has no route yet");

    // Hold a stream open: its first bytes are in, the rest still comes.
    let req = http::Request::post(format!("http://{proxy}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(bytes::Bytes::from(chat(true, 60))))
        .unwrap();
    let resp = common::client().request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut held = Vec::new();
    while held.is_empty() {
        let frame = body.frame().await.expect("a first chunk").unwrap();
        if let Ok(data) = frame.into_data() {
            held.extend_from_slice(&data);
        }
    }

    // The upstream now serves model-b too; the aggregator's alerting section changes as well
    // (one file for every role). SIGHUP.
    write("model-a, model-b", "alerting:\n  evaluation_interval: 3s\n");
    let status = std::process::Command::new("kill")
        .args(["-HUP", &tw.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(15);
    while chat_status(proxy, "model-b").await != 200 {
        assert!(
            Instant::now() < deadline,
            "model-b never routed after SIGHUP; log:\n{}",
            tw.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        metric(api, "tokenwatch_config_reloads_total{result=\"success\"}").await,
        Some(1.0)
    );
    let log = tw.log();
    assert!(
        log.contains("configuration reloaded") && log.contains("alerting.evaluation_interval"),
        "{log}"
    );

    // The held stream finishes, whole, after the reload.
    let rest = tokio::time::timeout(Duration::from_secs(30), body.collect())
        .await
        .expect("the held stream ends")
        .unwrap()
        .to_bytes();
    assert!(
        String::from_utf8_lossy(&rest).contains("\"content\""),
        "nothing came after the reload"
    );
    held.extend_from_slice(&rest);
    let text = String::from_utf8_lossy(&held);
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(text.contains("\"finish_reason\":\"length\""), "{text}");

    // POST /-/reload: a changed limit waits for a restart (by key path), the aggregator's
    // sections are not used here, the routes stay.
    write(
        "model-a, model-b",
        "alerting:\n  evaluation_interval: 3s\nlimits:\n  max_headers: 64\n",
    );
    let r = post_reload(api, None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["applied"], serde_json::json!([]), "{v}");
    assert_eq!(
        v["restart_required"],
        serde_json::json!(["limits.max_headers"]),
        "{v}"
    );
    assert_eq!(
        v["not_used"],
        serde_json::json!(["alerting.evaluation_interval"]),
        "{v}"
    );
    assert_eq!(
        v["unchanged"],
        serde_json::json!(["proxy.upstreams", "proxy.routes"]),
        "{v}"
    );
    // A bad file is refused whole; model-b keeps its route.
    std::fs::write(
        &file,
        "role: proxy\nproxy:\n  upstreams:\n    - {url: 'ftp://x'}\n",
    )
    .unwrap();
    let r = post_reload(api, None).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(chat_status(proxy, "model-b").await, 200);
    let mut tw = tw;
    assert!(tw.terminate().success());
}
