// OTLP/gRPC: the generated Trace, Metrics and Logs services (gzip accepted, size-limited)
// answering with partial success, RESOURCE_EXHAUSTED when busy and UNAVAILABLE on store failure.

use super::ingest::{Accepted, Ingest, Refused, Transport};
use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{
    LogsService, LogsServiceServer,
};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsPartialSuccess, ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsPartialSuccess, ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::codec::CompressionEncoding;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};

#[derive(Clone)]
pub struct Grpc(pub Arc<Ingest>);

fn refused(ingest: &Ingest, r: Refused) -> Status {
    match r {
        Refused::Busy(m) => {
            ingest.stats.request(Transport::Grpc, "busy");
            Status::resource_exhausted(m)
        }
        Refused::Unavailable(m) => {
            ingest.stats.request(Transport::Grpc, "unavailable");
            Status::unavailable(m)
        }
    }
}

fn outcome(a: &Accepted) -> &'static str {
    if a.rejected > 0 { "partial" } else { "ok" }
}

#[tonic::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let _permit = self.0.admit().map_err(|r| refused(&self.0, r))?;
        let a = self
            .0
            .traces_to_the_end(request.into_inner(), Transport::Grpc)
            .await
            .map_err(|r| refused(&self.0, r))?;
        self.0.stats.request(Transport::Grpc, outcome(&a));
        let partial_success = (a.rejected > 0).then_some(ExportTracePartialSuccess {
            rejected_spans: a.rejected,
            error_message: a.message,
        });
        Ok(Response::new(ExportTraceServiceResponse {
            partial_success,
        }))
    }
}

#[tonic::async_trait]
impl MetricsService for Grpc {
    async fn export(
        &self,
        request: Request<ExportMetricsServiceRequest>,
    ) -> Result<Response<ExportMetricsServiceResponse>, Status> {
        let _permit = self.0.admit().map_err(|r| refused(&self.0, r))?;
        let a = self.0.metrics(request.get_ref(), Transport::Grpc);
        self.0.stats.request(Transport::Grpc, outcome(&a));
        let partial_success = (a.rejected > 0).then_some(ExportMetricsPartialSuccess {
            rejected_data_points: a.rejected,
            error_message: a.message,
        });
        Ok(Response::new(ExportMetricsServiceResponse {
            partial_success,
        }))
    }
}

#[tonic::async_trait]
impl LogsService for Grpc {
    async fn export(
        &self,
        request: Request<ExportLogsServiceRequest>,
    ) -> Result<Response<ExportLogsServiceResponse>, Status> {
        let _permit = self.0.admit().map_err(|r| refused(&self.0, r))?;
        let a = self
            .0
            .logs(request.into_inner(), Transport::Grpc)
            .await
            .map_err(|r| refused(&self.0, r))?;
        self.0.stats.request(Transport::Grpc, outcome(&a));
        let partial_success = (a.rejected > 0).then_some(ExportLogsPartialSuccess {
            rejected_log_records: a.rejected,
            error_message: a.message,
        });
        Ok(Response::new(ExportLogsServiceResponse { partial_success }))
    }
}

/// Serve the three services on `listener` (over TLS when `tls` is set) until `shutdown` turns true.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    grpc: Grpc,
    max_request_bytes: usize,
    mut shutdown: watch::Receiver<bool>,
    auth: crate::auth::grpc::IngestInterceptor,
) {
    let gzip = CompressionEncoding::Gzip;
    let traces = TraceServiceServer::new(grpc.clone())
        .accept_compressed(gzip)
        .send_compressed(gzip)
        .max_decoding_message_size(max_request_bytes);
    let metrics = MetricsServiceServer::new(grpc.clone())
        .accept_compressed(gzip)
        .send_compressed(gzip)
        .max_decoding_message_size(max_request_bytes);
    let logs = LogsServiceServer::new(grpc)
        .accept_compressed(gzip)
        .send_compressed(gzip)
        .max_decoding_message_size(max_request_bytes);
    let stop = async move {
        let _ = shutdown.wait_for(|s| *s).await;
    };
    let router = tonic::transport::Server::builder()
        .concurrency_limit_per_connection(32)
        .add_service(InterceptedService::new(traces, auth.clone()))
        .add_service(InterceptedService::new(metrics, auth.clone()))
        .add_service(InterceptedService::new(logs, auth));
    // TCP_NODELAY on every connection, either way (`crate::listen` sets it before the handshake).
    let result = match tls {
        None => {
            let incoming =
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
            router.serve_with_incoming_shutdown(incoming, stop).await
        }
        Some(config) => {
            router
                .serve_with_incoming_shutdown(
                    crate::listen::grpc_tls_incoming(listener, config),
                    stop,
                )
                .await
        }
    };
    if let Err(e) = result {
        tracing::error!(error = %e, "OTLP/gRPC server failed");
    }
}
