// The span-export port: where the stages that make or receive spans (the proxy's span builder in
// the pipeline, the OTLP receiver among the sources) hand spans to export, without naming the
// exporter. The OTLP exporter (export::otlp) implements it; a span to export is an OTLP span
// with the `service.name` of its resource.

use opentelemetry_proto::tonic::trace::v1::Span;
use std::sync::Arc;
use tokenwatch_store::SpanRow;

/// One span to export, with the `service.name` of its resource.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportSpan {
    pub service_name: String,
    pub span: Span,
}

/// Takes spans to export; never waits (a full queue drops its oldest and counts them).
pub trait SpanSink: Send + Sync {
    /// Queue spans made here (the proxy's).
    fn push(&self, spans: Vec<ExportSpan>);
    /// Queue stored rows of received spans, when received spans are exported too.
    fn push_received(&self, rows: &[SpanRow]);
    /// Whether received spans are exported too.
    fn includes_received(&self) -> bool;
}

/// The handle the stages hold: cheap to clone.
pub type SpanExport = Arc<dyn SpanSink>;
