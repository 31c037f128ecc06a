// OTLP export against in-test receivers (HTTP/protobuf and gRPC): batches, headers, retries,
// refusals, the bounded queue's drops and shutdown; and the configuration's key paths.

use super::*;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use std::sync::Mutex;
use std::time::Instant;

fn span(i: u8) -> ExportSpan {
    ExportSpan {
        service_name: "tokenwatch".into(),
        span: Span {
            trace_id: vec![1; 16],
            span_id: vec![i.max(1); 8],
            name: format!("chat m{i}"),
            ..Default::default()
        },
    }
}

fn names(req: &ExportTraceServiceRequest) -> Vec<String> {
    req.resource_spans
        .iter()
        .flat_map(|rs| {
            rs.scope_spans
                .iter()
                .flat_map(|ss| ss.spans.iter().map(|s| s.name.clone()))
        })
        .collect()
}

/// An OTLP/HTTP receiver answering `script[n]` to its n-th request (the last entry afterwards).
#[derive(Clone)]
struct Receiver {
    got: Arc<Mutex<Vec<(HeaderMap, ExportTraceServiceRequest)>>>,
    script: Arc<Vec<(u16, i64)>>,
}

async fn receive(
    State(r): State<Receiver>,
    headers: HeaderMap,
    body: bytes::Bytes,
) -> (StatusCode, Vec<u8>) {
    let req = ExportTraceServiceRequest::decode(body).expect("protobuf ExportTraceServiceRequest");
    let mut got = r.got.lock().unwrap();
    got.push((headers, req));
    let (code, rejected) = r.script[(got.len() - 1).min(r.script.len() - 1)];
    let partial_success = (rejected > 0).then(|| ExportTracePartialSuccess {
        rejected_spans: rejected,
        error_message: "too old".into(),
    });
    (
        StatusCode::from_u16(code).unwrap(),
        ExportTraceServiceResponse { partial_success }.encode_to_vec(),
    )
}

async fn serve_http(script: Vec<(u16, i64)>) -> (Receiver, String) {
    let r = Receiver {
        got: Arc::default(),
        script: Arc::new(script),
    };
    let app = axum::Router::new()
        .route("/v1/traces", axum::routing::post(receive))
        .with_state(r.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (r, format!("http://{addr}"))
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn config(endpoint: &str, protocol: Protocol, flush: &str, max_batch: usize) -> OtlpExportConfig {
    let mut c = OtlpExportConfig::new(endpoint, protocol);
    c.queue.flush_interval = HumanDuration::parse(flush).unwrap();
    c.queue.max_batch = max_batch;
    c
}

#[test]
fn a_full_queue_drops_its_oldest_spans_and_counts_them() {
    let metrics = Metrics::new();
    let export = SpanQueueHandle {
        queue: Arc::new(SpanQueue::new(3)),
        metrics: ExportMetrics::register(&metrics),
        include_received: false,
    };
    export.push(vec![span(1), span(2)]);
    export.push(vec![span(3), span(4), span(5)]);
    assert_eq!(export.metrics.dropped("queue_full"), 2);
    let left: Vec<String> = export
        .queue
        .take(10)
        .into_iter()
        .map(|s| s.span.name)
        .collect();
    assert_eq!(
        left,
        ["chat m3", "chat m4", "chat m5"],
        "the oldest went first"
    );
    let text = metrics.encode();
    assert!(
        text.contains(r#"tokenwatch_otlp_export_dropped_total{reason="queue_full"} 2"#),
        "{text}"
    );
    assert!(
        text.contains(r#"tokenwatch_otlp_export_dropped_total{reason="shutdown"} 0"#),
        "{text}"
    );

    // Received spans go only when asked for.
    let row = tokenwatch_store::SpanRow {
        trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
        span_id: "00f067aa0ba902b7".into(),
        attributes_json: "{}".into(),
        ..Default::default()
    };
    export.push_received(std::slice::from_ref(&row));
    assert!(export.queue.is_empty());
    let with_received = SpanQueueHandle {
        include_received: true,
        ..export
    };
    with_received.push_received(&[row]);
    assert_eq!(with_received.queue.len(), 1);
}

#[tokio::test]
async fn http_batches_spans_with_headers_and_retries_until_accepted() {
    let (rx, url) = serve_http(vec![(503, 0), (200, 0), (200, 1)]).await;
    let mut cfg = config(&url, Protocol::Http, "50ms", 3);
    cfg.headers
        .insert("authorization".into(), "Bearer t0k".into());
    let metrics = Metrics::new();
    let exporter = start(Some(&cfg), &metrics).unwrap().unwrap();
    let export = exporter.handle.clone();
    export.push((1..=3).map(span).collect());
    wait_until("the retried batch", || rx.got.lock().unwrap().len() >= 2).await;
    export.push(vec![span(4)]);
    wait_until("the second batch", || rx.got.lock().unwrap().len() >= 3).await;
    {
        let got = rx.got.lock().unwrap();
        let (headers, first) = &got[0];
        assert_eq!(headers["content-type"], "application/x-protobuf");
        assert_eq!(headers["authorization"], "Bearer t0k");
        assert_eq!(
            names(first),
            ["chat m1", "chat m2", "chat m3"],
            "a full batch goes at once"
        );
        assert_eq!(
            got[1].1, got[0].1,
            "the refused batch is sent again, unchanged"
        );
        assert_eq!(
            names(&got[2].1),
            ["chat m4"],
            "a lone span goes after the flush interval"
        );
        let rs = &got[0].1.resource_spans[0];
        let service = &rs.resource.as_ref().unwrap().attributes[0];
        assert_eq!(service.key, "service.name");
    }
    wait_until("the counters", || export.metrics.sent() == 3).await;
    assert_eq!(export.metrics.failures(), 1);
    assert_eq!(
        export.metrics.dropped("rejected"),
        1,
        "the partial success's refused span"
    );
    exporter.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn http_refusals_drop_the_batch_and_shutdown_counts_what_is_left() {
    let (rx, url) = serve_http(vec![(400, 0)]).await;
    let metrics = Metrics::new();
    let exporter = start(Some(&config(&url, Protocol::Http, "10ms", 100)), &metrics)
        .unwrap()
        .unwrap();
    let export = exporter.handle.clone();
    export.push(vec![span(1), span(2)]);
    wait_until("the refusal", || export.metrics.dropped("rejected") == 2).await;
    assert_eq!(rx.got.lock().unwrap().len(), 1, "a 400 is not retried");
    exporter.shutdown(Duration::from_secs(5)).await;

    // Nothing listens: spans wait, retried, and are counted as dropped at shutdown.
    let dead = format!(
        "http://{}",
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    );
    let metrics = Metrics::new();
    let mut cfg = config(&dead, Protocol::Http, "10ms", 2);
    cfg.timeout = HumanDuration::parse("500ms").unwrap();
    let exporter = start(Some(&cfg), &metrics).unwrap().unwrap();
    let export = exporter.handle.clone();
    export.push((1..=5).map(span).collect());
    wait_until("a failed attempt", || export.metrics.failures() >= 1).await;
    let started = Instant::now();
    exporter.shutdown(Duration::from_secs(10)).await;
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "shutdown is bounded"
    );
    assert_eq!(export.metrics.dropped("shutdown"), 5);
    assert_eq!(export.metrics.sent(), 0);
}

/// A gRPC trace service recording what it receives.
#[derive(Clone, Default)]
struct GrpcReceiver {
    got: Arc<Mutex<Vec<(tonic::metadata::MetadataMap, ExportTraceServiceRequest)>>>,
}

#[tonic::async_trait]
impl TraceService for GrpcReceiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let n = {
            let mut got = self.got.lock().unwrap();
            got.push((request.metadata().clone(), request.into_inner()));
            got.len()
        };
        if n == 1 {
            return Err(tonic::Status::unavailable("warming up"));
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

#[tokio::test]
async fn grpc_sends_batches_with_metadata_and_retries_unavailable() {
    let rx = GrpcReceiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    let server =
        tonic::transport::Server::builder().add_service(TraceServiceServer::new(rx.clone()));
    tokio::spawn(server.serve_with_incoming(incoming));
    let mut cfg = config(&format!("http://{addr}"), Protocol::Grpc, "20ms", 10);
    cfg.headers.insert("x-scope-orgid".into(), "team-a".into());
    let metrics = Metrics::new();
    let exporter = start(Some(&cfg), &metrics).unwrap().unwrap();
    let export = exporter.handle.clone();
    export.push(vec![span(1), span(2)]);
    wait_until("the retried export", || export.metrics.sent() == 2).await;
    {
        let got = rx.got.lock().unwrap();
        assert_eq!(got.len(), 2, "UNAVAILABLE is retried");
        assert_eq!(got[1].0.get("x-scope-orgid").unwrap(), "team-a");
        assert_eq!(names(&got[1].1), ["chat m1", "chat m2"]);
    }
    assert_eq!(export.metrics.failures(), 1);
    exporter.shutdown(Duration::from_secs(5)).await;
}

#[test]
fn configuration_errors_name_the_key() {
    let err = |c: OtlpExportConfig| validate(Some(&c)).unwrap_err();
    let e = err(OtlpExportConfig::new("collector:4318", Protocol::Http));
    assert_eq!(e.key, "export.otlp.endpoint");
    let e = err(OtlpExportConfig::new(
        "https://collector:4317",
        Protocol::Grpc,
    ));
    assert!(
        e.key == "export.otlp.endpoint" && e.message.contains("protocol: http"),
        "{e}"
    );
    let e = err(OtlpExportConfig::new(
        "http://collector:4317/v1",
        Protocol::Grpc,
    ));
    assert!(e.message.contains("without a path"), "{e}");
    let mut c = OtlpExportConfig::new("http://collector:4318", Protocol::Http);
    c.headers.insert("content-type".into(), "text/plain".into());
    assert_eq!(err(c).key, "export.otlp.headers.content-type");
    let mut c = OtlpExportConfig::new("http://collector:4318", Protocol::Http);
    c.queue.capacity = 0;
    assert_eq!(err(c).key, "export.otlp.queue.capacity");
    let mut c = OtlpExportConfig::new("http://collector:4318", Protocol::Http);
    c.tls = Some(Default::default());
    assert_eq!(err(c).key, "export.otlp.tls");
    assert!(
        validate(Some(&OtlpExportConfig::new(
            "http://collector:4318/",
            Protocol::Http
        )))
        .is_ok()
    );
    assert!(validate(None).is_ok());
    let p = prepare(
        &OtlpExportConfig::new("http://collector:4318/", Protocol::Http),
        "export.otlp",
    )
    .unwrap();
    assert_eq!(p.uri.to_string(), "http://collector:4318/v1/traces");
}

#[test]
fn unknown_keys_are_refused_with_their_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tw.yaml");
    let yaml = "export:\n  otlp:\n    endpoint: http://127.0.0.1:4318\n    protocol: grpc\n    flush: 1s\n";
    std::fs::write(&file, yaml).unwrap();
    let e = crate::config::Config::load(&file).unwrap_err().to_string();
    assert!(e.contains("export.otlp") && e.contains("flush"), "{e}");
    let yaml = "export:\n  otlp:\n    endpoint: http://127.0.0.1:4318\n    protocol: thrift\n";
    std::fs::write(&file, yaml).unwrap();
    let e = crate::config::Config::load(&file).unwrap_err().to_string();
    assert!(e.contains("export.otlp.protocol"), "{e}");
    let yaml = "export:\n  otlp:\n    endpoint: http://127.0.0.1:4317\n    protocol: grpc\n    include_received: true\n    queue:\n      max_batch: 64\n";
    std::fs::write(&file, yaml).unwrap();
    let cfg = crate::config::Config::load(&file).unwrap();
    let otlp = cfg.export.otlp.unwrap();
    assert_eq!(
        (otlp.protocol, otlp.include_received, otlp.queue.max_batch),
        (Protocol::Grpc, true, 64)
    );
}
