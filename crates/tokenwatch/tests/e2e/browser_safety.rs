// What a browser could be made to send to the default loopback setup (no tokens), through the
// real binary (issue 35 item 9): a page whose name was rebound to 127.0.0.1 (foreign `Host`)
// is refused on the API and OTLP/HTTP listeners, reads included; cross-site writes (a foreign
// `Origin`, `text/plain` or form bodies) to markers, feedback and reload never reach their
// handlers; tokenwatch's own page, listed hosts and origins, and clients that send no `Origin`
// (curl, SDKs) are served; each refusal is counted and the first of each reason logged.

use crate::common;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use std::net::SocketAddr;

/// `method url` with exactly `headers` (no content type added) and `body`: (status, body).
async fn raw(method: &str, url: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    let mut b = http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b.body(Full::new(Bytes::from(body.to_string()))).unwrap();
    let resp = client().request(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

fn error_type(body: &str) -> String {
    let v: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    v["error"]["type"].as_str().unwrap_or_default().to_string()
}

async fn marker_notes(api: SocketAddr) -> Vec<String> {
    let r = get(&format!("http://{api}/api/v1/markers")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["markers"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|m| m["note"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebound_names_and_cross_site_writes_are_refused_on_the_loopback_setup() {
    let s = Stack::start_with_config(
        &[],
        "auth:\n  allowed_hosts: [tw.example.test]\n  allowed_origins: [https://grafana.example.test]\n",
    )
    .await;
    let api = s.api;
    let otlp_http = s.tw.listening().await["otlp_http"];
    let evil = format!("evil.example:{}", api.port());
    let json = ("content-type", "application/json");

    // DNS rebinding: a page at evil.example reads nothing, on the API or the OTLP/HTTP port.
    for path in ["/api/v1/fleet", "/metrics", "/api/v1/requests", "/"] {
        let (status, body) = raw(
            "GET",
            &format!("http://{api}{path}"),
            &[("host", &evil)],
            "",
        )
        .await;
        assert_eq!(status, 403, "{path}: {body}");
        assert_eq!(error_type(&body), "foreign_host", "{body}");
        assert!(body.contains("auth.allowed_hosts"), "{body}");
    }
    let traces = format!("http://{otlp_http}/v1/traces");
    let otlp_evil = format!("evil.example:{}", otlp_http.port());
    let (status, body) = raw("POST", &traces, &[("host", &otlp_evil), json], "{}").await;
    assert_eq!(status, 403, "{body}");
    // The probes answer any name; loopback names and the listed host are served.
    let (status, _) = raw(
        "GET",
        &format!("http://{api}/readyz"),
        &[("host", &evil)],
        "",
    )
    .await;
    assert_eq!(status, 200);
    for host in [
        format!("localhost:{}", api.port()),
        "tw.example.test".to_string(),
        api.to_string(),
    ] {
        let (status, body) = raw(
            "GET",
            &format!("http://{api}/api/v1/fleet"),
            &[("host", &host)],
            "",
        )
        .await;
        assert_eq!(status, 200, "{host}: {body}");
    }
    let (status, body) = raw("POST", &traces, &[json], "{}").await;
    assert_eq!(status, 200, "an exporter's own request: {body}");

    // Cross-site writes: a form or text/plain POST (no CORS preflight) from a foreign page.
    let markers = format!("http://{api}/api/v1/markers");
    let marker = |note: &str| format!(r#"{{"kind":"deploy","note":"{note}"}}"#);
    let foreign = [
        (
            ("origin", "https://evil.example"),
            ("content-type", "text/plain"),
            403,
        ),
        (("origin", "https://evil.example"), json, 403),
        (("origin", "null"), json, 403),
        (("sec-fetch-site", "cross-site"), json, 403),
        (("x-none", "1"), ("content-type", "text/plain"), 415),
        (
            ("x-none", "1"),
            ("content-type", "application/x-www-form-urlencoded"),
            415,
        ),
    ];
    for (i, (who, ct, want)) in foreign.into_iter().enumerate() {
        let (status, body) = raw(
            "POST",
            &markers,
            &[who, ct],
            &marker(&format!("refused-{i}")),
        )
        .await;
        assert_eq!(status, want, "{who:?} {ct:?}: {body}");
    }
    let feedback = format!("http://{api}/api/v1/feedback");
    let item = r#"[{"request_id":"r1","name":"thumbs","value":1}]"#;
    let (status, body) = raw("POST", &feedback, &[("content-type", "text/plain")], item).await;
    assert_eq!(
        (status, error_type(&body).as_str()),
        (415, "unsupported_media_type"),
        "{body}"
    );
    let reload = format!("http://{api}/-/reload");
    let (status, body) = raw("POST", &reload, &[("origin", "https://evil.example")], "").await;
    assert_eq!(
        (status, error_type(&body).as_str()),
        (403, "foreign_origin"),
        "{body}"
    );

    // Tokenwatch's own page, a listed origin and a client without Origin write as before.
    let own = format!("http://{api}");
    for (i, origin) in [own.as_str(), "https://grafana.example.test"]
        .into_iter()
        .enumerate()
    {
        let (status, body) = raw(
            "POST",
            &markers,
            &[("origin", origin), json],
            &marker(&format!("kept-{i}")),
        )
        .await;
        assert_eq!(status, 201, "{origin}: {body}");
    }
    let r = common::post(&markers, &marker("kept-curl")).await;
    assert_eq!(r.status, 201, "{}", r.body);
    let (status, body) = raw("POST", &reload, &[], "").await;
    assert_eq!(status, 200, "{body}");

    let mut notes = marker_notes(api).await;
    notes.sort();
    assert_eq!(
        notes,
        ["kept-0", "kept-1", "kept-curl"],
        "no refused write was stored"
    );

    // Counted per listener and reason; the first of each reason logged once.
    let metrics = get(&format!("http://{api}/metrics")).await.body;
    let count = |listener: &str, reason: &str| {
        metric_value(
            &metrics,
            &format!(
                "tokenwatch_rejected_requests_total{{listener=\"{listener}\",reason=\"{reason}\"}}"
            ),
        )
    };
    assert_eq!(count("api", "foreign_host"), Some(4.0), "{metrics}");
    assert_eq!(count("otlp", "foreign_host"), Some(1.0), "{metrics}");
    assert_eq!(count("api", "foreign_origin"), Some(5.0), "{metrics}");
    assert_eq!(
        count("api", "unsupported_media_type"),
        Some(3.0),
        "{metrics}"
    );
    let log = s.tw.log();
    for key in [
        "(auth.allowed_hosts)",
        "(auth.allowed_origins)",
        "(Content-Type)",
    ] {
        let warned = log
            .lines()
            .filter(|l| l.contains("listener=\"api\"") || l.contains("listener=api"))
            .filter(|l| l.contains(key))
            .count();
        assert_eq!(warned, 1, "{key} warned once on the API port:\n{log}");
    }
}
