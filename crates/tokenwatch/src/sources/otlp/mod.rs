// OTLP source: receives OpenTelemetry traces, metrics and logs over gRPC and HTTP and turns
// GenAI spans into request records and GenAI metrics into normalised signals.
//
// Span → record mapping (`genai.rs`): spans carrying `gen_ai.operation.name`, a model or a
// provider become records — model_id from the requested (else response) model, runtime from
// `gen_ai.provider.name`/`gen_ai.system`/resource `service.name`, instance from
// `server.address[:server.port]` or `service.instance.id`, request_id = span id, arrival = start,
// end = duration, first token = `gen_ai.response.time_to_first_chunk`, status 500/upstream_5xx
// when the span status is ERROR or `error.type` is set. Every span is stored with its ids.

pub mod attrs;
pub mod codec;
pub mod genai;
mod grpc;
mod http;
pub mod http_children;
pub mod ingest;
pub mod logs;
pub mod metrics;
pub mod shipped_dedup;
pub mod span_scores;

/// The OTLP protobuf types (for fuzz targets and benchmarks built on this crate).
pub use opentelemetry_proto as proto;

use serde::Deserialize;
use std::net::SocketAddr;
use std::sync::Arc;

/// Exports processed at once across both transports; more get 429 / RESOURCE_EXHAUSTED.
const MAX_IN_FLIGHT: usize = 16;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct OtlpConfig {
    pub enabled: bool,
    pub grpc_listen: SocketAddr,
    pub http_listen: SocketAddr,
    /// Largest accepted request (after decompression).
    pub max_request_bytes: usize,
    /// Both OTLP listeners' own TLS certificate, or `enabled: false` [default: the shared `tls`].
    pub tls: Option<crate::listen::tls::ListenerTlsConfig>,
    /// Proxy replicas' records (`role: proxy`) remembered by their span's ids, so that one sent
    /// again (its answer was lost) is counted once, and its first token (shipped ahead of it)
    /// too: the last this many ids (about 100 bytes each; a streamed request takes two); 0 turns
    /// it off.
    pub shipped_dedup_capacity: usize,
    /// Longest an OTLP/HTTP request body may take to arrive; a slower one is answered 408. Its
    /// bytes meanwhile count against `limits.max_buffered_body_bytes` (the receiver's own
    /// budget), and no processing slot is held while it arrives.
    pub body_read_timeout: crate::kernel::duration::HumanDuration,
}

impl Default for OtlpConfig {
    fn default() -> Self {
        OtlpConfig {
            enabled: true,
            grpc_listen: SocketAddr::from(([127, 0, 0, 1], 4317)),
            http_listen: SocketAddr::from(([127, 0, 0, 1], 4318)),
            max_request_bytes: 8 * 1024 * 1024,
            tls: None,
            shipped_dedup_capacity: 200_000,
            body_read_timeout: crate::kernel::duration::HumanDuration(
                std::time::Duration::from_secs(60),
            ),
        }
    }
}

/// Which OTLP signal a payload carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalKind {
    Traces,
    Metrics,
    Logs,
}

/// Decode one OTLP/HTTP body (optionally gzip) and run the whole mapping, with no I/O: what the
/// receiver does to a payload before storing it (fuzz target, benchmarks). Returns items produced.
pub fn decode_and_map(
    kind: SignalKind,
    enc: codec::Encoding,
    gzip: bool,
    body: &[u8],
    limit: usize,
    mapper: &mut metrics::MetricsMapper,
) -> Result<usize, codec::DecodeError> {
    use opentelemetry_proto::tonic::collector::{logs::v1 as l, metrics::v1 as m, trace::v1 as t};
    let inflated;
    let bytes = if gzip {
        inflated = codec::gunzip(body, limit)?;
        &inflated[..]
    } else if body.len() > limit {
        return Err(codec::DecodeError::TooLarge { limit });
    } else {
        body
    };
    Ok(match kind {
        SignalKind::Traces => {
            let req: t::ExportTraceServiceRequest =
                codec::decode(bytes, enc, "ExportTraceServiceRequest")?;
            let b = genai::map_traces(
                &req,
                Some(&crate::capture::telemetry::TelemetryText::dropping()),
            );
            b.records.len() + b.spans.len()
        }
        SignalKind::Metrics => {
            let req: m::ExportMetricsServiceRequest =
                codec::decode(bytes, enc, "ExportMetricsServiceRequest")?;
            mapper.map(&req, 0).points.len()
        }
        SignalKind::Logs => {
            let req: l::ExportLogsServiceRequest =
                codec::decode(bytes, enc, "ExportLogsServiceRequest")?;
            logs::map_logs(&req, &crate::capture::telemetry::TelemetryText::dropping())
                .rows
                .len()
        }
    })
}

pub fn from_config(
    otlp: &OtlpConfig,
    limits: &crate::listen::limits::LimitsConfig,
) -> anyhow::Result<Vec<Box<dyn super::Source>>> {
    if !otlp.enabled {
        return Ok(Vec::new());
    }
    Ok(vec![Box::new(OtlpSource {
        cfg: otlp.clone(),
        limits: limits.clone(),
    })])
}

/// The OTLP receiver: one gRPC and one HTTP listener sharing one ingest core.
pub struct OtlpSource {
    cfg: OtlpConfig,
    /// Header limits of the OTLP/HTTP listener (`limits`).
    limits: crate::listen::limits::LimitsConfig,
}

impl super::Source for OtlpSource {
    fn name(&self) -> &'static str {
        "otlp"
    }

    fn start(self: Box<Self>, ctx: super::SourceContext) -> super::StartFuture {
        Box::pin(async move {
            use anyhow::Context as _;
            let cfg = self.cfg;
            let grpc_listener = tokio::net::TcpListener::bind(cfg.grpc_listen)
                .await
                .with_context(|| {
                    format!(
                        "binding the OTLP/gRPC listener on {} (otlp.grpc_listen)",
                        cfg.grpc_listen
                    )
                })?;
            let http_listener = tokio::net::TcpListener::bind(cfg.http_listen)
                .await
                .with_context(|| {
                    format!(
                        "binding the OTLP/HTTP listener on {} (otlp.http_listen)",
                        cfg.http_listen
                    )
                })?;
            // The addresses bound (port 0 picks one), for the start line and the log.
            let (grpc_addr, http_addr) = (grpc_listener.local_addr()?, http_listener.local_addr()?);
            let ingest = Arc::new(
                ingest::Ingest::new(
                    ctx.records.queue,
                    ctx.rows.writer,
                    ctx.signals.board.clone(),
                    MAX_IN_FLIGHT,
                    ctx.rows.telemetry_text,
                )
                .with_shipped_dedup(cfg.shipped_dedup_capacity)
                .with_model_aliases(ctx.signals.model_aliases.clone())
                .with_span_export(ctx.rows.span_export)
                .with_log_feed(ctx.rows.log_feed)
                .with_scores(ctx.rows.store.clone(), ctx.signals.posted.clone()),
            );
            ingest.stats.register(&ctx.host.metrics);
            let grpc_task = tokio::spawn(grpc::serve(
                grpc_listener,
                ctx.listen.tls.otlp_grpc.clone(),
                grpc::Grpc(ingest.clone()),
                cfg.max_request_bytes,
                ctx.host.shutdown.clone(),
                ctx.listen.auth.grpc_interceptor(),
            ));
            let router = http::router(Arc::new(http::HttpState {
                ingest,
                max_request_bytes: cfg.max_request_bytes,
                body_budget: crate::listen::limits::BodyBudget::new(
                    self.limits.max_buffered_body_bytes,
                ),
                body_read_timeout: cfg.body_read_timeout.0,
            }));
            let router = crate::auth::http::protect_otlp(router, &ctx.listen.auth);
            let http_tls = ctx.listen.tls.otlp_http.clone();
            let tls = http_tls.is_some();
            let guard = crate::listen::limits::Guard::new("otlp", &self.limits, &ctx.host.metrics);
            // Names and origins first: a rebound page's export is refused before its token is.
            let router = crate::listen::browser::protect(
                router,
                crate::listen::browser::BrowserGuard::new(
                    &ctx.listen.browser,
                    http_addr,
                    false,
                    &guard,
                ),
            );
            let http_task = tokio::spawn(crate::listen::serve_router(
                http_listener,
                http_tls,
                router,
                ctx.host.shutdown.clone(),
                guard,
            ));
            tracing::info!(grpc = %grpc_addr, http = %http_addr, tls, "OTLP receiver listening");
            ctx.host.components.set("otlp", "ok");
            Ok(super::SourceHandle {
                request_path: None,
                tasks: vec![grpc_task, http_task],
                routes: None,
                listening: vec![("otlp_grpc", grpc_addr), ("otlp_http", http_addr)],
            })
        })
    }
}
