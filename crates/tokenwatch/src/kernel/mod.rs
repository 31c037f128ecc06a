// The shared kernel of the binary's stages: what every stage may import and that imports no
// stage — the outbound TLS client and its settings (the proxy's https upstreams, OTLP export,
// remote write and webhooks all dial through it), the one delivery loop every deliverer
// (Alertmanager, webhooks, OTLP export, remote write) sends through, the span-export port the
// pipeline and the OTLP receiver hand spans to, the telemetry queue's sending side every source
// emits records through and the store-rows port received spans and logs are queued through, the telemetry registry every stage registers
// its health on, the configuration's duration type, the API routes' query-string checks, the
// streamed-response formats, the version/deploy marker model, the route split tables the proxy
// picks from and the act stage changes on canary rollback, the action port through which a
// detector's decision reaches the act stage, the span attributes a proxy replica ships its
// request records (and, ahead of them, first tokens) in (written by the pipeline, read back by the OTLP receiver), the model aliases every source's model ids are
// resolved through, what the proxy keeps of a request's text for capture, the percent-encoding of values put in URLs, and the test-only failpoints of debug builds. The clock and the record and signal types are in the `tokenwatch-core` crate.

pub mod actions;
pub mod delivery;
pub mod duration;
pub mod failpoint;
pub mod markers;
pub mod models;
pub mod params;
pub mod queue;
pub mod raw_text;
pub mod rows;
pub mod shipped_first_token;
pub mod shipped_record;
pub mod spans;
pub mod splits;
pub mod stream_format;
pub mod telemetry;
pub mod tls;
pub mod url;
