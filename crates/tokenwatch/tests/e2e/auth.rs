// Authentication through the real binary: the refusal to listen off loopback without tokens
// (check-config and start), and with a tokens file 401 / 403 / 200 per role on the API, /metrics,
// the UI, OTLP/HTTP, OTLP/gRPC (the OpenTelemetry SDK) and embeddings; counting; rotation; no
// token in the log.

use crate::auth_support;
use crate::common;

use auth_support::*;
use common::{
    ANY, BIN, metric_value, python, send, start_collector, start_otlp_collector, write_auth_files,
};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn off_loopback_without_tokens_is_refused_by_check_config_and_run() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("read {READ}\n")).unwrap();
    let t = tokens.display();

    let (ok, out) = check_config(dir.path(), "listen: 0.0.0.0:9464\n");
    assert!(!ok, "{out}");
    assert!(
        out.contains("listen: 0.0.0.0:9464 is not a loopback address and no auth.tokens_file is set: set auth.tokens_file (or --auth-tokens) or opt out with auth.allow_unauthenticated: true"),
        "{out}"
    );
    let (ok, out) = check_config(dir.path(), "otlp:\n  grpc_listen: '[::]:4317'\n");
    assert!(
        !ok && out.contains("otlp.grpc_listen: [::]:4317 is not a loopback address"),
        "{out}"
    );
    let (ok, out) = check_config(
        dir.path(),
        &format!("listen: 0.0.0.0:9464\nauth:\n  tokens_file: {t}\n"),
    );
    assert!(ok, "{out}");
    let (ok, out) = check_config(
        dir.path(),
        "listen: 0.0.0.0:9464\nauth:\n  allow_unauthenticated: true\n",
    );
    assert!(ok, "{out}");

    // The proxy checks no tokens: a tokens file is not enough, proxy.allow_public is the key.
    let proxy = format!(
        "proxy:\n  listen: 0.0.0.0:8080\n  upstreams: [{{url: 'http://127.0.0.1:8000'}}]\nauth:\n  tokens_file: {t}\n"
    );
    let (ok, out) = check_config(dir.path(), &proxy);
    assert!(
        !ok && out.contains("proxy.listen: 0.0.0.0:8080 is not a loopback address")
            && out.contains("set proxy.allow_public: true"),
        "{out}"
    );
    let (ok, out) = check_config(
        dir.path(),
        &proxy.replace(
            "  listen: 0.0.0.0:8080\n",
            "  listen: 0.0.0.0:8080\n  allow_public: true\n",
        ),
    );
    assert!(ok, "{out}");

    // A bad tokens file names file:line and never shows the token.
    std::fs::write(
        &tokens,
        format!("# ops\nread {READ}\nadmin {ADMIN} ops trailing\n"),
    )
    .unwrap();
    let (ok, out) = check_config(dir.path(), &format!("auth:\n  tokens_file: {t}\n"));
    assert!(
        !ok && out.contains(&format!(
            "auth.tokens_file: {t}:3: expected `ROLE TOKEN [NAME]`, found 4 fields"
        )),
        "{out}"
    );
    assert!(!out.contains(ADMIN) && !out.contains(READ), "{out}");

    // `run` refuses before it opens anything: no data directory, nothing bound (so port 0).
    let data = dir.path().join("data");
    let public = "0.0.0.0:0";
    let out = Command::new(BIN)
        .args([
            "run",
            "--listen",
            public,
            "--no-otlp",
            "--data-dir",
            data.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!("listen: {public} is not a loopback address"))
            && err.contains("--auth-tokens"),
        "{err}"
    );
    assert!(
        !data.exists(),
        "run created its data directory before refusing"
    );
    let out = Command::new(BIN)
        .args([
            "run",
            "--listen",
            ANY,
            "--no-otlp",
            "--data-dir",
            data.to_str().unwrap(),
        ])
        .args(["--auth-tokens", tokens.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(&format!("{t}:3: ")),
        "{err}"
    );
    assert!(!err.contains(ADMIN) && !err.contains(READ), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_override_the_file_and_the_opt_out_is_a_warning_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tw.yaml");
    // The file alone listens off loopback; `--listen` replaces that before validation.
    std::fs::write(
        &file,
        "listen: 0.0.0.0:9464\nauth:\n  allow_unauthenticated: true\n",
    )
    .unwrap();
    let (mut tw, api) = start_collector(dir.path(), &["-c", &file.to_string_lossy()]).await;
    assert!(
        tw.log().contains("auth.allow_unauthenticated is true"),
        "{}",
        tw.log()
    );
    // No tokens: open as before.
    assert_eq!(
        send("GET", &format!("http://{api}/api/v1/fleet"), None, &[])
            .await
            .unwrap()
            .status,
        200
    );
    assert!(tw.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_guard_the_api_metrics_otlp_and_embeddings_and_tokens_rotate() {
    let dir = tempfile::tempdir().unwrap();
    let (tokens, file) = write_auth_files(
        dir.path(),
        &format!("# who\nread {READ}\n\ningest {INGEST}\nadmin {ADMIN}\n"),
    );
    let (mut tw, api, grpc, http) = start_otlp_collector(dir.path(), &file).await;

    let mut failures: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    let mut otlp_traces = route(
        "POST",
        format!("http://{http}/v1/traces"),
        Needs::Ingest,
        "otlp",
    );
    otlp_traces.body = Some(r#"{"resourceSpans":[]}"#.into());
    let routes = [
        route(
            "GET",
            format!("http://{api}/api/v1/fleet"),
            Needs::Read,
            "api",
        ),
        route("GET", format!("http://{api}/metrics"), Needs::Read, "api"),
        route(
            "GET",
            format!("http://{api}/api/v1/alerts"),
            Needs::Read,
            "api",
        ),
        route("GET", format!("http://{api}/"), Needs::Open, "api"),
        route("GET", format!("http://{api}/ui/app.js"), Needs::Open, "api"),
        route("GET", format!("http://{api}/healthz"), Needs::Open, "api"),
        route("GET", format!("http://{api}/readyz"), Needs::Open, "api"),
        otlp_traces,
        route(
            "POST",
            format!("http://{api}/api/v1/embeddings"),
            Needs::Ingest,
            "api",
        ),
    ];
    for r in &routes {
        for (caller, token) in CALLERS {
            // Embeddings: one valid item per caller.
            let embedding = format!(
                r#"{{"items":[{{"request_id":"emb-{caller}","model_id":"m","embedding":[0.5,0.25,0.125]}}]}}"#
            );
            let body = r.body.clone().or((r.method == "POST").then_some(embedding));
            let reply = call(r.method, &r.url, body.as_deref(), token).await;
            let what = format!("{} {} as {caller}", r.method, r.url);
            let want = expected(r.needs, caller);
            assert_eq!(reply.status, want, "{what}: {}", reply.body);
            if want != 200 {
                let reason = check_refusal(&reply, r.needs, caller, &what);
                *failures.entry((reason, r.listener)).or_default() += 1;
            }
        }
    }

    // OTLP/gRPC through the OpenTelemetry SDK's exporter, and raw calls for the status codes.
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/otlp_auth.py");
    let mut cmd = Command::new(python());
    cmd.args([script, "--endpoint", &grpc.to_string(), "--model", "authm"]);
    for (caller, token) in CALLERS {
        cmd.args(["--case", &format!("{caller}={}", token.unwrap_or(""))]);
    }
    let out = cmd.output().expect("running the OTLP auth script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    for (caller, code, sdk) in [
        ("none", "UNAUTHENTICATED", "FAILURE"),
        ("unknown", "UNAUTHENTICATED", "FAILURE"),
        ("read", "PERMISSION_DENIED", "FAILURE"),
        ("ingest", "OK", "SUCCESS"),
        ("admin", "OK", "SUCCESS"),
    ] {
        assert_eq!(
            (v[caller]["code"].as_str(), v[caller]["sdk"].as_str()),
            (Some(code), Some(sdk)),
            "{caller}: {v}"
        );
        if code != "OK" {
            let details = v[caller]["details"].as_str().unwrap_or_default();
            assert!(
                details.contains("needs an `ingest` token"),
                "{caller}: {details}"
            );
            let reason = if code == "PERMISSION_DENIED" {
                "forbidden"
            } else if caller == "none" {
                "missing"
            } else {
                "unknown"
            };
            // The SDK's export and the raw call.
            *failures.entry((reason, "otlp")).or_default() += 2;
        }
    }
    // Only the accepted exports were stored.
    let requests = |model: &'static str| {
        let url = format!("http://{api}/api/v1/requests?model={model}");
        async move { call("GET", &url, None, Some(READ)).await.json()["count"].as_u64() }
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while requests("authm-ingest").await != Some(1) || requests("authm-admin").await != Some(1) {
        assert!(
            Instant::now() < deadline,
            "accepted gRPC exports never stored; log:\n{}",
            tw.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for refused in ["authm-none", "authm-unknown", "authm-read"] {
        assert_eq!(requests(refused).await, Some(0), "{refused} was stored");
    }

    // Every refusal was counted, by reason and listener.
    let metrics = call("GET", &format!("http://{api}/metrics"), None, Some(ADMIN))
        .await
        .body;
    for ((reason, listener), n) in &failures {
        let series = format!(
            "tokenwatch_auth_failures_total{{reason=\"{reason}\",listener=\"{listener}\"}}"
        );
        assert_eq!(
            metric_value(&metrics, &series),
            Some(*n as f64),
            "{series}\n{metrics}"
        );
    }
    assert_eq!(failures.len(), 6, "{failures:?}");

    // Rotation: the new read token works within the reload interval, the old one stops.
    let fleet = format!("http://{api}/api/v1/fleet");
    std::fs::write(
        &tokens,
        format!("read {READ2}\ningest {INGEST}\nadmin {ADMIN}\n"),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while call("GET", &fleet, None, Some(READ2)).await.status != 200 {
        assert!(
            Instant::now() < deadline,
            "the new token was never accepted; log:\n{}",
            tw.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(call("GET", &fleet, None, Some(READ)).await.status, 401);
    // A broken file keeps the tokens in force and says where it is broken.
    std::fs::write(&tokens, format!("read {READ}\nread {READ}\n")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !tw.log().contains("already listed on line 1") {
        assert!(
            Instant::now() < deadline,
            "the bad file was never reported; log:\n{}",
            tw.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(call("GET", &fleet, None, Some(READ2)).await.status, 200);
    assert_eq!(call("GET", &fleet, None, Some(READ)).await.status, 401);

    let log = tw.log();
    assert!(
        log.contains("auth: tokens file reloaded")
            && log.contains(&format!("{}:2: ", tokens.display())),
        "{log}"
    );
    for t in [READ, INGEST, ADMIN, UNKNOWN, READ2] {
        assert!(!log.contains(t), "the log contains a token:\n{log}");
    }
    assert!(tw.terminate().success(), "{}", tw.log());
}

/// The UI in headless Chromium (ui/tests/auth.mjs): asks once, drops a refused token, keeps a good
/// one for the tab's session and sends it on every API call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_asks_once_for_a_token_and_keeps_it_for_the_session() {
    let ui = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ui");
    assert!(
        ui.join("node_modules/playwright-core/package.json")
            .is_file()
            && Path::new("/usr/bin/chromium").exists(),
        "ui/node_modules/playwright-core or /usr/bin/chromium is missing — run scripts/test.sh, which installs them"
    );
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("read {READ}\ningest {INGEST}\n")).unwrap();
    let (mut tw, api) =
        start_collector(dir.path(), &["--auth-tokens", &tokens.to_string_lossy()]).await;
    let out = Command::new("node")
        .current_dir(&ui)
        .args([
            "tests/auth.mjs",
            &format!("http://{api}"),
            READ,
            UNKNOWN,
            INGEST,
        ])
        .output()
        .expect("running node ui/tests/auth.mjs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}\nlog:\n{}",
        String::from_utf8_lossy(&out.stderr),
        tw.log()
    );
    assert!(tw.terminate().success());
}
