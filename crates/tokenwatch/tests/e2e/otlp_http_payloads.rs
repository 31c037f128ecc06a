// Raw OTLP/HTTP requests against a running `tokenwatch run`: OTLP/JSON accepted with partial
// success, malformed payloads answered 400/413/415 with clear messages, and the server keeps serving.

use crate::common;

use bytes::Bytes;
use common::{ANY, Proc, get, wait_ready};
use flate2::Compression;
use flate2::write::GzEncoder;
use http_body_util::{BodyExt, Full};
use std::io::Write;
use std::time::{Duration, Instant};

struct Reply {
    status: u16,
    content_type: String,
    body: Vec<u8>,
}

impl Reply {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

async fn post(url: &str, body: Vec<u8>, headers: &[(&str, &str)]) -> Reply {
    let n = body.len();
    let mut b = http::Request::builder().method("POST").uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b.body(Full::new(Bytes::from(body))).unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(30), common::client().request(req))
        .await
        .expect("timed out")
        .unwrap_or_else(|e| panic!("POST {url} ({headers:?}, {n} bytes): {e:?}"));
    let status = resp.status().as_u16();
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    Reply {
        status,
        content_type,
        body,
    }
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

const JSON: (&str, &str) = ("content-type", "application/json");
const PROTO: (&str, &str) = ("content-type", "application/x-protobuf");

fn json_traces(now_ns: u128) -> String {
    let (start, end) = (now_ns - 2_000_000_000, now_ns);
    format!(
        r#"{{"resourceSpans":[{{"resource":{{"attributes":[{{"key":"service.name","value":{{"stringValue":"curl-app"}}}}]}},
        "scopeSpans":[{{"scope":{{"name":"raw"}},"spans":[
          {{"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","name":"chat json-model","kind":3,
            "startTimeUnixNano":"{start}","endTimeUnixNano":"{end}",
            "attributes":[{{"key":"gen_ai.operation.name","value":{{"stringValue":"chat"}}}},
              {{"key":"gen_ai.request.model","value":{{"stringValue":"json-model"}}}},
              {{"key":"gen_ai.usage.input_tokens","value":{{"intValue":"321"}}}},
              {{"key":"gen_ai.usage.output_tokens","value":{{"intValue":54}}}},
              {{"key":"gen_ai.response.time_to_first_chunk","value":{{"doubleValue":0.2}}}}]}},
          {{"traceId":"00000000000000000000000000000000","spanId":"eee19b7ec3c1b175","name":"bad ids"}}
        ]}}]}}]}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_http_json_partial_success_and_malformed_payloads() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data").to_string_lossy().into_owned();
    let tw = Proc::start(
        "tokenwatch",
        &[
            "run",
            "--listen",
            ANY,
            "--data-dir",
            &data,
            "--otlp-grpc-listen",
            ANY,
            "--otlp-http-listen",
            ANY,
        ],
        dir.path(),
    );
    let bound = tw.listening().await;
    let (api, http) = (bound["api"], bound["otlp_http"]);
    wait_ready(&format!("http://{api}/readyz"), &tw).await;
    let traces = format!("http://{http}/v1/traces");
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();

    // OTLP/JSON (hex ids, camelCase, int64 as string): accepted, one span rejected.
    let r = post(&traces, json_traces(now_ns).into_bytes(), &[JSON]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.content_type.starts_with("application/json"),
        "{}",
        r.content_type
    );
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        v["partialSuccess"]["rejectedSpans"],
        serde_json::json!(1),
        "{v}"
    );
    assert!(
        v["partialSuccess"]["errorMessage"]
            .as_str()
            .unwrap()
            .contains("trace_id must be 16 bytes"),
        "{v}"
    );
    // The same, gzip-compressed, is accepted too (the re-sent span is not duplicated).
    let r = post(
        &traces,
        gzip(json_traces(now_ns).as_bytes()),
        &[JSON, ("content-encoding", "gzip")],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let v = get(&format!("http://{api}/api/v1/requests?model=json-model"))
            .await
            .json();
        if v["count"].as_u64() >= Some(1) {
            let rec = &v["requests"][0];
            assert_eq!(rec["prompt_tokens"], 321);
            assert_eq!(rec["output_tokens"], 54);
            assert_eq!(rec["trace_id"], "5b8efff798038103d269b633813fc60c");
            assert_eq!(rec["request_id"], "eee19b7ec3c1b174");
            assert_eq!(rec["runtime"], "curl-app");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "json-model record never appeared: {v}\n{}",
            tw.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Truncated protobuf: 400 naming the message, protobuf Status body.
    let r = post(&traces, vec![0x0a, 0x80, 0x01, 0x0a], &[PROTO]).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.content_type, "application/x-protobuf");
    assert!(
        r.text()
            .contains("invalid OTLP protobuf ExportTraceServiceRequest"),
        "{}",
        r.text()
    );

    // Wrong JSON types: 400 with the path of the bad field.
    let bad = r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"name":42}]}]}]}"#;
    let r = post(&traces, bad.as_bytes().to_vec(), &[JSON]).await;
    assert_eq!(r.status, 400, "{}", r.text());
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("resourceSpans[0].scopeSpans[0].spans[0].name"),
        "{v}"
    );
    let r = post(
        &format!("http://{http}/v1/metrics"),
        b"{\"resourceMetrics\": 5}".to_vec(),
        &[JSON],
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text().contains("ExportMetricsServiceRequest"),
        "{}",
        r.text()
    );

    // Not JSON at all, on logs.
    let r = post(
        &format!("http://{http}/v1/logs"),
        b"{not json".to_vec(),
        &[JSON],
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text()
            .contains("invalid OTLP/JSON ExportLogsServiceRequest"),
        "{}",
        r.text()
    );

    // Gzip garbage: 400.
    let r = post(
        &traces,
        b"definitely not gzip".to_vec(),
        &[PROTO, ("content-encoding", "gzip")],
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("not valid gzip"), "{}", r.text());

    // Huge body (over the 8 MiB default limit): 413, and a small gzip bomb inflating past it: 413.
    let r = post(&traces, vec![0u8; 9 * 1024 * 1024], &[PROTO]).await;
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(r.text().contains("otlp.max_request_bytes"), "{}", r.text());
    let bomb = gzip(&vec![0u8; 9 * 1024 * 1024]);
    assert!(bomb.len() < 100_000);
    let r = post(&traces, bomb, &[PROTO, ("content-encoding", "gzip")]).await;
    assert_eq!(r.status, 413, "{}", r.text());

    // Wrong content type or encoding: 415.
    let r = post(
        &traces,
        b"hello".to_vec(),
        &[("content-type", "text/plain")],
    )
    .await;
    assert_eq!(r.status, 415, "{}", r.text());
    assert!(
        r.text()
            .contains("application/x-protobuf or application/json"),
        "{}",
        r.text()
    );
    let r = post(
        &traces,
        b"hello".to_vec(),
        &[PROTO, ("content-encoding", "br")],
    )
    .await;
    assert_eq!(r.status, 415, "{}", r.text());

    // Still serving: an empty protobuf export is fine, and the API answers.
    let r = post(&traces, Vec::new(), &[PROTO]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(get(&format!("http://{api}/healthz")).await.status, 200);
    let metrics = get(&format!("http://{api}/metrics")).await.body;
    for series in [
        "tokenwatch_otlp_requests_total{transport=\"http\",outcome=\"bad_request\"}",
        "tokenwatch_otlp_requests_total{transport=\"http\",outcome=\"too_large\"}",
        "tokenwatch_otlp_requests_total{transport=\"http\",outcome=\"unsupported_media_type\"}",
        "tokenwatch_otlp_rejected_total{signal=\"traces\",reason=\"invalid\"}",
    ] {
        assert!(
            common::metric_value(&metrics, series).is_some_and(|n| n >= 1.0),
            "{series} missing:\n{metrics}"
        );
    }
    assert!(!tw.log().contains("panicked"), "{}", tw.log());
}
