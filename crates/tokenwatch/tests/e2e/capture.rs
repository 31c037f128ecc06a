// End to end through the real binaries: with `capture.text` on, prompts and completions are
// stored with personal data replaced by keyed hashes (never in the database file), joinable
// across requests, with the region from a header or the tenant; with it off nothing is kept.

use crate::common;

use common::otlp::post_otlp_json;
use common::*;
use serde_json::Value;
use std::net::SocketAddr;

const EMAIL: &str = "Jane.Doe@example.com";
const CARD: &str = "4111 1111 1111 1111";
const PHONE: &str = "+1 415 555 0100";

/// Sends a chat request with `prompt`; returns the answer's text as the client received it.
async fn chat(
    proxy: SocketAddr,
    id: &str,
    prompt: &str,
    stream: bool,
    headers: &[(&str, &str)],
) -> String {
    let body = serde_json::json!({
        "model": "m", "stream": stream, "max_tokens": 12,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": prompt}],
    });
    let mut h = vec![("x-request-id", id)];
    h.extend_from_slice(headers);
    chat_answer(proxy, &body, &h).await
}

/// The `[kind:hash]` token that replaced a value of `kind` in `text`.
fn token<'a>(text: &'a str, kind: &str) -> &'a str {
    let start = text
        .find(&format!("[{kind}:"))
        .unwrap_or_else(|| panic!("no {kind} token in {text:?}"));
    let end = start + text[start..].find(']').unwrap() + 1;
    &text[start..end]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn captured_text_is_masked_before_storage_joinable_and_regioned() {
    let stack = Stack::start_with_config(
        &["--model", "m", "--ttft-ms", "20", "--itl-ms", "5"],
        "capture:\n  text: true\n  tenant_regions: {acme: eu}\n\
         retention:\n  regions: {eu: 7d, default: 30d}\n",
    )
    .await;

    let p1 = format!("Mail {EMAIL} or call {PHONE}; card {CARD}; server 10.1.2.3 runs v1.2.3.4.");
    let answer1 = chat(
        stack.proxy,
        "cap-1",
        &p1,
        true,
        &[("x-tokenwatch-region", "EU")],
    )
    .await;
    let p2 = format!(
        "Write to {} again; order 1234567812345678.",
        EMAIL.to_lowercase()
    );
    let answer2 = chat(stack.proxy, "cap-2", &p2, false, &[("x-tenant-id", "acme")]).await;
    chat(stack.proxy, "cap-3", "No personal data here.", true, &[]).await;

    let r1 = stored_record(stack.api, "cap-1", &stack.tw).await;
    let t1 = &r1["text"];
    let prompt1 = t1["prompt"].as_str().unwrap();
    assert!(
        prompt1.starts_with("system: Be brief.\nuser: Mail [email:"),
        "{prompt1}"
    );
    for (kind, raw) in [
        ("email", EMAIL),
        ("phone", PHONE),
        ("card", CARD),
        ("ipv4", "10.1.2.3"),
    ] {
        assert!(!prompt1.contains(raw), "{raw} stored: {prompt1}");
        let t = token(prompt1, kind);
        assert_eq!(t.len(), kind.len() + 2 + 1 + 16, "{t}");
        assert_eq!(t1["masked"][kind], 1, "{t1}");
    }
    assert!(
        prompt1.contains("v1.2.3.4"),
        "a version string is not an address: {prompt1}"
    );
    assert_eq!(t1["region"], "eu", "from the header, lowercased");
    assert_eq!(
        t1["completion"],
        answer1.as_str(),
        "the streamed answer as the client saw it"
    );
    assert!(!answer1.is_empty());
    assert_eq!(t1["truncated"], false);

    let r2 = stored_record(stack.api, "cap-2", &stack.tw).await;
    let prompt2 = r2["text"]["prompt"].as_str().unwrap();
    assert_eq!(
        token(prompt1, "email"),
        token(prompt2, "email"),
        "the same address joins across requests"
    );
    assert!(
        prompt2.contains("order 1234567812345678"),
        "a number failing Luhn stays: {prompt2}"
    );
    assert_eq!(r2["text"]["region"], "eu", "from the tenant");
    assert_eq!(r2["text"]["completion"], answer2.as_str());

    let r3 = stored_record(stack.api, "cap-3", &stack.tw).await;
    assert_eq!(r3["text"]["region"], "default");
    assert_eq!(
        r3["text"]["prompt"],
        "system: Be brief.\nuser: No personal data here."
    );

    // Lists leave the text out; the database never held the raw values.
    let list = get(&format!("http://{}/api/v1/requests?limit=10", stack.api))
        .await
        .json();
    assert_eq!(list["count"], 3, "{list}");
    assert!(
        list["requests"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r.get("text").is_none()),
        "{list}"
    );
    let stored = dir_bytes(&stack.data_dir());
    assert!(
        bytes_contain(&stored, "Be brief."),
        "the text is in the data directory"
    );
    for raw in [EMAIL, &EMAIL.to_lowercase(), PHONE, CARD, "10.1.2.3"] {
        assert!(
            !bytes_contain(&stored, raw),
            "{raw} reached the data directory"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_capture_no_text_is_kept_and_bad_settings_are_refused() {
    let stack = Stack::start(&["--model", "m", "--ttft-ms", "20", "--itl-ms", "5"], &[]).await;
    chat(stack.proxy, "plain-1", &format!("Mail {EMAIL}"), true, &[]).await;
    let r = stored_record(stack.api, "plain-1", &stack.tw).await;
    assert!(r.get("text").is_none(), "{r}");
    assert!(
        !bytes_contain(&dir_bytes(&stack.data_dir()), "Be brief."),
        "no text stored when capture is off"
    );

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.yaml");
    std::fs::write(
        &config,
        "capture:\n  text: true\n  mask:\n    national_ids:\n      - {name: badge, pattern: 'B(\\d{4}'}\n",
    )
    .unwrap();
    let out = std::process::Command::new(BIN)
        .args(["check-config", &config.to_string_lossy()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("capture.mask.national_ids[0].pattern"),
        "{err}"
    );
    std::fs::write(&config, "retention:\n  regions: {eu: 7d, 'eu west': 1d}\n").unwrap();
    let out = std::process::Command::new(BIN)
        .args(["check-config", &config.to_string_lossy()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("retention.regions.eu west"), "{err}");
}

/// A collector-only tokenwatch with OTLP/HTTP on a free port and `capture.text` as given.
async fn otlp_collector(dir: &std::path::Path, capture: bool) -> (Proc, SocketAddr, SocketAddr) {
    start_otlp_collector_with(dir, &format!("capture:\n  text: {capture}\n")).await
}

/// Sends a GenAI span whose attributes carry the prompt (as the OpenTelemetry GenAI
/// instrumentations do) and a `gen_ai.user.message` log event; returns what the trace API
/// stored: (the span's attributes, the log's body).
async fn send_content(api: SocketAddr, otlp: SocketAddr, tw: &Proc) -> (Value, String) {
    let trace = "6b8efff798038103d269b633813fc60d";
    let now = now_ns();
    let messages = serde_json::json!([{"role": "user", "parts": [{"type": "text", "content": format!("mail {EMAIL}")}]}]);
    let attr = |k: &str, v: Value| serde_json::json!({"key": k, "value": v});
    let span = serde_json::json!({"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": trace, "spanId": "aee19b7ec3c1b174", "name": "chat m", "kind": 3,
        "startTimeUnixNano": (now - 1_000_000_000).to_string(), "endTimeUnixNano": now.to_string(),
        "attributes": [attr("gen_ai.operation.name", serde_json::json!({"stringValue": "chat"})),
                       attr("gen_ai.request.model", serde_json::json!({"stringValue": "m"})),
                       attr("gen_ai.input.messages", serde_json::json!({"stringValue": messages.to_string()}))]}]}]}]});
    let log = serde_json::json!({"resourceLogs": [{"scopeLogs": [{"logRecords": [{
        "timeUnixNano": now.to_string(), "traceId": trace, "spanId": "aee19b7ec3c1b174", "eventName": "gen_ai.user.message",
        "body": {"stringValue": format!("mail {EMAIL}")}}]}]}]});
    post_otlp_json(otlp, "traces", &span).await;
    post_otlp_json(otlp, "logs", &log).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let t = get(&format!("http://{api}/api/v1/traces/{trace}"))
            .await
            .json();
        if let (Some(span), Some(log)) = (t["spans"].get(0), t["logs"].get(0)) {
            return (
                span["attributes"].clone(),
                log["body"].as_str().unwrap_or("").to_string(),
            );
        }
        assert!(
            std::time::Instant::now() < deadline,
            "trace never stored: {t}\n{}",
            tw.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_text_in_received_spans_and_logs_is_dropped_or_masked() {
    let off = tempfile::tempdir().unwrap();
    let (tw, api, otlp) = otlp_collector(off.path(), false).await;
    let (attrs, body) = send_content(api, otlp, &tw).await;
    assert!(
        attrs.get("gen_ai.input.messages").is_none(),
        "capture off: not stored: {attrs}"
    );
    assert_eq!(attrs["gen_ai.request.model"], "m", "{attrs}");
    assert_eq!(
        body, "",
        "capture off: the content event's body is not stored"
    );
    drop(tw);
    assert!(!bytes_contain(&dir_bytes(&off.path().join("data")), EMAIL));

    let on = tempfile::tempdir().unwrap();
    let (tw, api, otlp) = otlp_collector(on.path(), true).await;
    let (attrs, body) = send_content(api, otlp, &tw).await;
    let messages = attrs["gen_ai.input.messages"]
        .as_str()
        .unwrap_or_else(|| panic!("{attrs}"));
    assert!(
        messages.contains("mail [email:") && !messages.contains(EMAIL),
        "{messages}"
    );
    assert!(
        body.starts_with("mail [email:") && !body.contains(EMAIL),
        "{body}"
    );
    drop(tw);
    assert!(!bytes_contain(&dir_bytes(&on.path().join("data")), EMAIL));
}

/// A span and a plain log record whose free text holds personal data outside the prompt
/// attributes (span name, status message, `user.email`, `client.address`, OpenLLMetry's entity
/// input, the log's body), plus a tailed log line; returns (the stored span, the stored log's
/// body, the log templates' JSON) once all are stored and mined.
async fn send_personal_data(
    api: SocketAddr,
    otlp: SocketAddr,
    tw: &Proc,
    log_file: &std::path::Path,
) -> (Value, String, String) {
    let trace = "7c9f0008a9149214e37ac744924fd71e";
    let now = now_ns();
    let s = |v: &str| serde_json::json!({"stringValue": v});
    let attr = |k: &str, v: Value| serde_json::json!({"key": k, "value": v});
    let span = serde_json::json!({"resourceSpans": [{
        "resource": {"attributes": [attr("service.name", s("billing"))]},
        "scopeSpans": [{"spans": [{
        "traceId": trace, "spanId": "bff19b7ec3c1b175", "name": format!("lookup {EMAIL}"), "kind": 1,
        "startTimeUnixNano": (now - 1_000_000_000).to_string(), "endTimeUnixNano": now.to_string(),
        "status": {"code": 2, "message": format!("card {CARD} declined")},
        "attributes": [attr("user.email", s(EMAIL)),
                       attr("client.address", s("203.0.113.7")),
                       attr("server.address", s("10.0.0.7")),
                       attr("traceloop.entity.input", s(&format!("{{\"to\": \"{EMAIL}\"}}"))),
                       attr("http.route", s("/customers/{id}"))]}]}]}]});
    let log = serde_json::json!({"resourceLogs": [{
        "resource": {"attributes": [attr("service.name", s("billing"))]},
        "scopeLogs": [{"logRecords": [{
        "timeUnixNano": now.to_string(), "traceId": trace, "spanId": "bff19b7ec3c1b175",
        "severityNumber": 17, "severityText": "ERROR",
        "body": s(&format!("login failed from 203.0.113.7 for {EMAIL}"))}]}]}]});
    post_otlp_json(otlp, "traces", &span).await;
    post_otlp_json(otlp, "logs", &log).await;
    std::fs::write(
        log_file,
        format!("ERROR 12-07 10:00:01 payment failed for card {CARD} from 198.51.100.23\n"),
    )
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let t = get(&format!("http://{api}/api/v1/traces/{trace}"))
            .await
            .json();
        let templates = get(&format!("http://{api}/api/v1/logs/templates?limit=100"))
            .await
            .body;
        if let (Some(span), Some(log)) = (t["spans"].get(0), t["logs"].get(0))
            && templates.contains("payment failed")
            && templates.contains("login failed")
        {
            return (
                span.clone(),
                log["body"].as_str().unwrap_or("").to_string(),
                templates,
            );
        }
        assert!(
            std::time::Instant::now() < deadline,
            "trace or templates never stored: {t}\n{templates}\n{}",
            tw.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn personal_data_in_other_telemetry_text_is_masked_with_capture_off() {
    let dir = tempfile::tempdir().unwrap();
    let log_file = dir.path().join("app.log");
    std::fs::write(&log_file, "").unwrap();
    let yaml = format!(
        "sources:\n  files:\n    - path: {}\n      runtime: app\n      instance: billing-1\n\
         logs:\n  poll_interval: 100ms\n",
        log_file.display()
    );
    let (tw, api, otlp) = start_otlp_collector_with(dir.path(), &yaml).await;
    let (span, body, templates) = send_personal_data(api, otlp, &tw, &log_file).await;
    let name = span["name"].as_str().unwrap();
    assert!(name.starts_with("lookup [email:"), "{span}");
    let status = span["status_message"].as_str().unwrap();
    assert!(
        status.starts_with("card [card:") && status.ends_with("] declined"),
        "{span}"
    );
    let attrs = &span["attributes"];
    assert!(
        attrs["user.email"].as_str().unwrap().starts_with("[email:"),
        "{attrs}"
    );
    assert!(
        attrs["client.address"]
            .as_str()
            .unwrap()
            .starts_with("[ipv4:"),
        "{attrs}"
    );
    assert_eq!(
        attrs["server.address"], "10.0.0.7",
        "kept verbatim: {attrs}"
    );
    assert_eq!(attrs["http.route"], "/customers/{id}", "{attrs}");
    assert!(
        attrs.get("traceloop.entity.input").is_none(),
        "an entity's input is a prompt: dropped with capture off: {attrs}"
    );
    // The same address gives the same token in the span name and in the attribute.
    assert_eq!(token(name, "email"), attrs["user.email"].as_str().unwrap());
    assert!(
        body.starts_with("login failed from [ipv4:") && body.contains(" for [email:"),
        "{body}"
    );
    for raw in [
        EMAIL,
        "203.0.113.7",
        "198.51.100.23",
        "4111 1111",
        "4111111111111111",
    ] {
        assert!(
            !templates.contains(raw),
            "{raw} in the templates: {templates}"
        );
        assert!(
            !span.to_string().contains(raw) && !body.contains(raw),
            "{raw}"
        );
    }
    // One template per line shape: the tokens are typed fields.
    assert!(
        templates.contains("login failed from <IP> for <PII>")
            && templates.contains("payment failed for card <PII> from <IP>"),
        "{templates}"
    );
    drop(tw);
    let data = dir_bytes(&dir.path().join("data"));
    for raw in [EMAIL, "203.0.113.7", "198.51.100.23", "4111 1111 1111 1111"] {
        assert!(
            !bytes_contain(&data, raw),
            "{raw} reached the data directory"
        );
    }
}

/// The request's own labels come from the caller too: a model named with an address, a tenant
/// header holding an email, an `x-request-id` holding one. With masking on (the default) none
/// reaches `/metrics`, the API or the data directory, and each is masked the same way every time
/// (one tenant stays one tenant). A request id a second caller reuses does not take over the
/// first caller's record: the first keeps the id, the second is stored as `<id>~<8 hex>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn personal_data_in_request_labels_is_masked_and_a_reused_request_id_keeps_its_first_record()
{
    let model = "support-bot 10.1.2.3";
    let mut stack =
        Stack::start_with_config(&["--model", model, "--ttft-ms", "5", "--itl-ms", "1"], "").await;
    let body = serde_json::json!({
        "model": model, "stream": true, "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}],
    });
    // The id is the address itself: stored as the same token as the tenant.
    chat_answer(
        stack.proxy,
        &body,
        &[("x-request-id", EMAIL), ("x-tenant-id", EMAIL)],
    )
    .await;
    // The same id twice, from two tenants: the first caller's record must answer a lookup.
    let plain = serde_json::json!({
        "model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
    });
    chat_answer(
        stack.proxy,
        &plain,
        &[("x-request-id", "shared-id"), ("x-tenant-id", "first")],
    )
    .await;
    chat_answer(
        stack.proxy,
        &plain,
        &[("x-request-id", "shared-id"), ("x-tenant-id", "second")],
    )
    .await;

    let masked_id = token_of_email(&stack).await;
    let r = stored_record(stack.api, &masked_id, &stack.tw).await;
    assert!(
        r["model_id"]
            .as_str()
            .unwrap()
            .starts_with("support-bot [ipv4:"),
        "{r}"
    );
    assert!(r["tenant"].as_str().unwrap().starts_with("[email:"), "{r}");
    assert_eq!(r["tenant"], r["request_id"], "one address, one token: {r}");
    let first = stored_record(stack.api, "shared-id", &stack.tw).await;
    assert_eq!(first["tenant"], "first", "{first}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let second = loop {
        let list = get(&format!(
            "http://{}/api/v1/requests?tenant=second&limit=5",
            stack.api
        ))
        .await
        .json();
        if let Some(r) = list["requests"].as_array().and_then(|a| a.first()) {
            break r.clone();
        }
        assert!(std::time::Instant::now() < deadline, "{list}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let id = second["request_id"].as_str().unwrap();
    assert!(
        id.starts_with("shared-id~") && id.len() == "shared-id~".len() + 8,
        "{id}"
    );
    let metrics = get(&format!("http://{}/metrics", stack.api)).await.body;
    assert!(
        metric_sum(&metrics, "tokenwatch_request_ids_reused_total") >= 1.0,
        "{metrics}"
    );
    assert!(
        metric_sum(&metrics, "tokenwatch_record_labels_masked_total") >= 3.0,
        "{metrics}"
    );
    let requests = get(&format!("http://{}/api/v1/requests?limit=50", stack.api))
        .await
        .body;
    for raw in [EMAIL, "10.1.2.3"] {
        assert!(!metrics.contains(raw), "{raw} on /metrics:\n{metrics}");
        assert!(!requests.contains(raw), "{raw} in the API: {requests}");
    }
    stack.tw.terminate();
    let data = dir_bytes(&stack.data_dir());
    for raw in [EMAIL, "10.1.2.3"] {
        assert!(
            !bytes_contain(&data, raw),
            "{raw} reached the data directory"
        );
    }
}

/// The masked form of `EMAIL` as this stack's key writes it: read back from the tenant of the
/// stored records (the only email the test sends).
async fn token_of_email(stack: &Stack) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let list = get(&format!("http://{}/api/v1/requests?limit=50", stack.api))
            .await
            .json();
        if let Some(t) = list["requests"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|r| {
                r["tenant"]
                    .as_str()
                    .filter(|t| t.starts_with("[email:"))
                    .map(String::from)
            })
        {
            return t;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no masked tenant: {list}\n{}",
            stack.tw.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
