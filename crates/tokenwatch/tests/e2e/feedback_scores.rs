// Feedback and evaluation scores through the real binary: partial success of the two endpoints
// and the scores on the request, thumbs-down turning the drift vote, a toxic A/B arm, and
// flagged guardrail verdicts burning the guardrail-rate SLO.

use crate::alerting_support;
use crate::common;

use alerting_support::{FAST, MODEL, Req, Stack, Traffic, prompt};
use common::otlp::{numbered_chat_span as span, span_id, trace_id as trace};
use common::{Reply, assert_partial, get, now_ms, send};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The tests share the machine's cores: one at a time, so none's windows are starved.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn post(api: SocketAddr, path: &str, body: &Value) -> Reply {
    common::post(&format!("http://{api}{path}"), &body.to_string()).await
}

/// Stored records of the simulator's model (newest first, up to 500).
async fn records(api: SocketAddr) -> Vec<Value> {
    let r = get(&format!(
        "http://{api}/api/v1/requests?model={MODEL}&limit=500"
    ))
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["requests"].as_array().cloned().unwrap_or_default()
}

/// Until `stop`, posts one item (built by `item` from the record) to `path` for every new stored
/// record, every 300 ms.
fn score_new_records(
    api: SocketAddr,
    path: &'static str,
    stop: Arc<std::sync::atomic::AtomicBool>,
    item: fn(&Value) -> Option<Value>,
) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut seen = HashSet::new();
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let items: Vec<Value> = records(api)
                .await
                .into_iter()
                .filter(|r| seen.insert(r["request_id"].as_str().unwrap_or("").to_string()))
                .filter_map(|r| item(&r))
                .collect();
            for chunk in items.chunks(200) {
                let r = post(api, path, &json!({ "items": chunk })).await;
                assert_eq!(r.status, 200, "{}", r.body);
                assert_eq!(r.json()["rejected"], 0, "{}", r.body);
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        seen.len()
    })
}

#[tokio::test]
async fn bad_items_are_named_and_good_ones_show_on_the_request() {
    let _serial = SERIAL.lock().await;
    let s = Stack::with_sim(FAST, "alerting: {resolve_after: 10s}\n").await;
    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]});
    let r = send(
        "POST",
        &format!("http://{}/v1/chat/completions", s.proxy),
        Some(&chat.to_string()),
        &[("x-request-id", "fb-req-1")],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let rec = common::stored_record(s.api, "fb-req-1", &s.tw).await;
    assert_eq!(rec["scores"], json!([]), "{rec:#}");

    // Feedback as a bare array: one good item, two bad ones named by index and field.
    let r = post(
        s.api,
        "/api/v1/feedback",
        &json!([
            {"request_id": "fb-req-1", "thumbs": "down", "guardrail_flagged": true},
            {"request_id": "fb-req-1", "thumbs": "meh"},
            {"thumbs": "up"},
        ]),
    )
    .await;
    let v = assert_partial(&r, 1, 2);
    assert_eq!(v["errors"][0]["index"], 1, "{v:#}");
    assert_eq!(v["errors"][0]["field"], "items[1].thumbs", "{v:#}");
    assert!(
        v["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("\"up\" or \"down\""),
        "{v:#}"
    );
    assert_eq!(v["errors"][1]["index"], 2, "{v:#}");
    assert!(
        v["errors"][1]["message"]
            .as_str()
            .unwrap()
            .contains("request_id or trace_id"),
        "{v:#}"
    );

    // Scores in the `items` object: a map of scores, a bad name, a non-finite-ish value.
    let r = post(
        s.api,
        "/api/v1/scores",
        &json!({"items": [
            {"request_id": "fb-req-1", "scores": {"toxicity": 0.75, "bleu": 0.25}, "retrieval_recall": 0.5},
            {"request_id": "fb-req-1", "name": "Toxicity!", "value": 1},
            {"request_id": "fb-req-1", "name": "bleu", "value": "high"},
        ]}),
    )
    .await;
    let v = assert_partial(&r, 1, 2);
    assert_eq!(v["errors"][0]["field"], "items[1].name", "{v:#}");
    assert_eq!(v["errors"][1]["field"], "items[2].value", "{v:#}");

    // Nothing good: 400 naming the first problem; not JSON: 400.
    let r = post(s.api, "/api/v1/scores", &json!([{"request_id": "x"}])).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.json()["error"]
            .as_str()
            .unwrap()
            .contains("items[0] carries nothing"),
        "{}",
        r.body
    );
    let r = common::post(&format!("http://{}/api/v1/feedback", s.api), "{").await;
    assert_eq!(r.status, 400, "{}", r.body);

    let rec = get(&format!("http://{}/api/v1/requests/fb-req-1", s.api))
        .await
        .json();
    let got: HashSet<(String, String, String)> = rec["scores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["name"].as_str().unwrap().to_string(),
                x["value"].to_string(),
                x["source"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want: HashSet<(String, String, String)> = [
        ("thumbs", "0.0", "feedback"),
        ("guardrail", "1.0", "feedback"),
        ("toxicity", "0.75", "scores"),
        ("bleu", "0.25", "scores"),
        ("retrieval_recall", "0.5", "scores"),
    ]
    .into_iter()
    .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
    .collect();
    assert_eq!(got, want, "{rec:#}");
}

const DRIFT_CONFIG: &str = r#"
alerting:
  resolve_after: 60s
  overrides:
    drift_vote: {window: 10s, for: 0s, params: {min_samples: 20}}
    output_length_outlier: {enabled: false}
"#;

#[tokio::test]
async fn thumbs_down_burst_turns_the_drift_vote() {
    let _serial = SERIAL.lock().await;
    let s = Stack::collector(DRIFT_CONFIG).await;
    // Two models with the same shift of output length (KS says drift, no embeddings: one
    // signal is too few to vote); only `fb-model` gets a burst of thumbs-down.
    let mut spans = Vec::new();
    let mut feedback = Vec::new();
    for (k, model) in ["fb-model", "calm-model"].into_iter().enumerate() {
        let base = k * 1000;
        for i in 0..40 {
            let ago = 60_000 - i as i64 * 1_100;
            spans.push(span(base + i, model, ago, 95 + (i % 10) as u64));
            if model == "fb-model" {
                // The reference: mostly thumbs up.
                let up = i % 10 != 0;
                feedback.push(
                    json!({"trace_id": trace(base + i), "thumbs": if up {"up"} else {"down"},
                                     "timestamp_unix_ms": now_ms() - ago}),
                );
            }
        }
        for i in 40..70 {
            spans.push(span(base + i, model, 0, 395 + (i % 10) as u64));
            if model == "fb-model" {
                feedback.push(json!({"trace_id": trace(base + i), "thumbs": "down"}));
            }
        }
    }
    common::otlp::post_otlp_spans(s.otlp_http, "rag-app", spans).await;
    let r = post(s.api, "/api/v1/feedback", &json!({ "items": feedback })).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["accepted"], 70, "{}", r.body);

    let a = s
        .wait_firing("drift_vote", Duration::from_secs(20), |a| {
            a["labels"]["model_id"] == "fb-model"
        })
        .await;
    let ev = &a["last_event"]["evidence"];
    assert_eq!(
        (ev["ks"].as_bool(), ev["feedback"].as_bool()),
        (Some(true), Some(true)),
        "{a:#}"
    );
    assert!(ev["embedding"].is_null(), "{a:#}");
    assert!(
        ev["feedback_thumbs_down_current"].as_f64().unwrap() > 0.9,
        "{a:#}"
    );
    assert!(
        ev["feedback_thumbs_down_reference"].as_f64().unwrap() < 0.2,
        "{a:#}"
    );
    // The same shift without feedback does not reach the vote (the evaluation ran for both).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let calm: Vec<Value> = s
        .alerts()
        .await
        .into_iter()
        .filter(|a| a["rule"] == "drift_vote" && a["labels"]["model_id"] == "calm-model")
        .collect();
    assert!(calm.is_empty(), "{calm:#?}");
}

const AB_CONFIG: &str = r#"
alerting:
  resolve_after: 10s
  rules:
    - name: ab_regression
      detector: ab_regression
      signal: e2e
      window: 10s
      params: {min_requests: 40}
"#;

#[tokio::test]
async fn toxic_arm_b_raises_the_ab_regression_alert() {
    let _serial = SERIAL.lock().await;
    let s = Stack::with_sim(FAST, AB_CONFIG).await;
    // Alternate arms on the same simulator: latency alike, a 50/50 split.
    let traffic = Traffic::start(
        s.proxy,
        4,
        Arc::new(|_, w, i| {
            let group = if i % 2 == 0 { "b" } else { "a" };
            Req {
                content: prompt(&format!("w{w}-r{i}-{group}"), 40),
                headers: vec![("x-ab-group", group.to_string())],
                max_tokens: None,
            }
        }),
    );
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poster = score_new_records(s.api, "/api/v1/scores", stop.clone(), |r| {
        let tox = match r["ab_group"].as_str()? {
            "b" => 0.4,
            "a" => 0.01,
            _ => return None,
        };
        Some(json!({"request_id": r["request_id"], "scores": {"toxicity": tox, "factuality": 0.9}}))
    });
    let a = s
        .wait_firing("ab_regression", Duration::from_secs(40), |_| true)
        .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    traffic.stop().await;
    assert!(poster.await.unwrap() > 0);
    let ev = &a["last_event"]["evidence"];
    assert_eq!(ev["toxicity_regression"], true, "{a:#}");
    assert_eq!(ev["quality_regression"], false, "{a:#}");
    assert_eq!(ev["quality_score"], "factuality", "{a:#}");
    let (ta, tb) = (
        ev["toxicity_a"].as_f64().unwrap(),
        ev["toxicity_b"].as_f64().unwrap(),
    );
    assert!((ta - 0.01).abs() < 1e-9 && (tb - 0.4).abs() < 1e-9, "{a:#}");
    // The trend per model and prompt version on /metrics: toxicity's mean is between the arms'.
    let series = format!(
        "tokenwatch_score_mean{{model_id=\"{MODEL}\",prompt_version=\"\",name=\"toxicity\"}}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = get(&format!("http://{}/metrics", s.api)).await.body;
        if let Some(v) = common::metric_value(&text, &series) {
            assert!(v > 0.01 && v < 0.4, "{v}");
            let n = format!(
                "tokenwatch_score_samples{{model_id=\"{MODEL}\",prompt_version=\"\",name=\"toxicity\"}}"
            );
            assert!(
                common::metric_value(&text, &n).is_some_and(|n| n >= 40.0),
                "{text}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "no {series} in:\n{text}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

const SLO_CONFIG: &str = r#"
alerting:
  resolve_after: 10s
  overrides:
    slo_burn: {params: {min_requests: 10}}
    slo_burn_slow: {params: {min_requests: 10}}
slos:
  - name: guardrail_rate
    objective: guardrail_rate
    window: 10m
    burn_windows: {fast_long: 20s, fast_short: 10s, slow_long: 60s, slow_short: 15s}
"#;

#[tokio::test]
async fn flagged_guardrail_verdicts_burn_the_guardrail_slo() {
    let _serial = SERIAL.lock().await;
    let s = Stack::with_sim(FAST, SLO_CONFIG).await;
    let traffic = Traffic::plain(s.proxy, 4);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Nine requests in ten flagged: a 90 % bad rate against a 3.5 % budget (burn ≈ 26×).
    let poster = score_new_records(s.api, "/api/v1/feedback", stop.clone(), |r| {
        let id = r["request_id"].as_str()?;
        let flagged = id.bytes().map(u32::from).sum::<u32>() % 10 != 0;
        Some(json!({"request_id": id, "guardrail_flagged": flagged}))
    });
    let page = s
        .wait_firing("slo_burn", Duration::from_secs(45), |a| {
            a["labels"]["slo"] == "guardrail_rate"
        })
        .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    traffic.stop().await;
    assert!(poster.await.unwrap() > 0);
    assert_eq!(page["labels"]["model_id"], MODEL, "{page:#}");
    let ev = &page["last_event"]["evidence"];
    assert!(
        ev["burn_rate_20s"].as_f64().is_some_and(|b| b >= 14.4),
        "{page:#}"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let body = get(&format!("http://{}/api/v1/slos?slo=guardrail_rate", s.api))
            .await
            .json();
        let series = body["slos"].as_array().and_then(|a| a.first().cloned());
        if let Some(x) = series.filter(|x| x["sli"].is_number()) {
            assert!(x["sli"].as_f64().unwrap() < 0.5, "{x:#}");
            assert!(x["budget_remaining"].as_f64().unwrap() < 1.0, "{x:#}");
            assert!(x["bad"].as_u64().unwrap() > 0, "{x:#}");
            break;
        }
        assert!(Instant::now() < deadline, "{body:#}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn span_attribute_scores_reach_the_request() {
    let _serial = SERIAL.lock().await;
    let s = Stack::collector(DRIFT_CONFIG).await;
    let mut genai = span(7, "attr-model", 0, 120);
    genai["attributes"].as_array_mut().unwrap().extend([
        json!({"key": "tokenwatch.feedback.thumbs", "value": {"stringValue": "down"}}),
        json!({"key": "tokenwatch.score.toxicity", "value": {"doubleValue": 0.3}}),
        json!({"key": "tokenwatch.retrieval.recall", "value": {"doubleValue": 7.0}}),
    ]);
    // An evaluation span of the same trace (not a model call): its verdict is the trace's.
    let eval = json!({
        "traceId": trace(7),
        "spanId": format!("{:016x}", 0xeee007),
        "name": "guardrail check",
        "kind": 1,
        "startTimeUnixNano": ((now_ms() - 500) as i128 * 1_000_000).to_string(),
        "endTimeUnixNano": (now_ms() as i128 * 1_000_000).to_string(),
        "attributes": [{"key": "tokenwatch.guardrail.flagged", "value": {"boolValue": true}}]
    });
    common::otlp::post_otlp_spans(s.otlp_http, "rag-app", vec![genai, eval]).await;
    // The out-of-range recall is ignored (as a bad embedding attribute is: the span is kept).
    let id = span_id(7);
    let rec = common::stored_record(s.api, &id, &s.tw).await;
    let mut got: Vec<(String, f64, String)> = rec["scores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["name"].as_str().unwrap().to_string(),
                x["value"].as_f64().unwrap(),
                x["source"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        got,
        vec![
            ("guardrail".to_string(), 1.0, "span".to_string()),
            ("thumbs".to_string(), 0.0, "span".to_string()),
            ("toxicity".to_string(), 0.3, "span".to_string()),
        ],
        "{rec:#}"
    );
}
